"""The memory store: notes, embeddings and readable ids in one SQLite database.

A store is a directory holding ``store.sqlite3`` (and SQLite's ``-wal`` / ``-shm`` files) and
``LOCK``; the tables are described in :mod:`soulmem_torch.store.db`. What it guarantees:

**Writes are transactions.** :meth:`MemoryStore.save` (the whole memory),
:meth:`MemoryStore.add_notes` (add or replace some notes) and :meth:`MemoryStore.remove_notes`
each run as one SQLite transaction that writes only the rows that change, plus one row of the
change log (``versions``). WAL with ``synchronous=FULL``: a write that returned is on disk, a
crash at any point (an exception, a full disk, ``kill -9``) leaves the last committed version,
never a mix, and a failed write changes nothing (:class:`StoreWriteError`, rolled back).

**One writer at a time; readers never block it.** Writers hold an exclusive OS lock on
``STORE/LOCK`` (``filelock``; released by the OS when its holder dies; waiting is bounded by
``lock_timeout`` / ``$SOULMEM_LOCK_TIMEOUT``, default 600 s, then :class:`StoreLockedError`)
and SQLite's own write lock. A reader reads one consistent snapshot without a lock. A writer
that read earlier passes ``base_version`` and gets :class:`StoreChangedError` instead of
overwriting another writer's version.

**Verified data.** Every row (note JSON, readable id, embedding blob) carries a BLAKE2b-128
checksum verified on every read: a flipped byte is refused naming the note, never loaded; a
damaged database file is a :class:`StoreDamagedError` naming it. Loading never runs code (JSON
and raw little-endian tensors; no pickle).

**Compact embeddings.** Only the fields a note has, in their own dtype bit for bit (float32),
deflated: with the offline ``HashingEmbedder`` a note takes ~1 KB on disk instead of 4 KB per
field, and retrieval is unchanged by construction (the loaded tensors are equal).

**Versions.** The change log keeps the last ``keep_versions`` versions (default 50,
``$SOULMEM_KEEP_VERSIONS``); a version costs only the rows it replaced or removed.
:meth:`MemoryStore.versions` (``soulmem versions STORE``) lists them, verified;
:meth:`MemoryStore.restore` (``soulmem restore STORE 7``) makes an earlier version's notes the
live ones *as a new version*, so a restore can itself be undone.

**Old stores.** A directory store of the previous format (``CURRENT`` + ``versions/``, see
:mod:`soulmem_torch.store._legacy`) opens as before; the first write copies its live version
into the database (same version number) and writes there from then on. The old files are left
untouched (delete ``CURRENT`` and ``versions/`` once you no longer need them).

Example:
    >>> import tempfile, torch
    >>> from soulmem_torch.model import MemoryNote, SemMemory
    >>> from soulmem_torch.embedding.fields import MemoryEmbedding
    >>> note = MemoryNote.build(SemMemory(content="latte", aliases=["拿铁"],
    ...                                   concept_type="Entity", description="coffee"))
    >>> emb = MemoryEmbedding(tag=torch.ones(4), fields={"content": torch.zeros(4)})
    >>> store = MemoryStore(tempfile.mkdtemp())
    >>> manifest = store.save([note], [emb], readable_ids={note.id: "sem_latte"})
    >>> back = store.load()
    >>> back.notes[0].to_json() == note.to_json(), back.readable_ids[note.id]
    (True, 'sem_latte')
"""

from __future__ import annotations

from soulmem_torch.store._legacy import (
    CURRENT_FILE,
    DEFAULT_LOCK_TIMEOUT,
    EMBEDDINGS_FILE,
    FORMAT_NAME,
    FORMAT_VERSION,
    LOCK_FILE,
    MANIFEST_FILE,
    NOTES_FILE,
    PENDING_FILE,
    READABLE_IDS_FILE,
    VERSIONS_DIR,
    DirectoryStore,
    StoreChangedError,
    StoreContents,
    StoreDamagedError,
    StoreLockedError,
    VersionInfo,
    embeddings_for_embedder,
    manifest_checksum,
    pack_embeddings,
    unpack_embeddings,
)
from soulmem_torch.store._store import (
    DB_FILE,
    DEFAULT_KEEP_VERSIONS,
    MemoryStore,
    StoreExistsError,
)
from soulmem_torch.store.db import StoreWriteError

__all__ = [
    "CURRENT_FILE",
    "DB_FILE",
    "DEFAULT_KEEP_VERSIONS",
    "DEFAULT_LOCK_TIMEOUT",
    "EMBEDDINGS_FILE",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "LOCK_FILE",
    "MANIFEST_FILE",
    "NOTES_FILE",
    "PENDING_FILE",
    "READABLE_IDS_FILE",
    "VERSIONS_DIR",
    "DirectoryStore",
    "MemoryStore",
    "StoreChangedError",
    "StoreContents",
    "StoreDamagedError",
    "StoreExistsError",
    "StoreLockedError",
    "StoreWriteError",
    "VersionInfo",
    "embeddings_for_embedder",
    "manifest_checksum",
    "pack_embeddings",
    "unpack_embeddings",
]
