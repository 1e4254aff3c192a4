"""``MemoryStore``: a memory's notes, embeddings and readable ids in one SQLite database."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import filelock

from soulmem_torch._gcpause import gc_paused
from soulmem_torch.embedding.fields import FIELD_NAMES, MemoryEmbedding
from soulmem_torch.embedding.identity import EmbedderIdentity
from soulmem_torch.errors import StoreError, ValidationError
from soulmem_torch.model.ids import MemoryId, bulk_parsing
from soulmem_torch.model.notes import MemoryNote
from soulmem_torch.store import _legacy
from soulmem_torch.store._legacy import (
    LOCK_FILE,
    DirectoryStore,
    StoreChangedError,
    StoreContents,
    StoreLockedError,
    VersionInfo,
    _attach_pending,
    _check_readable_ids,
    _cluster_pending_links,
    _pending_links,
)
from soulmem_torch.store.db import Database, NoteRow, version_name
from soulmem_torch.store.rows import (
    DEFAULT_KEEP_VERSIONS,
    align_embeddings,
    check_keep_versions,
    check_lock_timeout,
    check_notes,
    counts_of,
    decode_rows,
    layout_of,
    manifest_of,
    note_rows,
    validate_embeddings,
    version_info,
)

__all__ = ["DEFAULT_KEEP_VERSIONS", "DB_FILE", "MemoryStore", "StoreExistsError"]

DB_FILE = "store.sqlite3"
_AGENT = ""
_VERSION = re.compile(r"^g?0*(\d+)(?:-[0-9a-f]{8})?$")


class StoreExistsError(StoreError):
    """The target store already holds another memory; nothing was written."""


class MemoryStore:
    """A memory store: a directory holding one SQLite database (``store.sqlite3``).

    See :mod:`soulmem_torch.store` for the guarantees.

    Args:
        path: the store directory (created by the first write).
        keep_versions: how many versions the change log keeps (≥ 1; the live one counts;
            ``None`` → ``$SOULMEM_KEEP_VERSIONS`` or :data:`DEFAULT_KEEP_VERSIONS`, 50). A
            version costs only the rows it replaced or removed.
        lock_timeout: seconds a writer waits for the lock (> 0; ``None`` →
            ``$SOULMEM_LOCK_TIMEOUT`` or 600).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        keep_versions: int | None = None,
        lock_timeout: float | None = None,
    ) -> None:
        self.keep_versions = check_keep_versions(keep_versions)
        self.lock_timeout = check_lock_timeout(lock_timeout)
        self.path = Path(path)
        self.db = Database(self.path / DB_FILE, kind="store", timeout=self.lock_timeout)
        self._legacy = DirectoryStore(self.path, lock_timeout=self.lock_timeout)
        self.last_version: str | None = None
        """The version the last write through this object committed."""

    def __repr__(self) -> str:
        return f"MemoryStore({str(self.path)!r})"

    @property
    def database(self) -> Path:
        """The database file."""
        return self.db.path

    # -- locking ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, timeout: float | None = None) -> Iterator[MemoryStore]:
        """Holds the store's exclusive writer lock (re-entrant within a thread).

        Hold it around read → change → write so the change extends the newest version; every
        write takes it itself. The OS drops it when its process dies (``filelock``).

        Raises:
            StoreLockedError: another writer held it for ``timeout`` seconds.
        """
        wait = self.lock_timeout if timeout is None else float(timeout)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot create the store directory ({exc})") from None
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

    # -- state --------------------------------------------------------------------------------
    def is_legacy(self) -> bool:
        """True while the store is still in the directory format (migrated on the next write)."""
        return not self._db_live() and self._legacy.exists()

    def _db_live(self) -> bool:
        if not self.db.exists():
            return False
        with self.db.read() as conn:
            return self.db.latest(conn) is not None

    def exists(self) -> bool:
        """True when there is a store here (a damaged one too); ``False`` only when absent
        (a database whose first write never committed holds no store)."""
        if self._legacy.exists():
            return True
        try:
            return self._db_live()
        except StoreError:
            return True  # a damaged database: its load / save raise StoreDamagedError

    def current_version(self) -> str | None:
        """The live version's name (``g000007``), or ``None`` (no store, or a damaged one)."""
        try:
            return self.check()
        except StoreError:
            return None

    def check(self) -> str | None:
        """The live version's name; ``None`` when there is no store at all.

        Raises:
            StoreDamagedError: the database (or a legacy store's pointer) is damaged.
        """
        if self.db.exists():
            with self.db.read() as conn:
                latest = self.db.latest(conn)
            if latest is not None:
                return version_name(latest[0])
        if self._legacy.exists():
            return self._legacy.check()
        return None

    def count(self) -> int:
        """How many notes the live version holds (0 when there is no store)."""
        if self._db_live():
            with self.db.read() as conn:
                return int(conn.execute(
                    "SELECT COUNT(*) FROM notes WHERE agent = ?", (_AGENT,)
                ).fetchone()[0])  # fmt: skip
        if self._legacy.exists():
            count = self._legacy.manifest()["counts"].get("notes")
            return int(count) if isinstance(count, int) else 0
        return 0

    def _hint(self) -> str:
        return (
            f"`soulmem versions {self.path}` lists the versions and `soulmem restore "
            f"{self.path} VERSION` brings back one from before the damage"
        )

    # -- writing ------------------------------------------------------------------------------
    def _live_locked(self) -> str | None:
        """The live version name under the lock (a damaged legacy store raises)."""
        if self._db_live():
            with self.db.read() as conn:
                return version_name(self.db.latest(conn)[0])  # type: ignore[index]
        if self._legacy.exists():
            return self._legacy.check()
        return None

    def _migrate(self, conn: Any) -> None:
        """Copies a legacy store's live version into the database (same generation)."""
        if self.db.latest(conn) is not None or not self._legacy.exists():
            return
        contents = self._legacy.load()  # verified; a damaged store raises, nothing written
        gen = int(contents.manifest.get("generation") or 1)
        rows = note_rows(contents.notes, contents.embeddings, contents.readable_ids,
                         range(len(contents.notes)))  # fmt: skip
        info = version_info(
            counts_of(contents.notes, contents.embeddings, contents.readable_ids),
            layout_of(contents.embeddings),
            contents.manifest.get("embedder_name"),
            contents.manifest.get("embedder"),
            {"migrated_from": contents.version},
        )
        written_at = contents.manifest.get("written_at")
        self.db.commit_version(
            conn, _AGENT, upserts=rows, info=info, keep_versions=self.keep_versions, gen=gen,
            written_at=written_at if isinstance(written_at, str) else None,
        )  # fmt: skip

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
        """Makes ``notes`` the store's whole contents, as one new version (one transaction).

        Only the rows that differ are written (unchanged notes are not touched); the rows it
        replaces or removes stay in the change log for ``keep_versions`` versions.

        Args:
            notes: the notes, in index order (unique ids).
            embeddings: ``None``, one per note, or ``MemoryId → MemoryEmbedding | None``.
            readable_ids: ``MemoryId → readable id`` (or the inverse), for saved notes only.
            embedder_name / embedder_identity: recorded (checked by ``SoulMem.load``).
            records: the working memory's retrieval records as JSON
                (``runtime.records.records_to_json``), kept in the version's checksummed
                ``versions.info`` row (``None``: none).
            base_version: the version the caller's data was read from (``None``: no store).
                When given, the save fails with :class:`StoreChangedError` if another version
                is live by now. Omitted: the save replaces whatever is live.

        Returns:
            The manifest of the new version.

        Raises:
            ValidationError: bad arguments (nothing is written).
            StoreDamagedError / StoreChangedError / StoreLockedError: nothing is written.
            StoreWriteError: the disk refused the write (rolled back; nothing changed).
        """
        if embedder_identity is not None and not isinstance(embedder_identity, EmbedderIdentity):
            raise ValidationError(
                "embedder_identity: expected an EmbedderIdentity or None, found "
                f"{type(embedder_identity).__name__}"
            )
        notes, note_ids = check_notes(notes)
        per_note = align_embeddings(embeddings, notes, note_ids)
        validate_embeddings(per_note)
        ids = _check_readable_ids(readable_ids, note_ids)
        layout = layout_of(per_note)
        counts = counts_of(notes, per_note, ids)
        candidate = note_rows(notes, per_note, ids, range(len(notes)))
        with self.lock():
            live = self._live_locked()
            if base_version is not ... and base_version != live:
                raise StoreChangedError(
                    f"{self.path}: another writer saved version {live} after this data was "
                    f"read from {base_version or 'an empty store'}; nothing was saved — load "
                    "the store again and redo the change"
                )
            with self.db.write() as conn:
                self._migrate(conn)
                existing = self.db.note_digests(conn, _AGENT)
                rows = _keep_positions(candidate, existing)
                upserts = [
                    r for r in rows if existing.get(r.id, (None, None))[1] != r.digest(_AGENT)
                ]
                keep = {r.id for r in rows}
                deletes = [i for i in existing if i not in keep]
                change = {"added": sum(r.id not in existing for r in upserts),
                          "updated": sum(r.id in existing for r in upserts),
                          "removed": len(deletes)}  # fmt: skip
                info = version_info(counts, layout, embedder_name, embedder_identity, change)
                rec_up: list[tuple[str, str]] = []
                rec_del: list[str] = []
                if records is not None:
                    info["records"], rec_rows = split_records(records)
                    held = dict(self.db.record_rows(conn, _AGENT))
                    rec_up = [(i, r) for i, r in rec_rows if held.get(i) != r]
                    wanted = {i for i, _ in rec_rows}
                    rec_del = [i for i in held if i not in wanted]
                latest = self.db.latest(conn)
                if (
                    not upserts
                    and not deletes
                    and latest is not None
                    and _same_info(latest[2], info)
                ):  # no note changed: no new version (changed records are written in place)
                    self.db.write_records(conn, _AGENT, latest[0], rec_up, rec_del)
                    self.last_version = version_name(latest[0])
                    return manifest_of(*latest, self.db.path)
                gen = self.db.commit_version(
                    conn, _AGENT, upserts=upserts, deletes=deletes, info=info,
                    keep_versions=self.keep_versions,
                )  # fmt: skip
                self.db.write_records(conn, _AGENT, gen, rec_up, rec_del)
                written_at = conn.execute(
                    "SELECT written_at FROM versions WHERE gen = ?", (gen,)
                ).fetchone()[0]
        self.last_version = version_name(gen)
        return manifest_of(gen, written_at, info, self.db.path)

    def add_notes(
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
    ) -> dict[str, Any]:
        """Adds notes (or replaces the stored notes with the same ids), as one new version
        that writes only those rows. Arguments as :meth:`save`; a note keeps its stored
        readable id unless ``readable_ids`` gives one.

        Raises:
            ValidationError: bad arguments, a readable id that names another stored note, or
                embeddings from another embedder than the store's (nothing is written).
        """
        return self.apply_changes(
            notes, embeddings, readable_ids=readable_ids, embedder_name=embedder_name,
            embedder_identity=embedder_identity, base_version=base_version,
        )  # fmt: skip

    def apply_changes(
        self,
        notes: Iterable[MemoryNote] = (),
        embeddings: Sequence[MemoryEmbedding | None]
        | Mapping[MemoryId, MemoryEmbedding | None]
        | None = None,
        removed: Iterable[MemoryId | str] = (),
        *,
        readable_ids: Mapping[MemoryId, str] | Mapping[str, MemoryId] | None = None,
        embedder_name: str | None = None,
        embedder_identity: EmbedderIdentity | None = None,
        base_version: str | object | None = ...,
        records: Mapping[str, Any] | None = None,
        removed_records: Iterable[MemoryId | str] = (),
    ) -> dict[str, Any]:
        """Adds or replaces ``notes``, removes the notes ``removed`` and writes the retrieval
        records given — one new version, one transaction that touches only those rows (what
        ``SoulMem.save`` runs when it knows what changed since the store's live version).

        Args:
            notes / embeddings / readable_ids / embedder_*: as :meth:`add_notes`.
            removed: ids of stored notes to remove (ids not stored are ignored).
            base_version: as :meth:`save`.
            records: ``records_to_json`` output holding only the changed records (their rows
                are written; the other stored records stay), or ``None``.
            removed_records: ids whose stored records are dropped.

        Raises:
            ValidationError / StoreChangedError / StoreWriteError: nothing is written.
        """
        notes, note_ids = check_notes(notes)
        per_note = align_embeddings(embeddings, notes, note_ids)
        dim = validate_embeddings(per_note)
        ids = _check_readable_ids(readable_ids, note_ids)
        rows = note_rows(notes, per_note, ids, [0] * len(notes))
        gone = _id_texts(removed, "removed")
        gone_records = _id_texts(removed_records, "removed_records")
        rec_meta, rec_rows = split_records(records) if records is not None else (None, [])
        identity = None if embedder_identity is None else embedder_identity.to_json()
        with self.lock():
            live = self._live_locked()
            if base_version is not ... and base_version != live:
                raise StoreChangedError(
                    f"{self.path}: another writer saved version {live} after this data was "
                    f"read from {base_version or 'an empty store'}; nothing was saved"
                )
            with self.db.write() as conn:
                self._migrate(conn)
                latest = self.db.latest(conn)
                prev = latest[2] if latest else version_info({}, None, None, None, {})
                layout = prev.get("embedding")
                if dim is not None:
                    self._check_same_embedder(prev, dim, identity, embedder_name)
                found = {}
                for part in _chunks([r.id for r in rows], 500):
                    marks = ",".join("?" * len(part))
                    found.update({
                        i: (p, rid, emb is not None)
                        for i, p, rid, emb in conn.execute(
                            f"SELECT id, pos, rid, emb FROM notes WHERE agent = ? AND id IN "
                            f"({marks})", (_AGENT, *part),
                        )
                    })  # fmt: skip
                present: list[tuple[str, int]] = []
                kept = set(found)
                for part in _chunks([i for i in gone if i not in kept], 500):
                    marks = ",".join("?" * len(part))
                    present += conn.execute(
                        f"SELECT id, emb IS NOT NULL FROM notes WHERE agent = ? AND id IN ({marks})",
                        (_AGENT, *part),
                    ).fetchall()
                self._check_rids_free(conn, rows, ids)
                top = conn.execute(
                    "SELECT MAX(pos) FROM notes WHERE agent = ?", (_AGENT,)
                ).fetchone()[0]
                nxt = -1 if top is None else int(top)
                placed = []
                for r in rows:
                    if r.id in found:
                        pos, old_rid, _ = found[r.id]
                        rid = r.rid if r.rid is not None else old_rid
                    else:
                        nxt += 1
                        pos, rid = nxt, r.rid
                    placed.append(NoteRow(r.id, pos, r.note, rid, r.emb))
                counts = dict(prev.get("counts") or {})
                old_emb = sum(v[2] for v in found.values()) + sum(e for _, e in present)
                new_emb = sum(r.emb is not None for r in placed)
                counts["notes"] = counts.get("notes", 0) + len(placed) - len(found) - len(present)
                counts["embeddings"] = counts.get("embeddings", 0) + new_emb - old_emb
                counts.pop("pending_links", None)
                counts.pop("links", None)
                counts.pop("readable_ids", None)
                if dim is not None:
                    new_layout = layout_of(per_note)
                    assert new_layout is not None
                    fields = set(new_layout["fields"]) | set((layout or {}).get("fields", []))
                    layout = {**new_layout, "fields": [n for n in FIELD_NAMES if n in fields],
                              "count": counts["embeddings"]}  # fmt: skip
                elif layout is not None:
                    layout = (
                        {**layout, "count": counts["embeddings"]} if counts["embeddings"] else None
                    )
                info = version_info(
                    counts, layout,
                    embedder_name if dim is not None else prev.get("embedder_name"),
                    identity if dim is not None and identity else prev.get("embedder"),
                    {"added": len(placed) - len(found), "updated": len(found),
                     "removed": len(present)},
                )  # fmt: skip
                old_records = prev.get("records")
                if rec_meta is not None:
                    info["records"] = rec_meta
                elif isinstance(old_records, dict) and old_records.get("rows"):
                    info["records"] = old_records  # the records' rows stay; so does their meta
                if isinstance(old_records, dict) and "records" in old_records:
                    # records kept in the version (the format before rows): moved to rows
                    old_meta, held = split_records(old_records)
                    fresh = {i for i, _ in rec_rows}
                    rec_rows = [(i, r) for i, r in held if i not in fresh] + rec_rows
                    info.setdefault("records", old_meta)
                gen = self.db.commit_version(
                    conn, _AGENT, upserts=placed, deletes=[i for i, _ in present], info=info,
                    keep_versions=self.keep_versions,
                )  # fmt: skip
                self.db.write_records(conn, _AGENT, gen, rec_rows, gone_records)
                written_at = conn.execute(
                    "SELECT written_at FROM versions WHERE gen = ?", (gen,)
                ).fetchone()[0]
        self.last_version = version_name(gen)
        return manifest_of(gen, written_at, info, self.db.path)

    def remove_notes(
        self, ids: Iterable[MemoryId | str], *, base_version: str | object | None = ...
    ) -> dict[str, Any]:
        """Removes notes by id, as one new version that deletes only those rows (ids not in
        the store are ignored): :meth:`apply_changes` with ``removed``, refused for a store
        with nothing saved yet. Their rows stay in the change log (``restore`` brings them
        back); their records stay."""
        wanted = _id_texts(ids, "ids")
        with self.lock():  # (re-entrant: apply_changes takes it again)
            if self._live_locked() is None and base_version in (..., None):
                raise StoreError(f"{self.path}: not a memory store (nothing saved yet?)")
            return self.apply_changes(removed=wanted, base_version=base_version)

    @staticmethod
    def _check_same_embedder(
        prev: Mapping[str, Any], dim: int, identity: Any, name: str | None
    ) -> None:
        layout = prev.get("embedding")
        if layout is None or not layout.get("count"):
            return
        if int(layout["dim"]) != dim:
            raise ValidationError(
                f"embeddings: width {dim}, but the store's vectors have width {layout['dim']}; "
                "vectors of two embedders are never mixed (re-embed with the store's embedder)"
            )
        stored = prev.get("embedder")
        if identity is not None and stored is not None:
            from soulmem_torch.embedding.identity import same_embedder

            mine = EmbedderIdentity.from_json(identity)
            theirs = EmbedderIdentity.from_json(stored)
            if not same_embedder(theirs, prev.get("embedder_name"), int(layout["dim"]), None, mine):
                raise ValidationError(
                    f"embeddings: made by {mine.name}, but the store's vectors come from "
                    f"{theirs.name}; vectors of two embedders are never mixed"
                )

    def _check_rids_free(
        self, conn: Any, rows: Sequence[NoteRow], ids: Mapping[MemoryId, str]
    ) -> None:
        given = {r.rid: r.id for r in rows if r.rid is not None}
        for part in _chunks(list(given), 500):
            marks = ",".join("?" * len(part))
            for mid, rid in conn.execute(
                f"SELECT id, rid FROM notes WHERE agent = ? AND rid IN ({marks})", (_AGENT, *part)
            ):
                if given[rid] != mid:
                    raise ValidationError(
                        f"readable_ids: {rid!r} already names note {mid} in {self.path}"
                    )

    # -- reading ------------------------------------------------------------------------------
    def load(self) -> StoreContents:
        """Reads and verifies the live version (one consistent snapshot; takes no lock).

        Raises:
            StoreError: naming the note whose row is corrupted (checksum, JSON, embedding),
                or the database that is damaged; a legacy store's errors as before.
        """
        if self.db.exists():
            with gc_paused(), bulk_parsing():  # ~10 small acyclic objects a note (_gcpause)
                with self.db.read() as conn:
                    latest = self.db.latest(conn)
                    rows = self.db.state_rows(conn, _AGENT, raw=True) if latest else None
                    recs = self.db.record_rows(conn, _AGENT) if latest else []
                if latest is not None and rows is not None:
                    return self._contents(latest, rows, recs)
        if self._legacy.exists():
            return self._legacy.load()
        raise StoreError(
            f"{self.path}: not a memory store (nothing saved yet?) — no {DB_FILE} here"
        )

    def _contents(
        self,
        latest: tuple[int, str, dict[str, Any]],
        rows: Sequence[Any],
        recs: Sequence[tuple[str, str]] = (),
    ) -> StoreContents:
        gen, written_at, info = latest
        notes, embeddings, readable = decode_rows(
            str(self.db.path), _AGENT, rows, hint=self._hint()
        )
        note_ids = {n.id: i for i, n in enumerate(notes)}
        pending = _pending_links(notes, note_ids)
        full = dict(info)
        full["counts"] = counts_of(notes, embeddings, readable, pending=len(pending))
        layout = layout_of(embeddings)
        full["embedding"] = layout
        manifest = manifest_of(gen, written_at, full, self.db.path)
        return StoreContents(
            notes=notes,
            embeddings=embeddings,
            readable_ids=readable,
            manifest=manifest,
            pending_links=pending,
            version=version_name(gen),
            records=_records_of(info.get("records"), recs, str(self.db.path)),
        )

    def manifest(self) -> dict[str, Any]:
        """The live version's manifest (no notes read)."""
        if self.db.exists():
            with self.db.read() as conn:
                latest = self.db.latest(conn)
            if latest is not None:
                return manifest_of(*latest, self.db.path)
        if self._legacy.exists():
            return self._legacy.manifest()
        raise StoreError(f"{self.path}: not a memory store (nothing saved yet?)")

    # -- versions -------------------------------------------------------------------------------
    def versions(self) -> list[VersionInfo]:
        """Every kept version, oldest first, each verified (the checksums of its rows)."""
        if not self._db_live():
            return self._legacy.versions() if self._legacy.exists() else []
        with self.db.read() as conn:
            listed = []
            for row in conn.execute("SELECT gen, written_at, info, sha FROM versions ORDER BY gen"):
                try:
                    listed.append((*self.db._version_row(row), None))
                except StoreError as exc:
                    listed.append((int(row[0]), None, None, str(exc)))
            bad: list[tuple[int, int | None, str]] = []
            for table, removed in (("notes", "NULL"), ("history", "removed")):
                for id_, pos, text, rid, emb, sha, gen, rem in conn.execute(
                    f"SELECT id, pos, note, rid, emb, sha, gen, {removed} FROM {table} "
                    "WHERE agent = ?", (_AGENT,)
                ):  # fmt: skip
                    if NoteRow(id_, pos, text, rid, emb).digest(_AGENT) != sha:
                        bad.append((gen, rem, id_))
        live = max(g for g, *_ in listed)
        out = []
        for gen, written_at, info, problem in listed:
            if problem is None:
                hits = [i for g, rem, i in bad if g <= gen and (rem is None or rem > gen)]
                if hits:
                    problem = (f"note {hits[0]}: checksum mismatch (the row is corrupted)"
                               + (f" and {len(hits) - 1} more" if len(hits) > 1 else ""))  # fmt: skip
            embedder = None
            if info is not None:
                ident = info.get("embedder")
                embedder = (
                    ident.get("name") if isinstance(ident, dict) else info.get("embedder_name")
                )
            notes = None if info is None else (info.get("counts") or {}).get("notes")
            out.append(VersionInfo(
                name=version_name(gen), generation=gen, current=gen == live,
                valid=problem is None, problem=problem, written_at=written_at,
                notes=notes if isinstance(notes, int) else None, embedder=embedder,
            ))  # fmt: skip
        return out

    def resolve_version(self, version: str | int) -> str:
        """A version's name from its name (``g000007``), its number (``7``) or a legacy
        directory name.

        Raises:
            StoreError: no such version (naming those kept).
        """
        if not self._db_live():
            return self._legacy.resolve_version(version)
        names = [v.name for v in self.versions()]
        match = _VERSION.match(str(version).strip())
        name = version_name(int(match.group(1))) if match else None
        if name not in names:
            listed = ", ".join(names) if names else "none"
            raise StoreError(
                f"{self.path}: version {version!r} matches no kept version; versions kept: {listed}"
            )
        return name

    def restore(self, version: str | int) -> StoreContents:
        """Makes an earlier version's notes the live ones, as a new version (so the restore
        itself can be undone; nothing is deleted). The version is verified completely first.

        Raises:
            StoreError: no such version, or it does not verify (naming the note and problem).
        """
        if not self.exists():
            raise StoreError(f"{self.path}: not a memory store (no {DB_FILE} here)")
        with self.lock():
            if not self._db_live():
                return self._legacy.restore(version)
            name = self.resolve_version(version)
            gen = int(name[1:])
            with self.db.write() as conn:
                versions = {g: (w, i) for g, w, i in self.db.all_versions(conn)}
                rows = self.db.state_rows(conn, _AGENT, gen)
                try:
                    notes, embeddings, readable = decode_rows(
                        str(self.db.path), _AGENT, rows, hint="pick another version"
                    )
                except StoreError as exc:
                    raise StoreError(
                        f"cannot restore {name}: it does not verify ({exc}); pick another "
                        f"version (`soulmem versions {self.path}`)"
                    ) from None
                target = [NoteRow(i, p, t, r, e) for i, p, t, r, e, _ in rows]
                existing = self.db.note_digests(conn, _AGENT)
                upserts = [
                    r for r in target if existing.get(r.id, (None, None))[1] != r.digest(_AGENT)
                ]
                keep = {r.id for r in target}
                deletes = [i for i in existing if i not in keep]
                old = versions[gen][1]
                info = version_info(
                    counts_of(notes, embeddings, readable), layout_of(embeddings),
                    old.get("embedder_name"), old.get("embedder"),
                    {"added": sum(r.id not in existing for r in upserts),
                     "updated": sum(r.id in existing for r in upserts),
                     "removed": len(deletes), "restored_from": name},
                )  # fmt: skip
                new = self.db.commit_version(
                    conn, _AGENT, upserts=upserts, deletes=deletes, info=info,
                    keep_versions=self.keep_versions,
                )  # fmt: skip
            self.last_version = version_name(new)
        return self.load()

    # -- cluster helpers ------------------------------------------------------------------------
    def save_cluster(
        self,
        cluster: Any,
        *,
        readable_ids: Mapping[MemoryId, str] | Mapping[str, MemoryId] | None = None,
        embedder_name: str | None = None,
        embedder_identity: EmbedderIdentity | None = None,
        base_version: str | object | None = ...,
    ) -> dict[str, Any]:
        """Saves a ``MemoryCluster`` (notes and embeddings in index order; pending links that
        are missing from their source note's ``mem_links`` are added to a copy of it)."""
        items = list(cluster)
        notes = _attach_pending([i.note for i in items], _cluster_pending_links(cluster))
        return self.save(notes, [i.embedding for i in items], readable_ids=readable_ids,
                         embedder_name=embedder_name, embedder_identity=embedder_identity,
                         base_version=base_version)  # fmt: skip

    def load_cluster(self, cluster: Any = None) -> Any:
        """Loads the live version into ``cluster`` (default: a new ``MemoryCluster``)."""
        return _legacy.DirectoryStore.load_cluster(self, cluster)  # type: ignore[arg-type]


