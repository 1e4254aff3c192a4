"""A memory's notes as database rows and back, and the checks every write makes first: the
building blocks that ``MemoryStore`` and a ``MemoryBank``'s database (``bank/_persist.py``)
share (one row per note: its JSON, readable id, embedding blob and checksum, see
:mod:`soulmem_torch.store.db`)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pydantic
import torch

from soulmem_torch import __version__
from soulmem_torch.embedding.compact import compact_ref
from soulmem_torch.embedding.fields import FIELD_NAMES, MemoryEmbedding
from soulmem_torch.embedding.identity import EmbedderIdentity
from soulmem_torch.errors import StoreError, ValidationError
from soulmem_torch.model.describe import describe_validation_error
from soulmem_torch.model.ids import MemoryId, parsed_ids
from soulmem_torch.model.notes import MemoryNote
from soulmem_torch.runtime.deferred import untouched_layout
from soulmem_torch.store._legacy import (
    DEFAULT_LOCK_TIMEOUT,
    FORMAT_NAME,
    MANIFEST_CHECKSUM_KEY,
    DirectoryStore,
    manifest_checksum,
)
from soulmem_torch.store.codec import (
    CodecError,
    decode_embeddings,
    encode_embedding,
    first_bad_note_row,
)
from soulmem_torch.store.db import NoteRow, version_name

__all__ = [
    "DEFAULT_KEEP_VERSIONS",
    "STORE_FORMAT_VERSION",
    "align_embeddings",
    "check_keep_versions",
    "check_lock_timeout",
    "check_notes",
    "check_utf8",
    "counts_of",
    "decode_rows",
    "layout_of",
    "manifest_of",
    "note_rows",
    "parse_notes",
    "validate_embeddings",
    "version_info",
]

DEFAULT_KEEP_VERSIONS = 50
"""Versions a store keeps by default (``$SOULMEM_KEEP_VERSIONS`` overrides it)."""
STORE_FORMAT_VERSION = 2


def _env_number(name: str, default: float, kind: type, what: str) -> Any:
    text = os.environ.get(name)
    if not text:
        return default
    try:
        return kind(text)
    except ValueError:
        raise ValidationError(f"${name}: expected {what}, found {text!r}") from None


def check_keep_versions(value: Any) -> int:
    if value is None:
        value = _env_number("SOULMEM_KEEP_VERSIONS", DEFAULT_KEEP_VERSIONS, int, "an int ≥ 1")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValidationError(f"keep_versions: expected an int ≥ 1, found {value!r}")
    return int(value)


def check_lock_timeout(value: Any) -> float:
    if value is None:
        value = _env_number(
            "SOULMEM_LOCK_TIMEOUT", DEFAULT_LOCK_TIMEOUT, float, "a number of seconds > 0"
        )
    if not (isinstance(value, (int, float)) and not isinstance(value, bool)) or not (
        0 < value < float("inf")
    ):
        raise ValidationError(
            f"lock_timeout: expected a finite number of seconds > 0, found {value!r}"
        )
    return float(value)


def check_utf8(text: str, where: str) -> None:
    """Refuses text SQLite cannot store (lone surrogates such as a cut-off emoji)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start : exc.end].encode("unicode_escape").decode("ascii")
        raise ValidationError(
            f"{where}: holds {bad!r} at character {exc.start}, which is not valid Unicode text "
            "(a lone UTF-16 surrogate, e.g. half of an emoji); nothing was written"
        ) from None


def validate_embeddings(embeddings: Sequence[MemoryEmbedding | None]) -> int | None:
    """Checks every embedding (tensor types, one width, finite, known fields); returns D."""
    dim: int | None = None
    for i, emb in enumerate(embeddings):
        if emb is None:
            continue
        if not isinstance(emb, MemoryEmbedding):
            raise ValidationError(
                f"embeddings[{i}]: expected a MemoryEmbedding or None, found {type(emb).__name__}"
            )
        where = f"embeddings[{i}]"
        ref = compact_ref(emb)
        if ref is not None:  # compact: its table was checked when packed (widths, finite)
            width = ref.table.dim
            if dim is not None and width != dim:
                raise ValidationError(f"{where}.tag: expected width {dim}, found {width}")
            dim = width
            continue
        for what, vec in [
            ("tag", emb.tag),
            *((f"fields[{k!r}]", v) for k, v in emb.fields.items()),
        ]:
            if not isinstance(vec, torch.Tensor):
                raise ValidationError(
                    f"{where}.{what}: expected a torch.Tensor, found {type(vec).__name__}"
                )
        emb.validate(dim=dim, where=where)
        if dim is None:
            dim = int(emb.tag.shape[0])
    return dim


