"""The SQLite database under a store or a bank: schema, transactions, the change log.

One file (``store.sqlite3`` in a store directory, ``bank.sqlite3`` in a bank directory) in WAL
mode with ``synchronous=FULL``: a committed transaction is on disk before the call returns, a
crash (even ``kill -9`` or a power cut) leaves the last committed state, readers see one
committed state (a read transaction is a snapshot) and never block the writer. Tables::

    meta(key, value, sha)                    format, format_version, kind ("store" / "bank")
    versions(gen, written_at, info, sha)     one row per committed write (the change log):
                                             note counts, the embedder identity, what changed
    agents(agent, pos, kind, info, gen, sha) a bank's agents ("notes" or "graph"), in order,
                                             with the embedder their vectors came from
    notes(agent, id, pos, note, rid, emb, gen, sha)
                                             one row per note: serde JSON, readable id, the
                                             embedding blob (see ``_codec``), the version that
                                             wrote it; a store is the agent ""
    history(agent, id, pos, note, rid, emb, gen, removed, sha)
                                             rows replaced or deleted by version ``removed``
                                             (kept for the last ``keep_versions`` versions)
    graphs(agent, payload, gen, sha)         a tensor-built agent's snapshot

Every row carries a BLAKE2b-128 checksum of its content (``sha``), verified when it is read: a
flipped byte is refused naming the note or agent, never loaded. The state at version ``g`` is
the notes with ``gen <= g`` plus the history rows with ``gen <= g < removed``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from hashlib import blake2b as _blake2b
from pathlib import Path
from typing import Any

from soulmem_torch.errors import StoreError
from soulmem_torch.model.timestamp import Timestamp
from soulmem_torch.store.codec import _LENGTH as _LEN
from soulmem_torch.store.codec import chunks_of, note_digest, row_digest

__all__ = ["Database", "NoteRow", "StoreWriteError"]

FORMAT = "soulmem_torch.sqlite"
FORMAT_VERSION = 2
_IN_CHUNK = 500  # ids per ``IN (...)`` list

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL, sha BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS versions(gen INTEGER PRIMARY KEY, written_at TEXT NOT NULL,
    info TEXT NOT NULL, sha BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS agents(agent TEXT PRIMARY KEY, pos INTEGER NOT NULL,
    kind TEXT NOT NULL, info TEXT NOT NULL, gen INTEGER NOT NULL, sha BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS notes(agent TEXT NOT NULL, id TEXT NOT NULL, pos INTEGER NOT NULL,
    note TEXT NOT NULL, rid TEXT, emb BLOB, gen INTEGER NOT NULL, sha BLOB NOT NULL,
    PRIMARY KEY(agent, id));
CREATE INDEX IF NOT EXISTS notes_order ON notes(agent, pos);
CREATE INDEX IF NOT EXISTS notes_rid ON notes(agent, rid) WHERE rid IS NOT NULL;
CREATE TABLE IF NOT EXISTS history(agent TEXT NOT NULL, id TEXT NOT NULL, pos INTEGER NOT NULL,
    note TEXT NOT NULL, rid TEXT, emb BLOB, gen INTEGER NOT NULL, removed INTEGER NOT NULL,
    sha BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS history_removed ON history(removed);
CREATE INDEX IF NOT EXISTS history_agent ON history(agent, gen);
CREATE TABLE IF NOT EXISTS graphs(agent TEXT PRIMARY KEY, payload BLOB NOT NULL,
    gen INTEGER NOT NULL, sha BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS records(agent TEXT NOT NULL, id TEXT NOT NULL, rec TEXT NOT NULL,
    gen INTEGER NOT NULL, sha BLOB NOT NULL, PRIMARY KEY(agent, id));
"""


class StoreWriteError(StoreError):
    """The disk refused a write (full, read-only, I/O error): the server's fault, not the
    caller's; the transaction was rolled back and nothing changed."""


@dataclass(frozen=True)
class NoteRow:
    """One note row (``emb`` is the encoded embedding blob or ``None``)."""

    id: str
    pos: int
    note: str
    rid: str | None
    emb: bytes | None

    def digest(self, agent: str) -> bytes:
        return note_digest(agent, self.id, self.pos, self.note, self.rid, self.emb)


def meta_digest(key: str, value: str) -> bytes:
    return row_digest("meta", key, value)


def version_digest(gen: int, written_at: str, info: str) -> bytes:
    return row_digest("version", gen, written_at, info)


