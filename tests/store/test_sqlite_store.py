"""The SQLite store: writes touch only their rows, failed writes change nothing, corruption is
refused naming the note, versions / restore, migration of legacy directory stores, and
``SoulMem.save`` refusing to replace another memory."""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

import pytest
import torch

from soulmem_torch import SoulMem
from soulmem_torch.embedding import HashingEmbedder, embed_notes
from soulmem_torch.errors import StoreError, ValidationError
from soulmem_torch.model import MemoryNote, SemMemory
from soulmem_torch.store import (
    DB_FILE,
    DEFAULT_KEEP_VERSIONS,
    DirectoryStore,
    MemoryStore,
    StoreChangedError,
    StoreDamagedError,
    StoreExistsError,
    StoreWriteError,
)
from soulmem_torch.store import db as store_db
from soulmem_torch.store.codec import decode_embedding, encode_embedding
from tests.store._helpers import note, notes

EMB = HashingEmbedder(64)


def _rows(path: Path) -> dict[str, tuple]:
    with sqlite3.connect(path / DB_FILE) as conn:
        return {
            r[0]: r[1:] for r in conn.execute("SELECT id, pos, note, rid, emb, gen, sha FROM notes")
        }


def _saved(path: Path, n: int = 5) -> MemoryStore:
    ns = notes(0, n)
    store = MemoryStore(path)
    store.save(ns, embed_notes(ns, EMB), readable_ids={ns[0].id: "sem_zero"})
    return store


def test_embedding_blob_is_exact_and_compact() -> None:
    (emb,) = embed_notes([note(1)], HashingEmbedder())  # 1024-wide, the default
    blob = encode_embedding(emb)
    back = decode_embedding(blob)
    assert torch.equal(back.tag, emb.tag) and back.fields.keys() == emb.fields.keys()
    for name, vec in emb.fields.items():
        assert torch.equal(back.fields[name], vec)  # bit for bit: retrieval cannot change
    dense = 4 * 1024 * (1 + len(emb.fields))
    assert len(blob) < dense / 8, (len(blob), dense)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_embedding_blobs_are_bit_exact_dense_or_sparse(dtype: torch.dtype) -> None:
    from soulmem_torch.embedding.fields import MemoryEmbedding
    from soulmem_torch.store.codec import decode_embeddings

    gen = torch.Generator().manual_seed(3)
    dense = MemoryEmbedding(tag=torch.randn(16, generator=gen).to(dtype),
                            fields={"content": torch.randn(16, generator=gen).to(dtype)})  # fmt: skip
    sparse_tag = torch.zeros(300, dtype=dtype)
    sparse_tag[[3, 299]] = torch.tensor([-0.0, 2.5], dtype=dtype)  # -0.0 kept bit for bit
    sparse = MemoryEmbedding(tag=sparse_tag, fields={"aliases": torch.zeros(300, dtype=dtype)})
    blobs = [encode_embedding(dense), None, encode_embedding(sparse)]
    assert len(blobs[2]) < 300 * 2 * dtype.itemsize / 4  # stored sparse
    back = decode_embeddings(blobs)
    assert back[1] is None
    for want, got in ((dense, back[0]), (sparse, back[2])):
        assert got is not None and got.tag.dtype == dtype
        assert torch.equal(got.tag.view(torch.uint8), want.tag.view(torch.uint8))
        for name in want.fields:
            assert torch.equal(
                got.fields[name].view(torch.uint8), want.fields[name].view(torch.uint8)
            )
    with pytest.raises(ValueError, match="blob 0"):
        decode_embeddings([blobs[2][:-3]])


def test_writes_touch_only_their_rows(tmp_path: Path) -> None:
    store = _saved(tmp_path)
    before = _rows(tmp_path)
    extra = notes(5, 7)
    manifest = store.add_notes(extra, embed_notes(extra, EMB))
    after = _rows(tmp_path)
    assert manifest["change"] == {"added": 2, "updated": 0, "removed": 0}
    assert {k: v for k, v in after.items() if k in before} == before  # untouched, same gen
    assert {after[str(n.id)][4] for n in extra} == {2}
    # a full save of the same notes writes no row; saved twice, no new version either
    back = store.load()
    again = store.save(back.notes, back.embeddings, readable_ids=back.readable_ids)
    assert again["change"] == {"added": 0, "updated": 0, "removed": 0}
    assert _rows(tmp_path) == after
    twice = store.save(back.notes, back.embeddings, readable_ids=back.readable_ids)
    assert twice["generation"] == again["generation"]
    store.remove_notes([extra[0].id])
    assert str(extra[0].id) not in _rows(tmp_path)
    assert [n.id for n in store.load().notes] == [n.id for n in notes(0, 5)] + [extra[1].id]
    assert store.load().readable_ids == {notes(0, 1)[0].id: "sem_zero"}


