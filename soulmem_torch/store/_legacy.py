"""The legacy directory store (format 1): read by :class:`soulmem_torch.store.MemoryStore`,
which migrates it into its SQLite database on the first write.

This was the storage engine of soulmem_torch before the SQLite store; it is kept whole so that
old stores open (and so tests can write one). Layout of a legacy store directory::

    <root>/
      CURRENT                         one line: the name of the live version directory
      versions/
        g000007-1a2b3c4d/             one complete, immutable version ("generation" 7)
          notes.jsonl                 one note per line, Rust serde JSON (``note.to_json()``)
          pending_links.jsonl         links whose target is not in the store (serde JSON)
          readable_ids.json           {"<uuid>": "sem_x", ...}, only when given
          embeddings.pt               plain tensors (``torch.save``), only if a note has one
          manifest.json               format version, counts, embedding layout, embedder
                                      identity, sha256 per file, its own checksum
      LOCK                            the writers' lock file (an OS lock; empty)

**Atomicity.** :meth:`MemoryStore.save` writes a whole new version into a hidden temporary
directory (``versions/.tmp-*``), fsyncs every file and the directory, renames it to its final
name, and only then swaps ``CURRENT`` by writing ``CURRENT.tmp-*`` and ``os.replace``-ing it
into place (fsyncing the directory after each rename). A crash or an exception at any point
before that last rename leaves ``CURRENT`` naming the previous version, which is never
touched; a half-written version is never named by ``CURRENT``. Older versions are pruned only
after the swap (``keep_versions``, default 2: the live one and the one before it). The next
``save`` removes a crashed writer's temporary directories and any renamed-but-never-committed
version.

**One writer at a time.** Every write (:meth:`~MemoryStore.save`, :meth:`~MemoryStore.restore`)
holds an exclusive OS file lock on ``<root>/LOCK`` (the ``filelock`` library: ``flock`` on
POSIX, ``LockFileEx`` on Windows). The OS drops the lock when its process dies, so a writer
killed with ``kill -9`` never leaves a stale lock behind. A writer that must read, change and
write back (``soulmem import``) holds :meth:`MemoryStore.lock` around all three, so it always
extends the newest version. A writer that read earlier and saves later passes
``base_version``: if another writer committed in between, the save fails with
:class:`StoreChangedError` instead of overwriting that work. Waiting for the lock is bounded
(``lock_timeout``, default ``$SOULMEM_LOCK_TIMEOUT`` or 600 s; then :class:`StoreLockedError`).
Readers take no lock: they read ``CURRENT`` once and the immutable version it names; if a
writer pruned that version meanwhile, :meth:`~MemoryStore.load` re-reads ``CURRENT`` and
retries, so a reader sees the previous or the new version, never a mix.

**A damaged store is refused, never taken for an empty one.** A ``CURRENT`` that is missing
while versions exist, unreadable, malformed or naming a version that does not exist raises
:class:`StoreDamagedError` on load *and* on save — nothing is written or pruned while the
pointer is unreadable. Recovery: :meth:`MemoryStore.versions` (``soulmem versions STORE``)
lists every version with its note count, date and whether it verifies;
:meth:`MemoryStore.restore` (``soulmem restore STORE VERSION``) fully verifies a version and
points ``CURRENT`` at it. The manifest carries its own checksum (``manifest_sha256``: sha256 of
its canonical JSON without that key), verified on every load.

**Legacy stores** (written before the manifest checksum and the embedder identity existed)
load as before: no manifest checksum to verify, and their vectors are trusted when the recorded
embedder class name and width match (see :mod:`soulmem_torch.embedding.identity`).

**Loading never executes code.** Notes and ids are JSON; embeddings are read with
``torch.load(weights_only=True)``. Every file is checked against its size and sha256 in the
manifest before it is parsed; any problem (missing or truncated file, checksum mismatch, bad
JSON, unknown format version, inconsistent tensor shapes) raises :class:`StoreError` naming the
file and the problem.

**Embeddings** (:class:`~soulmem_torch.embedding.fields.MemoryEmbedding`, or ``None`` per note)
are stored stacked, never per note object: with N notes, M of them embedded, F field names (in
``manifest["embedding"]["fields"]``) and K present (note, field) pairs,

* ``has_embedding`` (N,) bool — which notes have an embedding;
* ``tag`` (M, D) — their tag vectors, in note order;
* ``field_mask`` (M, F) bool — which fields each embedded note has;
* ``field_values`` (K, D) — the present field vectors, row-major over ``field_mask``
  (``field_emb[field_mask] = field_values`` rebuilds a dense (M, F, D) tensor).

Example:
    >>> import tempfile, torch
    >>> from soulmem_torch.model import MemoryNote, SemMemory
    >>> from soulmem_torch.embedding.fields import MemoryEmbedding
    >>> note = MemoryNote.build(SemMemory(content="latte", aliases=["拿铁"],
    ...                                   concept_type="Entity", description="coffee"))
    >>> emb = MemoryEmbedding(tag=torch.ones(4), fields={"content": torch.zeros(4)})
    >>> store = DirectoryStore(tempfile.mkdtemp())
    >>> manifest = store.save([note], [emb], readable_ids={note.id: "sem_latte"})
    >>> back = store.load()
    >>> back.notes[0].to_json() == note.to_json(), back.readable_ids[note.id]
    (True, 'sem_latte')
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import uuid
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import filelock
import pydantic
import torch

from soulmem_torch import __version__
from soulmem_torch.embedding.fields import FIELD_INDEX, FIELD_NAMES, MemoryEmbedding
from soulmem_torch.embedding.identity import (
    EmbedderIdentity,
    EmbedderMismatchError,
    EmbedderMismatchWarning,
    describe_mismatch,
    embedder_identity,
    same_embedder,
)
from soulmem_torch.errors import SoulMemError, StoreError, ValidationError
from soulmem_torch.model.describe import describe_validation_error
from soulmem_torch.model.ids import LinkId, MemoryId
from soulmem_torch.model.links import MemoryLink
from soulmem_torch.model.notes import MemoryNote
from soulmem_torch.model.serde import dumps_serde
from soulmem_torch.model.timestamp import Timestamp

__all__ = [
    "DEFAULT_LOCK_TIMEOUT",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "DirectoryStore",
    "StoreChangedError",
    "StoreContents",
    "StoreDamagedError",
    "StoreLockedError",
    "VersionInfo",
    "embeddings_for_embedder",
    "manifest_checksum",
    "pack_embeddings",
    "unpack_embeddings",
]

FORMAT_NAME = "soulmem_torch.store"
FORMAT_VERSION = 1
"""Version of the on-disk layout; a store of any other version is refused with a StoreError."""

CURRENT_FILE = "CURRENT"
VERSIONS_DIR = "versions"
MANIFEST_FILE = "manifest.json"
NOTES_FILE = "notes.jsonl"
PENDING_FILE = "pending_links.jsonl"
READABLE_IDS_FILE = "readable_ids.json"
RECORDS_FILE = "records.json"
"""Optional: the working memory's retrieval records (``runtime.records.records_to_json``)."""
EMBEDDINGS_FILE = "embeddings.pt"
LOCK_FILE = "LOCK"
MANIFEST_CHECKSUM_KEY = "manifest_sha256"