def agent_digest(agent: str, pos: int, kind: str) -> bytes:
    return row_digest("agent", agent, pos, kind)


def graph_digest(agent: str, payload: bytes) -> bytes:
    return row_digest("graph", agent, payload)


def record_digest(agent: str, id_: str, rec: str | bytes) -> bytes:
    """BLAKE2b-128 of a retrieval record row: ``row_digest("record", agent, id_, rec)``'s
    bytes (``rec`` its JSON text or the stored UTF-8 bytes)."""
    return _record_digest(_record_head(agent), id_, rec)


def _record_head(agent: str) -> bytes:
    a = agent.encode("utf-8")
    return b"".join((_LEN(6), b"record", _LEN(len(a)), a))


def _record_digest(head: bytes, id_: str, rec: str | bytes) -> bytes:
    i = id_.encode("utf-8")
    r = rec if type(rec) is bytes else rec.encode("utf-8")  # type: ignore[union-attr]
    return _blake2b(b"".join((head, _LEN(len(i)), i, _LEN(len(r)), r)), digest_size=16).digest()


def version_name(gen: int) -> str:
    return f"g{gen:06d}"


def _write_failure(path: Path, exc: BaseException) -> StoreError:
    from soulmem_torch.store._legacy import StoreLockedError

    text = str(exc)
    if isinstance(exc, sqlite3.OperationalError) and "locked" in text:
        return StoreLockedError(
            f"{path}: another writer holds the database ({text}); try again when it has finished"
        )
    full = "full" in text or getattr(exc, "errno", None) == errno.ENOSPC
    what = "the disk is full" if full else "the write failed"
    return StoreWriteError(f"{path}: {what} ({text}); nothing was written (rolled back)")