def test_add_refuses_a_readable_id_of_another_note_and_other_embedders(tmp_path: Path) -> None:
    store = _saved(tmp_path)
    with pytest.raises(ValidationError, match="'sem_zero' already names note"):
        store.add_notes([note(9)], readable_ids={note(9).id: "sem_zero"})
    with pytest.raises(ValidationError, match="width 32, but the store's vectors have width 64"):
        store.add_notes([note(9)], embed_notes([note(9)], HashingEmbedder(32)))
    assert len(store.load().notes) == 5


def test_lone_surrogate_is_refused_before_any_write(tmp_path: Path) -> None:
    store = _saved(tmp_path)
    bad = MemoryNote.build(SemMemory(content="cut emoji \ud83d", aliases=[],
                                     concept_type="Entity", description=""))  # fmt: skip
    before = _rows(tmp_path)
    with pytest.raises(ValidationError, match=r"\\\\ud83d.*lone UTF-16 surrogate"):
        store.add_notes([bad])
    with pytest.raises(ValidationError, match="surrogate"):
        store.save([*store.load().notes, bad])
    assert _rows(tmp_path) == before and store.current_version() == "g000001"


@pytest.mark.parametrize("how", ["disk-full", "oserror"])
def test_a_failed_write_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    store = _saved(tmp_path)
    before = _rows(tmp_path)
    big = [MemoryNote.build(SemMemory(content="x" * 5000 + str(i), aliases=[],
                                      concept_type="Entity", description="")) for i in range(60)]  # fmt: skip
    if how == "disk-full":  # SQLite's own SQLITE_FULL: the file may not grow any more
        pages = sqlite3.connect(tmp_path / DB_FILE).execute("PRAGMA page_count").fetchone()[0]
        monkeypatch.setattr(store_db.Database, "_configure",
                            lambda self, c: c.execute(f"PRAGMA max_page_count={pages + 2}"))  # fmt: skip
        with pytest.raises(StoreWriteError, match="the disk is full.*rolled back"):
            store.add_notes(big)
    else:  # an OSError (ENOSPC) in the middle of the transaction
        real = store_db.NoteRow.digest
        calls = []

        def failing(self: store_db.NoteRow, agent: str) -> bytes:
            calls.append(1)
            if len(calls) == 30:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(self, agent)

        monkeypatch.setattr(store_db.NoteRow, "digest", failing)
        with pytest.raises(StoreWriteError, match="disk is full"):
            store.save(big)
    monkeypatch.undo()
    assert _rows(tmp_path) == before
    assert store.current_version() == "g000001" and len(store.load().notes) == 5
    store.add_notes(big[:1])  # and the store still works
    assert len(store.load().notes) == 6