def _width(embedding: MemoryEmbedding) -> int:
    ref = compact_ref(embedding)
    return ref.table.dim if ref is not None else embedding.dim


def layout_of(embeddings: Sequence[MemoryEmbedding | None]) -> dict[str, Any] | None:
    """``{"dim", "dtype", "fields", "count"}`` of the embeddings (``None`` when none)."""
    present = [e for e in embeddings if e is not None]
    if not present:
        return None
    dtype: torch.dtype | None = None
    names: set[str] = set()
    sources: set[int] = set()
    first = untouched_layout(present[0])
    for e in present:
        untouched = untouched_layout(e)
        if untouched is not None:  # a load's: its buffer's dtype, its field names (unbuilt)
            source, fields = untouched
            if id(source) not in sources:
                sources.add(id(source))
                dtype = source.dtype if dtype is None else torch.promote_types(dtype, source.dtype)
            names.update(fields)
            continue
        ref = compact_ref(e)
        if ref is not None:  # a compact one's: float32, its field names (nothing built)
            dtype = torch.float32 if dtype is None else torch.promote_types(dtype, torch.float32)
            names.update(ref.names)
            continue
        for v in (e.tag, *e.fields.values()):
            if v.dtype != dtype:
                dtype = v.dtype if dtype is None else torch.promote_types(dtype, v.dtype)
        names.update(e.fields)
    return {
        "dim": int(first[0].dim if first is not None else _width(present[0])),
        "dtype": str(dtype).removeprefix("torch."),
        "fields": [n for n in FIELD_NAMES if n in names],
        "count": len(present),
    }


def note_rows(
    notes: Sequence[MemoryNote],
    embeddings: Sequence[MemoryEmbedding | None],
    readable: Mapping[MemoryId, str],
    positions: Sequence[int],
) -> list[NoteRow]:
    """The rows of validated notes (text checked for UTF-8, embeddings encoded)."""
    rows = []
    for i, (note, emb, pos) in enumerate(zip(notes, embeddings, positions)):
        text = note.to_json()
        check_utf8(text, f"notes[{i}] ({note.id})")
        rid = readable.get(note.id)
        if rid is not None:
            check_utf8(rid, f"readable id of {note.id}")
        rows.append(NoteRow(str(note.id), int(pos), text, rid,
                            None if emb is None else encode_embedding(emb)))  # fmt: skip
    return rows


def check_notes(notes: Iterable[Any]) -> tuple[list[MemoryNote], dict[MemoryId, int]]:
    notes = list(notes)
    ids: dict[MemoryId, int] = {}
    for i, note in enumerate(notes):
        if not isinstance(note, MemoryNote):
            raise ValidationError(f"notes[{i}]: expected a MemoryNote, found {type(note).__name__}")
        if ids.setdefault(note.id, i) != i:
            raise ValidationError(
                f"notes[{i}]: duplicate note id {note.id} (also notes[{ids[note.id]}])"
            )
    return notes, ids


def align_embeddings(
    embeddings: Any, notes: Sequence[MemoryNote], note_ids: Mapping[MemoryId, int]
) -> list[MemoryEmbedding | None]:
    return DirectoryStore._align_embeddings(embeddings, notes, note_ids)