class Database:
    """The database file ``path`` (created by the first write), of kind ``"store"`` or
    ``"bank"``; ``timeout`` bounds the wait for SQLite's write lock."""

    def __init__(self, path: Path, *, kind: str, timeout: float) -> None:
        self.path = Path(path)
        self.kind = kind
        self.timeout = float(timeout)

    def exists(self) -> bool:
        return self.path.is_file()

    # -- connections ------------------------------------------------------------------------
    def _connect(self, *, create: bool) -> sqlite3.Connection:
        if not create and not self.path.is_file():
            raise StoreError(f"{self.path}: missing")
        try:
            if create:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            uri = f"file:{self.path.as_posix()}?mode={'rwc' if create else 'rw'}"
            conn = sqlite3.connect(
                uri, uri=True, timeout=self.timeout, isolation_level=None,
                check_same_thread=False,
            )  # fmt: skip
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"{self.path}: cannot open the database ({exc})") from None
        try:
            conn.execute(f"PRAGMA busy_timeout={int(self.timeout * 1000)}")
            if create:
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            self._configure(conn)
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise self._damaged(exc) from None
        return conn

    def _configure(self, conn: sqlite3.Connection) -> None:
        """A hook for tests (e.g. ``PRAGMA max_page_count`` to simulate a full disk)."""

    def _damaged(self, exc: BaseException) -> StoreError:
        from soulmem_torch.store._legacy import StoreDamagedError

        return StoreDamagedError(
            f"{self.path}: the database is damaged or not a soulmem database ({exc}); nothing "
            "was changed — restore the file from a backup, or salvage it with "
            f"`sqlite3 {self.path} .recover`"
        )

    @contextlib.contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A read transaction (one consistent snapshot); the meta rows are verified."""
        conn = self._connect(create=False)
        try:
            conn.execute("BEGIN")
            self._check_meta(conn)
            yield conn
        except sqlite3.DatabaseError as exc:
            raise self._damaged(exc) from None
        finally:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            conn.close()

    @contextlib.contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """A write transaction (``BEGIN IMMEDIATE``): committed when the block ends, rolled
        back on any exception (disk errors become :class:`StoreWriteError`)."""
        conn = self._connect(create=True)
        try:
            try:
                conn.execute("BEGIN IMMEDIATE")
                for statement in _SCHEMA.strip().split(";"):
                    if statement.strip():
                        conn.execute(statement)
                self._init_meta(conn)
            except sqlite3.OperationalError as exc:
                raise _write_failure(self.path, exc) from None
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException as exc:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                if isinstance(exc, (sqlite3.OperationalError, OSError)):
                    raise _write_failure(self.path, exc) from None
                if isinstance(exc, sqlite3.DatabaseError):
                    raise self._damaged(exc) from None
                raise
        finally:
            conn.close()

    # -- meta ---------------------------------------------------------------------------------
    def _init_meta(self, conn: sqlite3.Connection) -> None:
        have = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        if not have:
            wanted = {"format": FORMAT, "format_version": str(FORMAT_VERSION), "kind": self.kind,
                      "created_at": Timestamp.now().to_rfc3339()}  # fmt: skip
            conn.executemany(
                "INSERT INTO meta VALUES (?, ?, ?)",
                [(k, v, meta_digest(k, v)) for k, v in wanted.items()],
            )
        self._check_meta(conn)

    def _check_meta(self, conn: sqlite3.Connection) -> None:
        try:
            rows = conn.execute("SELECT key, value, sha FROM meta").fetchall()
        except sqlite3.OperationalError as exc:
            raise self._damaged(exc) from None
        meta: dict[str, str] = {}
        for key, value, sha in rows:
            if (
                not isinstance(key, str)
                or not isinstance(value, str)
                or (sha != meta_digest(key, value))
            ):
                raise self._damaged(f"meta row {key!r}: checksum mismatch")
            meta[key] = value
        if meta.get("format") != FORMAT:
            raise self._damaged(f"format {meta.get('format')!r}, expected {FORMAT!r}")
        if meta.get("format_version") != str(FORMAT_VERSION):
            raise StoreError(
                f"{self.path}: unknown format_version {meta.get('format_version')!r} (this "
                f"soulmem_torch reads version {FORMAT_VERSION})"
            )
        if meta.get("kind") != self.kind:
            raise StoreError(
                f"{self.path}: holds a {meta.get('kind')}, not a {self.kind}"
                + (" (open it with MemoryBank.load / soulmem serve)" if meta.get("kind") == "bank"
                   else " (open it with SoulMem.load / MemoryStore)")
            )  # fmt: skip

    # -- versions -----------------------------------------------------------------------------
    def latest(self, conn: sqlite3.Connection) -> tuple[int, str, dict[str, Any]] | None:
        """``(gen, written_at, info)`` of the newest version (verified), or ``None``."""
        row = conn.execute(
            "SELECT gen, written_at, info, sha FROM versions ORDER BY gen DESC LIMIT 1"
        ).fetchone()
        return None if row is None else self._version_row(row)

    def _version_row(self, row: Sequence[Any]) -> tuple[int, str, dict[str, Any]]:
        gen, written_at, info, sha = row
        if sha != version_digest(gen, written_at, info):
            raise StoreError(f"{self.path}: version {gen}: checksum mismatch; the change log "
                             "is corrupted")  # fmt: skip
        try:
            data = json.loads(info)
        except ValueError:
            raise StoreError(f"{self.path}: version {gen}: unreadable info") from None
        return int(gen), str(written_at), data

    def all_versions(self, conn: sqlite3.Connection) -> list[tuple[int, str, dict[str, Any]]]:
        rows = conn.execute("SELECT gen, written_at, info, sha FROM versions ORDER BY gen")
        return [self._version_row(r) for r in rows.fetchall()]

    # -- notes ---------------------------------------------------------------------------------
    def note_digests(self, conn: sqlite3.Connection, agent: str) -> dict[str, tuple[int, bytes]]:
        """``id → (pos, sha)`` of an agent's live rows (no content read)."""
        rows = conn.execute("SELECT id, pos, sha FROM notes WHERE agent = ?", (agent,))
        return {i: (p, s) for i, p, s in rows.fetchall()}

    def commit_version(
        self,
        conn: sqlite3.Connection,
        agent: str,
        *,
        upserts: Sequence[NoteRow] = (),
        deletes: Sequence[str] = (),
        info: dict[str, Any],
        keep_versions: int,
        gen: int | None = None,
        written_at: str | None = None,
    ) -> int:
        """Writes one version inside the open write transaction ``conn``: the changed rows
        (their old content moved to ``history`` when versions are kept), a ``versions`` row,
        then prunes the change log to ``keep_versions``. Returns the new generation."""
        if gen is None:
            top = conn.execute("SELECT MAX(gen) FROM versions").fetchone()[0]
            gen = 1 + (top or 0)
        touched = [r.id for r in upserts] + list(deletes)
        if keep_versions > 1 and touched:
            for part in chunks_of(touched, _IN_CHUNK):
                marks = ",".join("?" * len(part))
                conn.execute(
                    "INSERT INTO history SELECT agent, id, pos, note, rid, emb, gen, ?, sha "
                    f"FROM notes WHERE agent = ? AND id IN ({marks})",
                    (gen, agent, *part),
                )
        for part in chunks_of(deletes, _IN_CHUNK):
            marks = ",".join("?" * len(part))
            conn.execute(f"DELETE FROM notes WHERE agent = ? AND id IN ({marks})", (agent, *part))
        conn.executemany(
            "INSERT OR REPLACE INTO notes VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [(agent, r.id, r.pos, r.note, r.rid, r.emb, gen, r.digest(agent)) for r in upserts],
        )
        written_at = written_at or Timestamp.now().to_rfc3339()
        text = json.dumps(info, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
        conn.execute(
            "INSERT INTO versions VALUES (?, ?, ?, ?)",
            (gen, written_at, text, version_digest(gen, written_at, text)),
        )
        floor = conn.execute(
            "SELECT gen FROM versions ORDER BY gen DESC LIMIT 1 OFFSET ?", (keep_versions - 1,)
        ).fetchone()
        if floor is not None:
            conn.execute("DELETE FROM versions WHERE gen < ?", (floor[0],))
            conn.execute("DELETE FROM history WHERE removed <= ?", (floor[0],))
        return gen

    def record_rows(self, conn: sqlite3.Connection, agent: str) -> list[tuple[str, bytes]]:
        """``(id, rec)`` of an agent's stored retrieval records, ``rec`` the record's JSON as
        its stored UTF-8 bytes (verified; any order; none in a database written before records
        had rows).

        Raises:
            StoreError: naming the record whose row is corrupted.
        """
        try:
            rows = conn.execute(
                "SELECT id, CAST(rec AS BLOB), sha FROM records WHERE agent = ?", (agent,)
            ).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []
            raise
        head = _record_head(agent)
        for id_, rec, sha in rows:
            if type(rec) is not bytes or _record_digest(head, id_, rec) != sha:
                raise StoreError(
                    f"{self.path}: the retrieval record of note {id_}: checksum mismatch (the "
                    "row is corrupted)"
                )
        return [(i, r) for i, r, _ in rows]

    def write_records(
        self,
        conn: sqlite3.Connection,
        agent: str,
        gen: int,
        upserts: Sequence[tuple[str, str]],
        deletes: Sequence[str] = (),
        *,
        replace_all: bool = False,
    ) -> None:
        """Inside the open write transaction ``conn``: writes the records ``(id, rec)`` of
        ``upserts`` and removes those of ``deletes`` (``replace_all``: every other record of the
        agent too). Records are not versioned: a restored version keeps today's records."""
        if replace_all:
            conn.execute("DELETE FROM records WHERE agent = ?", (agent,))
        for part in chunks_of(list(deletes), _IN_CHUNK):
            marks = ",".join("?" * len(part))
            conn.execute(f"DELETE FROM records WHERE agent = ? AND id IN ({marks})", (agent, *part))
        conn.executemany(
            "INSERT OR REPLACE INTO records VALUES (?, ?, ?, ?, ?)",
            [(agent, i, rec, gen, record_digest(agent, i, rec)) for i, rec in upserts],
        )

    def state_rows(
        self, conn: sqlite3.Connection, agent: str, gen: int | None = None, *, raw: bool = False
    ) -> list[tuple[str, int, str | bytes, str | None, bytes | None, bytes]]:
        """``(id, pos, note, rid, emb, sha)`` of an agent at version ``gen`` (``None``: live),
        in note order. ``raw``: each note as its stored UTF-8 bytes (what its checksum covers
        and the JSON parser reads: not decoded to ``str`` only to be encoded again)."""
        note = "CAST(note AS BLOB)" if raw else "note"
        if gen is None:
            sql = (f"SELECT id, pos, {note}, rid, emb, sha FROM notes WHERE agent = ? "
                   "ORDER BY pos, id")  # fmt: skip
            return conn.execute(sql, (agent,)).fetchall()
        sql = (
            f"SELECT id, pos, {note}, rid, emb, sha FROM notes WHERE agent = ? AND gen <= ? "
            f"UNION ALL SELECT id, pos, {note}, rid, emb, sha FROM history "
            "WHERE agent = ? AND gen <= ? AND removed > ? ORDER BY pos, id"
        )
        return conn.execute(sql, (agent, gen, agent, gen, gen)).fetchall()


def file_size(path: Path) -> int:
    """Bytes of a database with its WAL and shared-memory files."""
    total = 0
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(OSError):
            total += os.path.getsize(str(path) + suffix)
    return total