DEFAULT_LOCK_TIMEOUT = 600.0
"""Seconds a writer waits for the store lock (overridden by ``$SOULMEM_LOCK_TIMEOUT``)."""
_LOAD_RETRIES = 5

_TMP_PREFIX = ".tmp-"
_VERSION_NAME = re.compile(r"^g(\d{6,})-[0-9a-f]{8}$")
_EMBEDDING_KEYS = ("has_embedding", "tag", "field_mask", "field_values")


# ---- errors --------------------------------------------------------------------------------
class StoreDamagedError(StoreError):
    """``CURRENT`` is missing, unreadable or dangling while the store has versions: the store
    is refused (never taken for an empty one) until a version is restored."""


class StoreLockedError(StoreError, TimeoutError):
    """Another writer held the store lock for longer than ``lock_timeout``."""


class StoreChangedError(StoreError):
    """Another writer committed a version after ``base_version`` was read; nothing was saved."""


def manifest_checksum(manifest: Mapping[str, Any]) -> str:
    """sha256 of the manifest's canonical JSON (sorted keys, no spaces) without its checksum."""
    body = {k: v for k, v in manifest.items() if k != MANIFEST_CHECKSUM_KEY}
    text = json.dumps(body, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return _sha256(text.encode("utf-8"))


def _recovery_hint(root: Path) -> str:
    return (
        f"nothing was changed; list the versions with `soulmem versions {root}` and make a "
        f"verified one live with `soulmem restore {root} VERSION` "
        "(MemoryStore.versions() / MemoryStore.restore())"
    )


# ---- contents ------------------------------------------------------------------------------
@dataclass(frozen=True)
class VersionInfo:
    """One version directory, as :meth:`MemoryStore.versions` reports it.

    Attributes:
        name: the directory name (``g000007-1a2b3c4d``).
        generation: the number in the name.
        current: whether ``CURRENT`` names it.
        valid: whether its manifest and every file verify (checksums, sizes).
        problem: why it does not verify (``None`` when valid).
        written_at: RFC 3339 time from its manifest (``None`` when unreadable).
        notes: note count from its manifest (``None`` when unreadable).
        embedder: the embedder that produced its vectors (``None`` when unknown).
    """

    name: str
    generation: int
    current: bool
    valid: bool
    problem: str | None
    written_at: str | None
    notes: int | None
    embedder: str | None


@dataclass
class StoreContents:
    """What :meth:`MemoryStore.load` returns.

    Attributes:
        notes: the notes, in the order they were saved (cluster index order).
        embeddings: length N, aligned with ``notes``; ``None`` where a note has no embedding.
        readable_ids: MemoryId → readable id (``sem_*`` …); empty when none were saved.
        manifest: the parsed ``manifest.json``.
        pending_links: links whose target is not among ``notes``, in note order. They also
            stay on their source notes' ``mem_links`` (that is where the cluster re-parks them).
    """

    notes: list[MemoryNote]
    embeddings: list[MemoryEmbedding | None]
    readable_ids: dict[MemoryId, str]
    manifest: dict[str, Any]
    pending_links: list[MemoryLink] = field(default_factory=list)
    version: str | None = None
    records: dict[str, Any] | None = None
    """The retrieval records saved with this version (``records.json``), or ``None``."""

    @property
    def id_map(self) -> dict[str, MemoryId]:
        """Readable id → MemoryId (the inverse of ``readable_ids``)."""
        return {rid: mid for mid, rid in self.readable_ids.items()}

    @property
    def embedder_name(self) -> str | None:
        """The embedder name given at save time (``None`` if unknown)."""
        return self.manifest.get("embedder_name")

    @property
    def embedder_identity(self) -> EmbedderIdentity | None:
        """The recorded :class:`~soulmem_torch.embedding.identity.EmbedderIdentity`
        (``None`` for a legacy store or a store without embeddings)."""
        data = self.manifest.get("embedder")
        return None if data is None else EmbedderIdentity.from_json(data)

    @property
    def legacy(self) -> bool:
        """True for a store written before manifests were checksummed."""
        return MANIFEST_CHECKSUM_KEY not in self.manifest

    @property
    def embedding_dim(self) -> int | None:
        """D, or ``None`` when no note has an embedding."""
        layout = self.manifest.get("embedding")
        return None if layout is None else int(layout["dim"])


# ---- embeddings: stacked tensors <-> per-note objects --------------------------------------
def _field_order(names: Iterable[str]) -> list[str]:
    """The given field names in ``FIELD_NAMES`` order (the columns of ``field_mask``)."""
    names = set(names)
    return [n for n in FIELD_NAMES if n in names]


def pack_embeddings(
    embeddings: Sequence[MemoryEmbedding | None],
) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
    """Stacks per-note embeddings into plain CPU tensors (see the module docstring).

    Args:
        embeddings: length N. One embedding or ``None`` per note.

    Returns:
        ``(tensors, layout)`` with ``layout = {"dim", "dtype", "fields", "count"}``, or ``None``
        when no note has an embedding.

    Raises:
        ValidationError: naming the note and field: not a floating (D,) tensor, mixed widths,
            NaN / inf, or a field name outside ``FIELD_NAMES``.
    """
    present = [(i, e) for i, e in enumerate(embeddings) if e is not None]
    if not present:
        return None
    dim: int | None = None
    dtypes: list[torch.dtype] = []
    names: set[str] = set()
    for i, emb in present:
        where = f"embeddings[{i}]"
        vectors = [("tag", emb.tag), *((f"fields[{k!r}]", v) for k, v in emb.fields.items())]
        for what, vec in vectors:
            if not isinstance(vec, torch.Tensor):
                raise ValidationError(
                    f"{where}.{what}: expected a torch.Tensor, found {type(vec).__name__}"
                )
        # 1-D float, one width for all, finite, field names in FIELD_NAMES.
        emb.validate(dim=dim, where=where)
        if dim is None:
            dim = int(emb.tag.shape[0])
        dtypes.extend(vec.dtype for _, vec in vectors)
        names.update(emb.fields)
    assert dim is not None
    dtype = dtypes[0]
    for other in dtypes[1:]:
        dtype = torch.promote_types(dtype, other)
    fields = _field_order(names)
    col = {name: j for j, name in enumerate(fields)}

    has_embedding = torch.zeros(len(embeddings), dtype=torch.bool)
    has_embedding[[i for i, _ in present]] = True
    field_mask = torch.zeros(len(present), len(fields), dtype=torch.bool)
    values: list[torch.Tensor] = []
    for row, (_, emb) in enumerate(present):
        # Row-major over field_mask: columns in ``fields`` order.
        for name in sorted(emb.fields, key=col.__getitem__):
            field_mask[row, col[name]] = True
            values.append(emb.fields[name].detach())
    tag = torch.stack([e.tag.detach().to("cpu", dtype) for _, e in present])
    field_values = (
        torch.stack([v.to("cpu", dtype) for v in values])
        if values
        else torch.zeros(0, dim, dtype=dtype)
    )
    tensors = {
        "has_embedding": has_embedding,
        "tag": tag.contiguous(),
        "field_mask": field_mask,
        "field_values": field_values.contiguous(),
    }
    layout = {"dim": dim, "dtype": str(dtype).removeprefix("torch."), "fields": fields,
              "count": len(present)}  # fmt: skip
    return tensors, layout


def unpack_embeddings(
    tensors: Mapping[str, torch.Tensor], layout: Mapping[str, Any], *, num_notes: int
) -> list[MemoryEmbedding | None]:
    """Inverse of :func:`pack_embeddings`: per-note embeddings (views into the stacked tensors).

    Raises:
        ValueError: naming the tensor whose key, dtype or shape does not fit ``layout``.
    """
    missing = [k for k in _EMBEDDING_KEYS if not isinstance(tensors.get(k), torch.Tensor)]
    if missing:
        raise ValueError(f"missing tensor(s) {missing}; found keys {sorted(tensors)}")
    has, tag, mask, values = (tensors[k] for k in _EMBEDDING_KEYS)
    dim, fields, count = int(layout["dim"]), list(layout["fields"]), int(layout["count"])
    unknown = [name for name in fields if name not in FIELD_INDEX]
    if unknown:
        raise ValueError(
            f"manifest embedding fields {unknown} are not in FIELD_NAMES (written by a newer "
            "soulmem_torch?)"
        )
    dtype = getattr(torch, str(layout["dtype"]), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"manifest embedding dtype {layout['dtype']!r} is not a float dtype")
    expect = {
        "has_embedding": ((num_notes,), torch.bool),
        "tag": ((count, dim), dtype),
        "field_mask": ((count, len(fields)), torch.bool),
    }
    for key, (shape, want) in expect.items():
        got = tensors[key]
        if tuple(got.shape) != shape or got.dtype != want:
            raise ValueError(
                f"tensor {key!r}: expected shape {shape} {want}, "
                f"found {tuple(got.shape)} {got.dtype}"
            )
    if int(has.sum()) != count:
        raise ValueError(f"'has_embedding' marks {int(has.sum())} notes, manifest says {count}")
    num_values = int(mask.sum())
    if tuple(values.shape) != (num_values, dim) or values.dtype != dtype:
        raise ValueError(
            f"tensor 'field_values': expected shape ({num_values}, {dim}) {dtype}, "
            f"found {tuple(values.shape)} {values.dtype}"
        )
    out: list[MemoryEmbedding | None] = [None] * num_notes
    rows = has.nonzero().flatten().tolist()
    mask_rows = mask.tolist()
    chunks = values.split(mask.sum(dim=1).tolist()) if count else ()
    for row, (note_index, present, chunk) in enumerate(zip(rows, mask_rows, chunks)):
        names = [fields[j] for j, p in enumerate(present) if p]
        out[note_index] = MemoryEmbedding(tag=tag[row], fields=dict(zip(names, chunk.unbind(0))))
    return out


# ---- small file helpers --------------------------------------------------------------------
def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fsync_dir(path: Path) -> None:
    """fsync a directory so a rename inside it is durable (a no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. Windows cannot open a directory
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes) -> None:
    """Writes and fsyncs one file (inside a temporary directory or under a temporary name)."""
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _links_json(links: Iterable[MemoryLink]) -> str:
    return "".join(dumps_serde(link.model_dump(mode="python")) + "\n" for link in links)


def _embeddings_bytes(tensors: Mapping[str, torch.Tensor]) -> bytes:
    buffer = io.BytesIO()
    torch.save(dict(tensors), buffer)
    return buffer.getvalue()


def _check_readable_ids(
    readable_ids: Mapping[Any, Any] | None, note_ids: Mapping[MemoryId, int]
) -> dict[MemoryId, str]:
    """Accepts MemoryId → readable id (or readable id → MemoryId); returns it in note order."""
    if not readable_ids:
        return {}
    pairs: list[tuple[MemoryId, str]] = []
    for key, value in readable_ids.items():
        if isinstance(key, MemoryId) and isinstance(value, str):
            pairs.append((key, value))
        elif isinstance(key, str) and isinstance(value, MemoryId):
            pairs.append((value, key))
        else:
            raise ValidationError(
                "readable_ids: expected a mapping MemoryId → str (or str → MemoryId), found "
                f"{type(key).__name__} → {type(value).__name__}"
            )
    seen: dict[str, MemoryId] = {}
    for mid, rid in pairs:
        if mid not in note_ids:
            raise ValidationError(f"readable_ids: {mid} ({rid!r}) is not the id of a saved note")
        if not rid:
            raise ValidationError(f"readable_ids: the readable id of {mid} is empty")
        if seen.setdefault(rid, mid) != mid:
            raise ValidationError(f"readable_ids: {rid!r} names two notes ({seen[rid]}, {mid})")
    return dict(sorted(pairs, key=lambda p: note_ids[p[0]]))


def _pending_links(
    notes: Sequence[MemoryNote], note_ids: Mapping[MemoryId, int]
) -> list[MemoryLink]:
    return [link for note in notes for link in note.mem_links if link.to not in note_ids]


# ---- the store -----------------------------------------------------------------------------
class DirectoryStore:
    """A memory store directory (see the module docstring for layout and guarantees).

    Args:
        path: the store directory (created by the first :meth:`save`).
        keep_versions: how many complete versions to keep on disk (≥ 1; the live one counts).
        lock_timeout: seconds a writer waits for the lock (> 0; ``None`` →
            ``$SOULMEM_LOCK_TIMEOUT`` or :data:`DEFAULT_LOCK_TIMEOUT`).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        keep_versions: int = 2,
        lock_timeout: float | None = None,
    ) -> None:
        if (
            isinstance(keep_versions, bool)
            or not isinstance(keep_versions, int)
            or (keep_versions < 1)
        ):
            raise ValidationError(f"keep_versions: expected an int ≥ 1, found {keep_versions!r}")
        if lock_timeout is None:
            env = os.environ.get("SOULMEM_LOCK_TIMEOUT")
            try:
                lock_timeout = float(env) if env else DEFAULT_LOCK_TIMEOUT
            except ValueError:
                raise ValidationError(
                    f"$SOULMEM_LOCK_TIMEOUT: expected a number of seconds > 0, found {env!r}"
                ) from None
        if not (isinstance(lock_timeout, (int, float)) and 0 < lock_timeout < float("inf")):
            raise ValidationError(
                f"lock_timeout: expected a finite number of seconds > 0, found {lock_timeout!r}"
            )
        self.path = Path(path)
        self.keep_versions = int(keep_versions)
        self.lock_timeout = float(lock_timeout)
        self.last_version: str | None = None
        """The version the last :meth:`save` through this object committed."""

    def __repr__(self) -> str:
        return f"DirectoryStore({str(self.path)!r})"

    # -- locking --------------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, timeout: float | None = None) -> Iterator[DirectoryStore]:
        """Holds the store's exclusive writer lock (re-entrant within a thread).

        Hold it around read → change → :meth:`save` so the change extends the newest version;
        :meth:`save` and :meth:`restore` take it themselves. Creates the store directory.

        Raises:
            StoreLockedError: another writer held it for ``timeout`` seconds (default
                ``lock_timeout``).
        """
        wait = self.lock_timeout if timeout is None else float(timeout)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot create the store directory ({exc})") from None
        # One lock object per real path in this process (is_singleton): nested holders re-enter
        # it, however they spell the path.
        lock_path = Path(os.path.realpath(self.path / LOCK_FILE))
        file_lock = filelock.FileLock(lock_path, is_singleton=True)
        try:
            file_lock.acquire(timeout=wait)
        except filelock.Timeout:
            raise StoreLockedError(
                f"{self.path}: another writer has held {lock_path} for {wait:g} s; try again "
                "when it has finished (or raise lock_timeout / $SOULMEM_LOCK_TIMEOUT)"
            ) from None
        try:
            yield self
        finally:
            file_lock.release()

    # -- queries --------------------------------------------------------------------------
    def exists(self) -> bool:
        """True when there is a store here: a ``CURRENT`` pointer or any version directory.

        A damaged store exists too (its :meth:`load` and :meth:`save` raise
        :class:`StoreDamagedError`); only an absent one is ``False``.
        """
        return (self.path / CURRENT_FILE).exists() or bool(self._version_dirs())

    def current_version(self) -> str | None:
        """The name of the live version directory, or ``None`` (no store, or a damaged one)."""
        try:
            return self._current_dir().name
        except StoreError:
            return None

    def check(self) -> str | None:
        """The live version's name; ``None`` when there is no store at all.

        Raises:
            StoreDamagedError: the pointer is missing, unreadable or dangling while versions
                exist (with the recovery path in the message).
        """
        try:
            return self._current_dir().name
        except StoreDamagedError:
            raise
        except StoreError:
            return None

    # -- save -----------------------------------------------------------------------------
    def save(
        self,
        notes: Iterable[MemoryNote],
        embeddings: Sequence[MemoryEmbedding | None]
        | Mapping[MemoryId, MemoryEmbedding | None]
        | None = None,
        *,
        readable_ids: Mapping[MemoryId, str] | Mapping[str, MemoryId] | None = None,
        embedder_name: str | None = None,
        embedder_identity: EmbedderIdentity | None = None,
        base_version: str | object | None = ...,
        records: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Writes a new version atomically and makes it the live one (under the lock).

        Args:
            notes: the notes, in index order. Ids must be unique. Links to notes that are not
                saved (pending links) are kept on their source notes.
            embeddings: ``None`` (no embeddings), a sequence aligned with ``notes`` or a
                mapping ``MemoryId → MemoryEmbedding | None`` (missing ids → ``None``).
            readable_ids: ``MemoryId → readable id`` (or the inverse map), for notes in the
                store only.
            embedder_name: recorded in the manifest (e.g. ``"hashing-384"``).
            embedder_identity: who produced the embeddings (recorded; checked on load by
                :meth:`soulmem_torch.SoulMem.load`).
            base_version: the version the caller's data was read from (``None``: an empty
                store). When given, the save fails with :class:`StoreChangedError` if another
                version is live by now. Omitted: the save replaces whatever is live.
            records: the working memory's retrieval records as JSON
                (``runtime.records.records_to_json``), kept as ``records.json`` (checksummed
                like every file); ``None``: none.

        Returns:
            The manifest that was written.

        Raises:
            ValidationError: bad arguments (nothing is written).
            StoreDamagedError: the store's pointer is unreadable (nothing is written).
            StoreChangedError: ``base_version`` is no longer live (nothing is written).
            StoreLockedError: the lock could not be taken in time.
            StoreError: the write failed; the previous version stays live and intact.
        """
        if embedder_identity is not None and not isinstance(embedder_identity, EmbedderIdentity):
            raise ValidationError(
                "embedder_identity: expected an EmbedderIdentity or None, found "
                f"{type(embedder_identity).__name__}"
            )
        notes = list(notes)
        note_ids: dict[MemoryId, int] = {}
        for i, note in enumerate(notes):
            if not isinstance(note, MemoryNote):
                raise ValidationError(
                    f"notes[{i}]: expected a MemoryNote, found {type(note).__name__}"
                )
            if note_ids.setdefault(note.id, i) != i:
                raise ValidationError(
                    f"notes[{i}]: duplicate note id {note.id} (also notes[{note_ids[note.id]}])"
                )
        per_note = self._align_embeddings(embeddings, notes, note_ids)
        packed = pack_embeddings(per_note)
        ids = _check_readable_ids(readable_ids, note_ids)
        pending = _pending_links(notes, note_ids)

        files: dict[str, bytes] = {
            NOTES_FILE: "".join(n.to_json() + "\n" for n in notes).encode("utf-8"),
            PENDING_FILE: _links_json(pending).encode("utf-8"),
        }
        if ids:
            text = json.dumps({str(k): v for k, v in ids.items()}, ensure_ascii=False, indent=1)
            files[READABLE_IDS_FILE] = (text + "\n").encode("utf-8")
        if packed is not None:
            files[EMBEDDINGS_FILE] = _embeddings_bytes(packed[0])
        if records is not None:
            text = json.dumps(records, ensure_ascii=False, separators=(",", ":"))
            files[RECORDS_FILE] = (text + "\n").encode("utf-8")

        with self.lock():
            live = self.check()  # a damaged store raises: never written over, never pruned
            if base_version is not ... and base_version != live:
                raise StoreChangedError(
                    f"{self.path}: another writer saved version {live} after this data was "
                    f"read from {base_version or 'an empty store'}; nothing was saved — load "
                    "the store again and redo the change"
                )
            return self._save_locked(
                live, notes, packed, ids, pending, files, embedder_name, embedder_identity
            )

    def _save_locked(
        self,
        live: str | None,
        notes: Sequence[MemoryNote],
        packed: tuple[dict[str, torch.Tensor], dict[str, Any]] | None,
        ids: Mapping[MemoryId, str],
        pending: Sequence[MemoryLink],
        files: Mapping[str, bytes],
        embedder_name: str | None,
        embedder_identity: EmbedderIdentity | None,
    ) -> dict[str, Any]:
        generation = 1 + max((gen for gen, _ in self._version_dirs()), default=0)
        manifest: dict[str, Any] = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "generation": generation,
            "written_at": Timestamp.now().to_rfc3339(),
            "soulmem_torch_version": __version__,
            "counts": {
                "notes": len(notes),
                "links": sum(len(n.mem_links) for n in notes),
                "pending_links": len(pending),
                "embeddings": 0 if packed is None else packed[1]["count"],
                "readable_ids": len(ids),
            },
            "embedding_dim": None if packed is None else packed[1]["dim"],
            "embedder_name": embedder_name,
            "embedder": None if embedder_identity is None else embedder_identity.to_json(),
            "embedding": None if packed is None else packed[1],
            "files": {
                name: {"sha256": _sha256(data), "bytes": len(data)} for name, data in files.items()
            },
        }
        manifest[MANIFEST_CHECKSUM_KEY] = manifest_checksum(manifest)
        manifest_bytes = (json.dumps(manifest, ensure_ascii=False, indent=1) + "\n").encode()
        try:
            self._commit(generation, files, manifest_bytes, previous=live)
        except SoulMemError:
            raise
        except OSError as exc:
            raise StoreError(
                f"{self.path}: could not write a new version ({exc}); the previous version "
                "is unchanged"
            ) from exc
        return manifest

    @staticmethod
    def _align_embeddings(
        embeddings: Any, notes: Sequence[MemoryNote], note_ids: Mapping[MemoryId, int]
    ) -> list[MemoryEmbedding | None]:
        if embeddings is None:
            return [None] * len(notes)
        if isinstance(embeddings, Mapping):
            unknown = [k for k in embeddings if k not in note_ids]
            if unknown:
                raise ValidationError(
                    f"embeddings: {len(unknown)} key(s) are not ids of saved notes, "
                    f"e.g. {unknown[0]}"
                )
            out = [embeddings.get(n.id) for n in notes]
        else:
            out = list(embeddings)
            if len(out) != len(notes):
                raise ValidationError(
                    f"embeddings: expected {len(notes)} entries (one per note), found {len(out)}"
                )
        for i, emb in enumerate(out):
            if emb is not None and not isinstance(emb, MemoryEmbedding):
                raise ValidationError(
                    f"embeddings[{i}]: expected a MemoryEmbedding or None, "
                    f"found {type(emb).__name__}"
                )
        return out

    def _version_dirs(self) -> list[tuple[int, str]]:
        """``(generation, name)`` of every complete-looking version directory, oldest first."""
        versions = self.path / VERSIONS_DIR
        if not versions.is_dir():
            return []
        return sorted(
            (int(m.group(1)), p.name)
            for p in versions.iterdir()
            if p.is_dir() and (m := _VERSION_NAME.match(p.name))
        )

    def _commit(
        self, generation: int, files: Mapping[str, bytes], manifest: bytes, *, previous: str | None
    ) -> None:
        """Temporary directory → fsync → rename → swap ``CURRENT`` → prune."""
        versions = self.path / VERSIONS_DIR
        versions.mkdir(parents=True, exist_ok=True)
        for stale in versions.glob(_TMP_PREFIX + "*"):  # a crashed writer's leftovers
            shutil.rmtree(stale, ignore_errors=True)
        for stale in self.path.glob(CURRENT_FILE + _TMP_PREFIX + "*"):
            stale.unlink(missing_ok=True)

        token = uuid.uuid4().hex[:8]
        final_name = f"g{generation:06d}-{token}"
        tmp_dir = versions / f"{_TMP_PREFIX}{final_name}"
        tmp_pointer = self.path / f"{CURRENT_FILE}{_TMP_PREFIX}{token}"
        try:
            tmp_dir.mkdir()
            for name, data in files.items():
                _write_file(tmp_dir / name, data)
            _write_file(tmp_dir / MANIFEST_FILE, manifest)  # last: it vouches for the others
            _fsync_dir(tmp_dir)
            os.replace(tmp_dir, versions / final_name)
            _fsync_dir(versions)
            self._write_pointer(final_name, tmp_pointer)  # the commit point
            self.last_version = final_name
        except BaseException:
            shutil.rmtree(tmp_dir, ignore_errors=True)
            with contextlib.suppress(OSError):
                tmp_pointer.unlink(missing_ok=True)
            if self.current_version() != final_name:
                shutil.rmtree(versions / final_name, ignore_errors=True)
            raise
        self._prune(versions, new=final_name, previous=previous)

    def _write_pointer(self, name: str, tmp_pointer: Path | None = None) -> None:
        """Atomically makes ``CURRENT`` name ``name`` (temporary file, fsync, rename, fsync)."""
        if tmp_pointer is None:
            tmp_pointer = self.path / f"{CURRENT_FILE}{_TMP_PREFIX}{uuid.uuid4().hex[:8]}"
        try:
            _write_file(tmp_pointer, (name + "\n").encode("ascii"))
            os.replace(tmp_pointer, self.path / CURRENT_FILE)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp_pointer.unlink(missing_ok=True)
            raise
        _fsync_dir(self.path)

    # -- recovery -------------------------------------------------------------------------
    def versions(self) -> list[VersionInfo]:
        """Every version directory, oldest first, each verified (manifest and file checksums).

        Works on a damaged store (that is what it is for); reads, never writes.
        """
        live = self.current_version()
        out: list[VersionInfo] = []
        for gen, name in self._version_dirs():
            vdir = self.path / VERSIONS_DIR / name
            manifest: dict[str, Any] | None = None
            problem: str | None = None
            try:
                manifest = self._read_manifest(vdir / MANIFEST_FILE)
                self._read_verified(vdir, manifest)
            except StoreError as exc:
                problem = str(exc)
            notes = written = embedder = None
            if manifest is not None:
                count = manifest["counts"].get("notes")
                notes = count if isinstance(count, int) else None
                written = (
                    manifest.get("written_at")
                    if isinstance(manifest.get("written_at"), str)
                    else None
                )
                ident = manifest.get("embedder")
                embedder = (
                    ident.get("name") if isinstance(ident, dict) else manifest.get("embedder_name")
                )
            out.append(
                VersionInfo(name=name, generation=gen, current=name == live,
                            valid=problem is None, problem=problem, written_at=written,
                            notes=notes, embedder=embedder)
            )  # fmt: skip
        return out

    def resolve_version(self, version: str | int) -> str:
        """A version's directory name from its name, a unique prefix, or its generation number.

        Raises:
            StoreError: no such version, or a prefix that names several (naming what exists).
        """
        names = [name for _, name in self._version_dirs()]
        text = str(version).strip()
        if text.isdigit():
            found = [n for n in names if int(_VERSION_NAME.match(n).group(1)) == int(text)]  # type: ignore[union-attr]
        else:
            found = [n for n in names if n == text] or [n for n in names if n.startswith(text)]
        if len(found) != 1:
            listed = ", ".join(names) if names else "none"
            what = "matches no version" if not found else f"is ambiguous ({', '.join(found)})"
            raise StoreError(f"{self.path}: version {version!r} {what}; versions on disk: {listed}")
        return found[0]

    def restore(self, version: str | int) -> StoreContents:
        """Makes ``version`` the live one after verifying it completely (under the lock).

        Every file is read, checksummed and parsed first; only a version that loads is made
        live. Nothing is deleted. The next :meth:`save` prunes as usual (``keep_versions``,
        counting from the restored version: versions newer than it are dropped as superseded).

        Args:
            version: a directory name (``g000007-1a2b3c4d``), a unique prefix, or a generation
                number (``7``).

        Returns:
            The restored version's contents.

        Raises:
            StoreError: no such version, or it does not verify (naming the file and problem).
        """
        if not (self.path / VERSIONS_DIR).is_dir():
            raise StoreError(f"{self.path}: not a memory store (no {VERSIONS_DIR} directory)")
        with self.lock():
            name = self.resolve_version(version)
            try:
                contents = self._load_version(self.path / VERSIONS_DIR / name)
            except StoreError as exc:
                raise StoreError(
                    f"cannot restore {name}: it does not verify ({exc}); pick another version "
                    f"(`soulmem versions {self.path}`)"
                ) from None
            for stale in self.path.glob(CURRENT_FILE + _TMP_PREFIX + "*"):
                stale.unlink(missing_ok=True)
            self._write_pointer(name)
            return contents

    def _prune(self, versions: Path, *, new: str, previous: str | None) -> None:
        """Removes uncommitted leftovers and versions beyond ``keep_versions`` (oldest first).

        Never touches ``new``; ``previous`` goes only when ``keep_versions == 1``. Leftovers are
        versions newer than ``previous`` that ``CURRENT`` never named (a writer crashed between
        the rename and the swap). When there was no readable previous version nothing is
        removed: a store whose ``CURRENT`` was lost keeps all its versions for inspection.
        """
        if previous is None:
            return
        match = _VERSION_NAME.match(previous)
        previous_gen = int(match.group(1)) if match else 0
        others = []
        for gen, name in self._version_dirs():
            if name in (new, previous):
                continue
            if gen > previous_gen:  # never committed
                shutil.rmtree(versions / name, ignore_errors=True)
            else:
                others.append(name)
        kept = [previous, *reversed(others)]  # newest first
        for name in kept[max(self.keep_versions - 1, 0) :]:
            shutil.rmtree(versions / name, ignore_errors=True)

    # -- load -----------------------------------------------------------------------------
    def _pointer_changed(self, name: str) -> bool:
        try:
            return (self.path / CURRENT_FILE).read_bytes().decode("ascii").strip() != name
        except (OSError, UnicodeDecodeError):
            return False

    def _current_dir(self, _retry: int = _LOAD_RETRIES) -> Path:
        """The live version directory.

        Raises:
            StoreError: no store here at all (``CURRENT`` and versions both absent).
            StoreDamagedError: anything else that keeps ``CURRENT`` from naming a version.
        """
        pointer = self.path / CURRENT_FILE
        try:
            raw = pointer.read_bytes()
        except FileNotFoundError:
            found = self._version_dirs()
            if found:
                raise StoreDamagedError(
                    f"{pointer}: missing, but {self.path / VERSIONS_DIR} holds {len(found)} "
                    f"version(s) — the store is damaged; {_recovery_hint(self.path)}"
                ) from None
            raise StoreError(
                f"{pointer}: missing — {self.path} is not a memory store (nothing saved yet?)"
            ) from None
        except IsADirectoryError:
            raise StoreDamagedError(
                f"{pointer}: is a directory, expected a one-line file; {_recovery_hint(self.path)}"
            ) from None
        except OSError as exc:
            raise StoreDamagedError(
                f"{pointer}: unreadable ({exc}); {_recovery_hint(self.path)}"
            ) from None
        try:
            name = raw.decode("ascii").strip()
        except UnicodeDecodeError:
            name = None
        if name is None or not _VERSION_NAME.match(name):
            shown = raw[:60].decode("ascii", "replace") if name is None else name[:60]
            raise StoreDamagedError(
                f"{pointer}: expected a version directory name such as 'g000001-0123abcd', "
                f"found {shown!r} — the pointer is corrupted; {_recovery_hint(self.path)}"
            )
        version_dir = self.path / VERSIONS_DIR / name
        if not version_dir.is_dir():
            if _retry > 0 and self._pointer_changed(name):
                return self._current_dir(_retry - 1)  # a writer swapped and pruned meanwhile
            raise StoreDamagedError(
                f"{pointer}: names {name!r}, but {version_dir} does not exist — the pointer is "
                f"dangling; {_recovery_hint(self.path)}"
            )
        return version_dir

    def load(self) -> StoreContents:
        """Reads, verifies and parses the live version.

        Takes no lock: if a writer prunes the version between reading ``CURRENT`` and reading
        its files, ``CURRENT`` is read again and the load retried (the result is always one
        whole committed version).

        Raises:
            StoreDamagedError: the pointer is unreadable (with the recovery path).
            StoreError: naming the file and the problem (missing, truncated, checksum mismatch,
                bad JSON, unknown format version, inconsistent tensors).
        """
        for _ in range(_LOAD_RETRIES):
            version_dir = self._current_dir()
            try:
                return self._load_version(version_dir)
            except StoreError as exc:
                if self.current_version() in (version_dir.name, None):
                    # not a concurrent swap: the live version itself is bad
                    raise type(exc)(
                        f"{exc}; the live version {version_dir.name} is damaged — "
                        f"`soulmem versions {self.path}` lists every version and "
                        f"`soulmem restore {self.path} VERSION` makes a verified one live"
                    ) from None
        return self._load_version(self._current_dir())

    def manifest(self) -> dict[str, Any]:
        """The live version's manifest alone (parsed and checksum-verified; no data files).

        Raises:
            StoreDamagedError / StoreError: as :meth:`load`.
        """
        return self._read_manifest(self._current_dir() / MANIFEST_FILE)

    def _load_version(self, version_dir: Path) -> StoreContents:
        manifest = self._read_manifest(version_dir / MANIFEST_FILE)
        data = self._read_verified(version_dir, manifest)

        notes_path = version_dir / NOTES_FILE
        notes = self._parse_notes(notes_path, data[NOTES_FILE])
        note_ids = {note.id: i for i, note in enumerate(notes)}
        self._check_count(notes_path, "notes", len(notes), manifest)

        pending_path = version_dir / PENDING_FILE
        stored_pending = self._parse_links(pending_path, data[PENDING_FILE])
        pending = _pending_links(notes, note_ids)
        if [link.id for link in stored_pending] != [link.id for link in pending]:
            raise StoreError(
                f"{pending_path}: lists {len(stored_pending)} pending link(s) that do not match "
                f"the {len(pending)} link(s) of {NOTES_FILE} whose target is not in the store"
            )

        readable: dict[MemoryId, str] = {}
        if READABLE_IDS_FILE in data:
            readable = self._parse_readable_ids(
                version_dir / READABLE_IDS_FILE, data[READABLE_IDS_FILE], note_ids
            )

        embeddings: list[MemoryEmbedding | None] = [None] * len(notes)
        layout = manifest.get("embedding")
        emb_path = version_dir / EMBEDDINGS_FILE
        if layout is not None:
            if EMBEDDINGS_FILE not in data:
                raise StoreError(f"{emb_path}: the manifest has an embedding layout but no file")
            embeddings = self._parse_embeddings(emb_path, data[EMBEDDINGS_FILE], layout, len(notes))
        elif EMBEDDINGS_FILE in data:
            raise StoreError(f"{emb_path}: present, but the manifest has no embedding layout")
        records = None
        if RECORDS_FILE in data:
            try:
                records = json.loads(data[RECORDS_FILE].decode("utf-8"))
            except ValueError as exc:
                raise StoreError(f"{version_dir / RECORDS_FILE}: not JSON ({exc})") from None
        return StoreContents(
            notes=notes,
            embeddings=embeddings,
            readable_ids=readable,
            manifest=manifest,
            pending_links=pending,
            version=version_dir.name,
            records=records,
        )

    @staticmethod
    def _read_manifest(path: Path) -> dict[str, Any]:
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise StoreError(f"{path}: missing (the version directory is incomplete)") from None
        except OSError as exc:
            raise StoreError(f"{path}: unreadable ({exc})") from None
        try:
            manifest = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise StoreError(f"{path}: not valid JSON ({exc}); truncated or corrupted") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
            found = (
                manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
            )
            raise StoreError(f"{path}: expected format {FORMAT_NAME!r}, found {found!r}")
        version = manifest.get("format_version")
        if version != FORMAT_VERSION:
            raise StoreError(
                f"{path}: unknown format_version {version!r} (this soulmem_torch reads version "
                f"{FORMAT_VERSION})"
            )
        recorded = manifest.get(MANIFEST_CHECKSUM_KEY)
        if recorded is not None and recorded != manifest_checksum(manifest):
            raise StoreError(
                f"{path}: checksum mismatch — expected {MANIFEST_CHECKSUM_KEY} {recorded}, found "
                f"{manifest_checksum(manifest)}; the manifest is corrupted"
            )
        files = manifest.get("files")
        if not isinstance(files, dict) or NOTES_FILE not in files or PENDING_FILE not in files:
            raise StoreError(
                f"{path}: 'files' must list at least {NOTES_FILE!r} and {PENDING_FILE!r}, "
                f"found {files!r}"
            )
        for name, entry in files.items():
            if (
                name
                not in (NOTES_FILE, PENDING_FILE, READABLE_IDS_FILE, EMBEDDINGS_FILE, RECORDS_FILE)
                or not isinstance(entry, dict)
                or not isinstance(entry.get("sha256"), str)
                or not isinstance(entry.get("bytes"), int)
            ):
                raise StoreError(f"{path}: bad 'files' entry {name!r}: {entry!r}")
        if not isinstance(manifest.get("counts"), dict):
            raise StoreError(
                f"{path}: 'counts' must be an object, found {manifest.get('counts')!r}"
            )
        layout = manifest.get("embedding")
        if layout is not None and (
            not isinstance(layout, dict)
            or not isinstance(layout.get("dim"), int)
            or not isinstance(layout.get("count"), int)
            or not isinstance(layout.get("fields"), list)
            or not all(isinstance(f, str) for f in layout["fields"])
            or not isinstance(layout.get("dtype"), str)
        ):
            raise StoreError(f"{path}: bad 'embedding' layout {layout!r}")
        identity = manifest.get("embedder")
        if identity is not None:
            try:
                EmbedderIdentity.from_json(identity, where="'embedder'")
            except ValidationError as exc:
                raise StoreError(f"{path}: {exc}") from None
        return manifest

    @staticmethod
    def _read_verified(version_dir: Path, manifest: Mapping[str, Any]) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        for name, entry in manifest["files"].items():
            path = version_dir / name
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                raise StoreError(f"{path}: missing (listed in {MANIFEST_FILE})") from None
            except OSError as exc:
                raise StoreError(f"{path}: unreadable ({exc})") from None
            if len(data) != entry["bytes"]:
                raise StoreError(
                    f"{path}: truncated or corrupted — expected {entry['bytes']} bytes, "
                    f"found {len(data)}"
                )
            digest = _sha256(data)
            if digest != entry["sha256"]:
                raise StoreError(
                    f"{path}: checksum mismatch — expected sha256 {entry['sha256']}, found "
                    f"{digest}; the file is corrupted"
                )
            out[name] = data
        return out

    @staticmethod
    def _check_count(path: Path, key: str, found: int, manifest: Mapping[str, Any]) -> None:
        expected = manifest["counts"].get(key)
        if expected != found:
            raise StoreError(f"{path}: manifest counts {expected!r} {key}, found {found}")

    @staticmethod
    def _lines(path: Path, data: bytes) -> list[tuple[int, str]]:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise StoreError(f"{path}: not UTF-8 ({exc})") from None
        if text and not text.endswith("\n"):
            raise StoreError(f"{path}: truncated (the last line has no newline)")
        return [(n, line) for n, line in enumerate(text.split("\n")[:-1], start=1)]

    @classmethod
    def _parse_notes(cls, path: Path, data: bytes) -> list[MemoryNote]:
        notes: list[MemoryNote] = []
        seen: set[MemoryId] = set()
        for lineno, line in cls._lines(path, data):
            try:
                note = MemoryNote.from_json(line)
            except pydantic.ValidationError as exc:
                raise StoreError(
                    f"{path}: line {lineno}: not a valid note ({describe_validation_error(exc)})"
                ) from None
            if note.id in seen:
                raise StoreError(f"{path}: line {lineno}: duplicate note id {note.id}")
            seen.add(note.id)
            notes.append(note)
        return notes

    @classmethod
    def _parse_links(cls, path: Path, data: bytes) -> list[MemoryLink]:
        links: list[MemoryLink] = []
        for lineno, line in cls._lines(path, data):
            try:
                links.append(MemoryLink.model_validate_json(line))
            except pydantic.ValidationError as exc:
                raise StoreError(
                    f"{path}: line {lineno}: not a valid link ({describe_validation_error(exc)})"
                ) from None
        return links

    @staticmethod
    def _parse_readable_ids(
        path: Path, data: bytes, note_ids: Mapping[MemoryId, int]
    ) -> dict[MemoryId, str]:
        try:
            raw = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise StoreError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(raw, dict):
            raise StoreError(f"{path}: expected a JSON object, found {type(raw).__name__}")
        out: dict[MemoryId, str] = {}
        for key, rid in raw.items():
            try:
                mid = MemoryId(key)
            except ValueError:
                raise StoreError(f"{path}: key {key!r} is not a UUID") from None
            if mid not in note_ids or not isinstance(rid, str):
                raise StoreError(f"{path}: entry {key!r}: {rid!r} does not name a stored note")
            out[mid] = rid
        return out

    @staticmethod
    def _parse_embeddings(
        path: Path, data: bytes, layout: Mapping[str, Any], num_notes: int
    ) -> list[MemoryEmbedding | None]:
        try:
            tensors = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises many kinds on bad input
            raise StoreError(f"{path}: not a readable tensor file ({exc})") from None
        if not isinstance(tensors, dict):
            raise StoreError(f"{path}: expected a dict of tensors, found {type(tensors).__name__}")
        try:
            return unpack_embeddings(tensors, layout, num_notes=num_notes)
        except (ValueError, KeyError, RuntimeError) as exc:
            raise StoreError(f"{path}: {exc}") from None

    # -- cluster helpers ------------------------------------------------------------------
    def save_cluster(
        self,
        cluster: Any,
        *,
        readable_ids: Mapping[MemoryId, str] | Mapping[str, MemoryId] | None = None,
        embedder_name: str | None = None,
        embedder_identity: EmbedderIdentity | None = None,
        base_version: str | object | None = ...,
    ) -> dict[str, Any]:
        """Saves a ``MemoryCluster`` (its notes and embeddings, in index order); the keyword
        arguments are those of :meth:`save`.

        The cluster is used duck-typed: iterating it yields ``EmbeddedMemoryNote``-like objects
        (``.note``, ``.embedding``). If it has ``pending_links()``, any pending link that is a
        full ``MemoryLink`` but is missing from its source note's ``mem_links`` is added to (a
        copy of) that note, so the round trip keeps it.
        """
        items = list(cluster)
        notes = [item.note for item in items]
        embeddings = [item.embedding for item in items]
        notes = _attach_pending(notes, _cluster_pending_links(cluster))
        return self.save(
            notes,
            embeddings,
            readable_ids=readable_ids,
            embedder_name=embedder_name,
            embedder_identity=embedder_identity,
            base_version=base_version,
        )

    def load_cluster(self, cluster: Any = None) -> Any:
        """Loads the live version into ``cluster`` (default: a new ``MemoryCluster``).

        Notes go in in saved (index) order: with ``cluster.add_notes(notes, embeddings)`` when
        the cluster has it (by default the same as one ``add_note`` per note, in order), else
        one ``cluster.add_note(note, embedding)`` at a time. Links between stored notes become
        edges; pending links are parked again. A cluster built with links arriving before
        their targets may list a node's out-edges in another order after a reload; that only
        matters for bit-level sums in the sequential PPR oracle.
        """
        contents = self.load()
        if cluster is None:
            from soulmem_torch.runtime import MemoryCluster

            cluster = MemoryCluster()
        add_notes = getattr(cluster, "add_notes", None)
        if callable(add_notes):
            add_notes(contents.notes, contents.embeddings)
        else:
            for note, embedding in zip(contents.notes, contents.embeddings):
                cluster.add_note(note, embedding)
        return cluster


def _cluster_pending_links(cluster: Any) -> list[MemoryLink]:
    """The full ``MemoryLink`` objects among ``cluster.pending_links()`` (any container shape)."""
    getter = getattr(cluster, "pending_links", None)
    if getter is None:
        return []
    found = getter() if callable(getter) else getter
    stack: list[Any] = [found]
    links: list[MemoryLink] = []
    while stack:
        item = stack.pop()
        if isinstance(item, MemoryLink):
            links.append(item)
        elif isinstance(item, Mapping):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(reversed(list(item)))
    return links


def _attach_pending(notes: list[MemoryNote], pending: Sequence[MemoryLink]) -> list[MemoryNote]:
    """Adds each pending link missing from its source note's ``mem_links`` (on a copy)."""
    if not pending:
        return notes
    index = {note.id: i for i, note in enumerate(notes)}
    on_notes: set[LinkId] = {link.id for note in notes for link in note.mem_links}
    extra: dict[int, list[MemoryLink]] = {}
    for link in pending:
        if link.id in on_notes or link.from_ not in index:
            continue
        on_notes.add(link.id)
        extra.setdefault(index[link.from_], []).append(link)
    out = list(notes)
    for i, links in extra.items():
        out[i] = notes[i].model_copy(update={"mem_links": [*notes[i].mem_links, *links]})
    return out