def decode_rows(
    where: str,
    agent: str,
    rows: Sequence[Sequence[Any]],
    *,
    hint: str,
    embeddings: Sequence[MemoryEmbedding | None] | None = None,
    notes: Sequence[MemoryNote] | None = None,
) -> tuple[list[MemoryNote], list[MemoryEmbedding | None], dict[MemoryId, str]]:
    """Verifies and parses note rows ``(id, pos, note, rid, emb, sha)`` (``embeddings``: the
    rows' blobs already decoded, ``notes``: their texts already parsed by :func:`parse_notes`
    — e.g. a whole bank's at once; the checksums and ids are verified here either way).

    Raises:
        StoreError: naming the note whose checksum, JSON or embedding is bad.
    """
    who = f"agent {agent!r}, " if agent else ""
    bad = first_bad_note_row(agent, rows)
    if bad is not None:
        raise StoreError(
            f"{where}: {who}note {rows[bad][0]}: checksum mismatch — the row is corrupted and "
            f"was not loaded; {hint}"
        )
    texts = [r[2] for r in rows]
    parsed = list(notes) if notes is not None else parse_notes(texts)
    if parsed is None or len(parsed) != len(rows):  # a bad row: one by one, to name it
        parsed = []
        for (id_, *_rest), text in zip(rows, texts):
            try:
                parsed.append(MemoryNote.from_json(text))
            except pydantic.ValidationError as exc:
                raise StoreError(
                    f"{where}: {who}note {id_}: not a valid note ({describe_validation_error(exc)})"
                ) from None
        if len(parsed) != len(rows):  # pragma: no cover - each text parsed on its own
            raise StoreError(f"{where}: {who}the note rows do not parse one note each")
    readable: dict[MemoryId, str] = {}
    known = parsed_ids(MemoryId)  # the id parsed from the row's own id text: one lookup
    for (id_, _pos, _text, rid, *_rest), note in zip(rows, parsed):
        nid = note.id
        if known.get(id_) is not nid and str(nid) != id_:
            raise StoreError(f"{where}: {who}note {id_}: the row holds note {nid}")
        if rid is not None:
            readable[nid] = rid
    if embeddings is not None:
        return parsed, list(embeddings), readable
    blobs = [r[4] for r in rows]
    try:
        embeddings = decode_embeddings(blobs)
    except CodecError:  # find and name the note
        for (id_, *_rest), blob in zip(rows, blobs):
            try:
                decode_embeddings([blob])
            except CodecError as exc:
                raise StoreError(
                    f"{where}: {who}note {id_}: {str(exc).removeprefix('blob 0: ')}"
                ) from None
        raise
    return parsed, embeddings, readable


_NOTE_LIST = pydantic.TypeAdapter(list[MemoryNote])


def parse_notes(texts: Sequence[str | bytes]) -> list[MemoryNote] | None:
    """The notes of many serde JSON texts (``str``, or all UTF-8 ``bytes``) in one pass of
    pydantic-core (the texts joined into one JSON array; the same validation as
    ``MemoryNote.from_json`` of each), or ``None`` when any text is not exactly one valid
    note (the caller then parses them one by one to name it)."""
    if not texts:
        return []
    try:
        if type(texts[0]) is bytes:
            joined: str | bytes = b"[" + b",".join(texts) + b"]"  # type: ignore[arg-type]
        else:
            joined = "[" + ",".join(texts) + "]"  # type: ignore[arg-type]
        notes = _NOTE_LIST.validate_json(joined)
    except (pydantic.ValidationError, TypeError):
        return None
    return notes if len(notes) == len(texts) else None


def counts_of(
    notes: Sequence[MemoryNote],
    embeddings: Sequence[MemoryEmbedding | None],
    readable: Mapping[MemoryId, str],
    *,
    pending: int | None = None,
) -> dict[str, int]:
    """The counts a version records (``pending``: the pending links, when already counted)."""
    if pending is None:
        ids = {n.id for n in notes}
        pending = sum(1 for n in notes for lk in n.mem_links if lk.to not in ids)
    return {
        "notes": len(notes),
        "links": sum(len(n.mem_links) for n in notes),
        "pending_links": pending,
        "embeddings": sum(e is not None for e in embeddings),
        "readable_ids": len(readable),
    }


def version_info(
    counts: Mapping[str, int],
    layout: Mapping[str, Any] | None,
    embedder_name: str | None,
    embedder_identity: EmbedderIdentity | Mapping[str, Any] | None,
    change: Mapping[str, Any],
    *,
    agent: str = "",
) -> dict[str, Any]:
    identity = (
        embedder_identity.to_json()
        if isinstance(embedder_identity, EmbedderIdentity)
        else embedder_identity
    )
    return {
        "agent": agent,
        "counts": dict(counts),
        "embedding": None if layout is None else dict(layout),
        "embedder_name": embedder_name,
        "embedder": None if identity is None else dict(identity),
        "soulmem_torch_version": __version__,
        "change": dict(change),
    }


def manifest_of(gen: int, written_at: str, info: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """The manifest dictionary a store reports (the shape of the legacy ``manifest.json``)."""
    layout = info.get("embedding")
    manifest: dict[str, Any] = {
        "format": FORMAT_NAME,
        "format_version": STORE_FORMAT_VERSION,
        "engine": "sqlite",
        "database": str(path),
        "generation": gen,
        "version": version_name(gen),
        "written_at": written_at,
        "soulmem_torch_version": info.get("soulmem_torch_version"),
        "counts": dict(info.get("counts") or {}),
        "embedding_dim": None if layout is None else layout.get("dim"),
        "embedder_name": info.get("embedder_name"),
        "embedder": info.get("embedder"),
        "embedding": None if layout is None else dict(layout),
        "change": dict(info.get("change") or {}),
    }
    manifest[MANIFEST_CHECKSUM_KEY] = manifest_checksum(manifest)
    return manifest
