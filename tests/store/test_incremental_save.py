"""``SoulMem.save`` back to its own store writes only what changed since the last load / save
(the notes added, replaced, removed or declared changed; the records opened or changed), and
the store then loads exactly what a whole save of the same memory loads."""

from __future__ import annotations

import errno
import json
import sqlite3
from pathlib import Path

import pytest

from soulmem_torch import SoulMem
from soulmem_torch.embedding import HashingEmbedder
from soulmem_torch.errors import StoreError
from soulmem_torch.runtime.records import records_to_json
from soulmem_torch.store import DB_FILE, MemoryStore
from soulmem_torch.store import db as store_db
from soulmem_torch.store.codec import row_digest
from tests.store._helpers import notes

EMB = HashingEmbedder(64)


def _state(mem: SoulMem) -> tuple:
    cluster = mem.cluster
    return (
        [(e.note.to_json(), None if e.embedding is None else e.embedding.tag.tolist())
         for e in cluster],
        {k: r.model_dump(mode="json") for k, r in mem.working_memory.records.items()},
        dict(mem.readable_ids),
    )  # fmt: skip


def _gens(path: Path) -> dict[str, int]:
    with sqlite3.connect(path / DB_FILE) as conn:
        return dict(conn.execute("SELECT id, gen FROM notes"))


def _changed(mem: SoulMem) -> None:
    """A day's changes: notes added, one removed, retrievals counted, feedback given."""
    fresh = notes(20, 23)
    mem.add_notes(fresh, readable_ids={fresh[0].id: "sem_new"})
    mem.working_memory.remove_node(notes(3, 4)[0].id)
    mem.working_memory.record_retrieval([notes(5, 6)[0].id, fresh[1].id], touch_notes=True,
                                        mark_changed=False)  # fmt: skip
    mem.working_memory.feedback(notes(7, 8)[0].id, "Positive")


def test_a_save_back_writes_only_the_changed_rows_and_loads_as_a_whole_save(
    tmp_path: Path,
) -> None:
    mem = SoulMem(embedder=EMB)
    mem.add_notes(notes(0, 12))
    mem.save(tmp_path / "inc")
    mem = SoulMem.load(tmp_path / "inc", embedder=EMB)
    before = _gens(tmp_path / "inc")
    _changed(mem)
    mem.save(tmp_path / "inc")
    after = _gens(tmp_path / "inc")
    touched = {k for k in after if before.get(k) != after[k]}
    # the three new notes and the one whose count moved; the removed one is gone
    assert touched == {str(n.id) for n in notes(20, 23)} | {str(notes(5, 6)[0].id)}
    assert str(notes(3, 4)[0].id) not in after
    mem.save(tmp_path / "whole", overwrite=True)  # the same memory, written whole
    inc = SoulMem.load(tmp_path / "inc", embedder=EMB)
    whole = SoulMem.load(tmp_path / "whole", embedder=EMB)
    assert _state(inc) == _state(whole) == _state(mem)
    assert records_to_json(inc.working_memory) == records_to_json(mem.working_memory)
    version = MemoryStore(tmp_path / "inc").current_version()
    inc.save(tmp_path / "inc")  # nothing changed since its load: no new version
    assert MemoryStore(tmp_path / "inc").current_version() == version


def test_a_failed_save_back_keeps_its_changes_for_the_next_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mem = SoulMem(embedder=EMB)
    mem.add_notes(notes(0, 6))
    mem.save(tmp_path)
    mem.add_notes(notes(6, 8))
    mem.working_memory.feedback(notes(1, 2)[0].id, "Negative")

    def full(self: object, *a: object, **k: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store_db.Database, "write_records", full)
    with pytest.raises(StoreError, match="disk is full"):
        mem.save(tmp_path)
    monkeypatch.undo()
    assert len(SoulMem.load(tmp_path, embedder=EMB)) == 6  # nothing was written
    mem.save(tmp_path)
    back = SoulMem.load(tmp_path, embedder=EMB)
    assert _state(back) == _state(mem)


def test_a_records_row_is_checksummed(tmp_path: Path) -> None:
    mem = SoulMem(embedder=EMB)
    mem.add_notes(notes(0, 4))
    mem.save(tmp_path)
    victim = str(notes(2, 3)[0].id)
    assert store_db.record_digest("", victim, "{}") == row_digest("record", "", victim, "{}")
    with sqlite3.connect(tmp_path / DB_FILE) as conn:
        (rec,) = conn.execute("SELECT rec FROM records WHERE id = ?", (victim,)).fetchone()
        edited = json.dumps({**json.loads(rec), "retrieval_count": 7}, separators=(",", ":"))
        conn.execute("UPDATE records SET rec = ? WHERE id = ?", (edited, victim))
    with pytest.raises(StoreError, match=f"record of note {victim}: checksum mismatch"):
        SoulMem.load(tmp_path, embedder=EMB)


def test_records_kept_in_a_version_load_and_move_to_rows_on_the_next_write(
    tmp_path: Path,
) -> None:
    """A store written before records had rows (the list in the version's info) loads, and the
    store's next write (here the CLI's ``add_notes``) moves them to rows, losing none."""
    mem = SoulMem(embedder=EMB)
    mem.add_notes(notes(0, 5))
    mem.working_memory.record_retrieval([notes(1, 2)[0].id])
    mem.save(tmp_path)
    records = records_to_json(mem.working_memory)
    with sqlite3.connect(tmp_path / DB_FILE) as conn:  # the format before: no record rows
        gen, written_at, info = conn.execute(
            "SELECT gen, written_at, info FROM versions ORDER BY gen DESC LIMIT 1"
        ).fetchone()
        data = json.loads(info)
        data["records"] = records
        text = json.dumps(data, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
        conn.execute("UPDATE versions SET info = ?, sha = ? WHERE gen = ?",
                     (text, store_db.version_digest(gen, written_at, text), gen))  # fmt: skip
        conn.execute("DELETE FROM records")
    back = SoulMem.load(tmp_path, embedder=EMB)
    assert records_to_json(back.working_memory) == records
    MemoryStore(tmp_path).add_notes(notes(9, 10))
    with sqlite3.connect(tmp_path / DB_FILE) as conn:
        assert conn.execute("SELECT COUNT(*) FROM records").fetchone()[0] == 5
        (info,) = conn.execute("SELECT info FROM versions ORDER BY gen DESC LIMIT 1").fetchone()
        assert "records" not in json.loads(info)["records"]
    again = SoulMem.load(tmp_path, embedder=EMB)
    assert {
        k: r.model_dump(mode="json")
        for k, r in again.working_memory.records.items()
        if k != notes(9, 10)[0].id
    } == {k: r.model_dump(mode="json") for k, r in back.working_memory.records.items()}