# ---- reusing stored vectors only with the embedder that made them ---------------------------
def embeddings_for_embedder(
    contents: StoreContents,
    embedder: Any,
    *,
    on_mismatch: str = "reembed",
    progress: bool = False,
    where: str = "store",
) -> tuple[list[MemoryEmbedding], str | None]:
    """The loaded notes' embeddings for ``embedder``: the stored ones when they are its own.

    The store's recorded :class:`~soulmem_torch.embedding.identity.EmbedderIdentity` is
    compared with ``embedder``'s (one call on the fixed probe texts). Same → the stored vectors
    are reused (notes stored without one are embedded now). Different → every note is
    re-embedded (``on_mismatch="reembed"``, the default; an
    :class:`~soulmem_torch.embedding.identity.EmbedderMismatchWarning` names both embedders) or
    :class:`~soulmem_torch.embedding.identity.EmbedderMismatchError` is raised (``"refuse"``).
    Vectors of two embedders are never mixed. A legacy store (no recorded identity) is trusted
    when its recorded class name and width match the embedder's.

    Returns:
        ``(embeddings, reason)``: one embedding per note; ``reason`` describes the mismatch
        when the notes were re-embedded, else ``None``.

    Raises:
        ValidationError: ``on_mismatch`` is not ``"reembed"`` or ``"refuse"``.
        EmbedderMismatchError: a mismatch with ``on_mismatch="refuse"``.
    """
    if on_mismatch not in ("reembed", "refuse"):
        raise ValidationError(
            f"on_embedder_mismatch: expected 'reembed' or 'refuse', found {on_mismatch!r}"
        )
    notes = contents.notes
    stored_vectors = contents.manifest.get("embedding") is not None
    if not notes:
        return [], None
    given = embedder_identity(embedder)
    if stored_vectors and not same_embedder(
        contents.embedder_identity, contents.embedder_name, contents.embedding_dim, embedder, given
    ):
        reason = describe_mismatch(contents.embedder_identity or contents.embedder_name, given)
        if on_mismatch == "refuse":
            raise EmbedderMismatchError(
                f"{where}: {reason}; refusing to mix them — open it with its own embedder, or "
                "re-embed every note (on_embedder_mismatch='reembed', on the command line "
                "--on-embedder-mismatch reembed)"
            )
        warnings.warn(
            EmbedderMismatchWarning(f"{where}: {reason}; re-embedding all {len(notes)} notes"),
            stacklevel=3,
        )
        return _embed_with_progress(notes, embedder, progress=progress), reason
    out = list(contents.embeddings)
    missing = [i for i, e in enumerate(out) if e is None]
    if missing:
        fresh = _embed_with_progress([notes[i] for i in missing], embedder, progress=progress)
        for i, emb in zip(missing, fresh):
            out[i] = emb
    return out, None  # type: ignore[return-value]


def _embed_with_progress(
    notes: Sequence[MemoryNote], embedder: Any, *, progress: bool, chunk: int = 256
) -> list[MemoryEmbedding]:
    """``embed_notes`` in chunks of ``chunk`` notes, with a tqdm bar when ``progress``."""
    from tqdm.auto import tqdm

    from soulmem_torch.embedding import embed_notes

    out: list[MemoryEmbedding] = []
    with tqdm(total=len(notes), desc="embed", unit="note", disable=not progress, leave=True) as bar:
        for start in range(0, len(notes), chunk):
            part = notes[start : start + chunk]
            out.extend(embed_notes(part, embedder))
            bar.update(len(part))
    return out