def _keep_positions(
    rows: list[NoteRow], existing: Mapping[str, tuple[int, bytes]]
) -> list[NoteRow]:
    """Positions for a full save: kept notes keep theirs when their order is unchanged and new
    notes come after them (appends and removals touch no other row); otherwise 0..N-1."""
    last = -1
    seen_new = False
    for r in rows:
        old = existing.get(r.id)
        if old is None:
            seen_new = True
            continue
        if seen_new or old[0] <= last:
            return rows  # reordered: every row at its index
        last = old[0]
    top = max((p for p, _ in existing.values()), default=-1)
    out = []
    for r in rows:
        old = existing.get(r.id)
        if old is None:
            top += 1
            out.append(NoteRow(r.id, top, r.note, r.rid, r.emb))
        else:
            out.append(NoteRow(r.id, old[0], r.note, r.rid, r.emb))
    return out


def _same_info(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    drop = ("change", "soulmem_torch_version")
    return {k: v for k, v in a.items() if k not in drop} == {
        k: v for k, v in b.items() if k not in drop
    }


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def split_records(records: Mapping[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """``records_to_json`` output as what a version keeps (everything but the list, marked
    ``"rows": True``) and one ``(note id, record JSON)`` row per record (docs/spec.md §12:
    records are rows, written only when they change)."""
    import json

    meta = {k: v for k, v in records.items() if k != "records"}
    meta["rows"] = True
    listed = records.get("records") or []
    if not isinstance(listed, list):
        raise ValidationError(f"records.records: expected a list, found {type(listed).__name__}")
    rows = []
    for i, rec in enumerate(listed):
        if not isinstance(rec, Mapping) or not isinstance(rec.get("memory_id"), str):
            raise ValidationError(
                f"records.records[{i}]: expected a record with a memory_id, found {rec!r:.80}"
            )
        text = json.dumps(rec, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
        rows.append((rec["memory_id"], text))
    return meta, rows


def _id_texts(ids: Iterable[MemoryId | str], what: str) -> list[str]:
    out = []
    for i, mid in enumerate(ids):
        try:
            out.append(str(MemoryId(str(mid))))
        except ValueError:
            raise ValidationError(
                f"{what}[{i}]: expected a note id (UUID), found {mid!r}"
            ) from None
    return out


def _records_of(meta: Any, recs: Sequence[tuple[str, str]], where: str) -> dict[str, Any] | None:
    """A version's records as ``records_to_json`` gives them: kept in the version (the format
    before rows), or its meta with the record rows (``None``: none saved)."""

    if isinstance(meta, dict) and "records" in meta:
        return meta
    if not recs and not isinstance(meta, dict):
        return None
    from soulmem_torch.runtime.records import parse_record_rows

    listed = parse_record_rows([r for _, r in recs], where=f"{where}: records")
    out = {k: v for k, v in (meta or {"format": "soulmem_torch.records", "version": 1}).items()
           if k != "rows"}  # fmt: skip
    out["records"] = listed
    return out