@pytest.mark.parametrize("column", ["note", "emb", "rid", "pos"])
def test_a_changed_byte_in_any_column_is_refused_naming_the_note(
    tmp_path: Path, column: str
) -> None:
    store = _saved(tmp_path)
    victim = str(notes(0, 1)[0].id)
    with sqlite3.connect(tmp_path / DB_FILE) as conn:
        (value,) = conn.execute(f"SELECT {column} FROM notes WHERE id = ?", (victim,)).fetchone()
        if isinstance(value, bytes):
            flipped = bytearray(value)
            flipped[len(flipped) // 2] ^= 0x04
            value = bytes(flipped)
        elif isinstance(value, int):
            value += 1
        else:
            value = value.replace("e", "E", 1)
        conn.execute(f"UPDATE notes SET {column} = ? WHERE id = ?", (value, victim))
    with pytest.raises(StoreError, match=f"note {victim}: checksum mismatch"):
        store.load()
    (bad,) = [v for v in store.versions() if not v.valid]
    assert victim in (bad.problem or "")


def test_random_byte_flips_in_the_file_never_load_changed_data(tmp_path: Path) -> None:
    store = _saved(tmp_path, 3)
    good = store.load()
    raw = (tmp_path / DB_FILE).read_bytes()
    start = raw.index(b'{"id":"')  # the note rows' pages
    gen = torch.Generator().manual_seed(0)
    for k in range(40):
        data = bytearray(raw)
        at = start + int(torch.randint(0, len(raw) - start, (1,), generator=gen))
        data[at] ^= 1 << int(torch.randint(0, 8, (1,), generator=gen))
        (tmp_path / DB_FILE).write_bytes(bytes(data))
        try:
            back = MemoryStore(tmp_path).load()
        except StoreError:
            continue  # refused, naming the note or the damaged database
        assert [n.to_json() for n in back.notes] == [n.to_json() for n in good.notes], k
        for a, b in zip(back.embeddings, good.embeddings):
            assert torch.equal(a.tag, b.tag)  # type: ignore[union-attr]


def test_a_file_that_is_not_a_database_is_damaged(tmp_path: Path) -> None:
    _saved(tmp_path)
    (tmp_path / DB_FILE).write_bytes(b"garbage" * 100)
    with pytest.raises(StoreDamagedError, match="damaged or not a soulmem database"):
        MemoryStore(tmp_path).load()


def test_versions_restore_and_keep_versions(tmp_path: Path) -> None:
    assert MemoryStore(tmp_path).keep_versions == DEFAULT_KEEP_VERSIONS == 50
    store = MemoryStore(tmp_path, keep_versions=3)
    for n in (2, 4, 6, 8):
        store.save(notes(0, n))
    infos = store.versions()
    assert [v.name for v in infos] == ["g000002", "g000003", "g000004"]
    assert [v.notes for v in infos] == [4, 6, 8] and all(v.valid for v in infos)
    restored = store.restore(2)
    assert len(restored.notes) == 4 and restored.version == "g000005"
    assert store.versions()[-1].current
    store.restore("g000004")  # the restore itself can be undone
    assert len(store.load().notes) == 8
    with pytest.raises(StoreError, match="matches no kept version; versions kept: g000004"):
        store.restore(1)


def test_base_version_guards_against_lost_updates(tmp_path: Path) -> None:
    store = _saved(tmp_path)
    seen = store.current_version()
    store.add_notes([note(8)])
    with pytest.raises(StoreChangedError):
        store.add_notes([note(9)], base_version=seen)
    with pytest.raises(StoreChangedError):
        store.save(notes(0, 1), base_version=seen)


def test_legacy_store_opens_then_migrates_on_first_write(tmp_path: Path) -> None:
    ns = notes(0, 4)
    legacy = DirectoryStore(tmp_path)
    legacy.save(ns[:2])
    legacy.save(ns, embed_notes(ns, EMB), readable_ids={ns[1].id: "sem_one"},
                embedder_name="HashingEmbedder")  # fmt: skip
    store = MemoryStore(tmp_path)
    assert store.is_legacy() and store.current_version() == legacy.current_version()
    mem = SoulMem.load(tmp_path, embedder=EMB)
    assert len(mem) == 4 and mem.readable_ids[ns[1].id] == "sem_one"
    assert not (tmp_path / DB_FILE).exists()  # reading does not migrate
    mem.add_notes([note(7)])
    mem.save(tmp_path)  # the first write: the legacy live version (g2), then this one (g3)
    assert not store.is_legacy()
    assert [v.name for v in store.versions()] == ["g000002", "g000003"]
    back = store.load()
    assert len(back.notes) == 5 and back.readable_ids[ns[1].id] == "sem_one"
    assert len(store.restore(2).notes) == 4
    assert (tmp_path / "CURRENT").exists()  # the old files are left as they were


def test_a_damaged_legacy_store_is_not_migrated(tmp_path: Path) -> None:
    DirectoryStore(tmp_path).save(notes(0, 2))
    (tmp_path / "CURRENT").write_text("garbage\n")
    with pytest.raises(StoreDamagedError):
        MemoryStore(tmp_path).add_notes([note(5)])
    assert not (tmp_path / DB_FILE).exists() or not MemoryStore(tmp_path)._db_live()


def test_soulmem_save_refuses_to_replace_another_memory(tmp_path: Path) -> None:
    first = SoulMem(embedder=EMB)
    first.add_notes(notes(0, 3))
    first.save(tmp_path)
    other = SoulMem(embedder=EMB)
    other.add_notes(notes(10, 11))
    with pytest.raises(StoreExistsError, match="already holds another memory .3 notes"):
        other.save(tmp_path)
    assert len(MemoryStore(tmp_path).load().notes) == 3
    other.save(tmp_path, overwrite=True)
    store = MemoryStore(tmp_path)
    assert len(store.load().notes) == 1
    assert len(store.restore(1).notes) == 3  # the replaced memory stays restorable
    first2 = SoulMem.load(tmp_path, embedder=EMB)
    first2.add_notes([note(20)])
    first2.save(tmp_path)  # its own store: no overwrite needed
