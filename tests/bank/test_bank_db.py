"""A bank in one SQLite database: writes are transactions that roll memory back on failure,
one damaged agent never makes the bank unloadable, legacy bank directories open (and are
refused when their manifest is missing), tensor agents' blobs are checksummed."""

from __future__ import annotations

import errno
import json
import sqlite3
import warnings
from pathlib import Path

import pytest
import torch

from soulmem_torch.bank import MemoryBank
from soulmem_torch.bank._persist import BANK_DB, DamagedAgentError, DamagedAgentWarning
from soulmem_torch.errors import StoreError, ValidationError
from soulmem_torch.model import MemoryNote, SemMemory
from soulmem_torch.store import StoreWriteError
from soulmem_torch.store import db as store_db
from tests.bank.helpers import sample_notes


def _note(text: str) -> MemoryNote:
    return MemoryNote.build(SemMemory(content=text, aliases=[], concept_type="Entity",
                                      description=""))  # fmt: skip


def _bank(root: Path) -> MemoryBank:
    bank = MemoryBank()
    bank.add_agent("npc-0", sample_notes(list(range(0, 20))))
    bank.add_agent("npc-1", sample_notes(list(range(20, 40))))
    bank.save(root)
    return bank


def test_round_trip_and_incremental_agent_writes(tmp_path: Path) -> None:
    bank = _bank(tmp_path)
    back = MemoryBank.load(tmp_path)
    assert back.agents() == ["npc-0", "npc-1"] and len(back.agent("npc-1")) == 20
    with sqlite3.connect(tmp_path / BANK_DB) as conn:
        before = conn.execute("SELECT agent, id, gen FROM notes WHERE agent = 'npc-0'").fetchall()
    assert bank.write_notes(tmp_path, "npc-1", [_note("green tea")]) == (1, 21)
    with sqlite3.connect(tmp_path / BANK_DB) as conn:
        after = conn.execute("SELECT agent, id, gen FROM notes WHERE agent = 'npc-0'").fetchall()
    assert after == before  # another agent's write touched none of npc-0's rows
    assert len(MemoryBank.load(tmp_path).agent("npc-1")) == 21


def test_a_refused_write_leaves_memory_and_disk_as_they_were(tmp_path: Path) -> None:
    bank = _bank(tmp_path)
    with pytest.raises(ValidationError, match="surrogate"):
        bank.write_notes(tmp_path, "new-agent", [_note("half an emoji \ud83d")])
    assert "new-agent" not in bank  # not registered in memory
    bank.write_notes(tmp_path, "npc-0", [_note("a later good write")])
    assert MemoryBank.load(tmp_path).agents() == ["npc-0", "npc-1"]  # and never persisted


def test_a_disk_error_rolls_the_agent_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bank = _bank(tmp_path)
    real = store_db.Database.commit_version

    def full(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store_db.Database, "commit_version", full)
    for agent in ("npc-0", "brand-new"):
        with pytest.raises(StoreWriteError, match="disk is full"):
            bank.write_notes(tmp_path, agent, [_note("refused: the disk is full")])
    monkeypatch.setattr(store_db.Database, "commit_version", real)
    assert len(bank.agent("npc-0")) == 20 and "brand-new" not in bank
    texts = [r.association for r in bank.ask(["npc-0"], ["refused: the disk is full"])]
    refused = {n.id for n in bank.agent("npc-0").cluster.notes() if "refused" in n.to_json()}
    assert not refused and texts
    assert len(MemoryBank.load(tmp_path).agent("npc-0")) == 20


def test_one_damaged_agent_is_named_and_the_rest_served(tmp_path: Path) -> None:
    _bank(tmp_path)
    with sqlite3.connect(tmp_path / BANK_DB) as conn:
        conn.execute("UPDATE notes SET note = replace(note, 'a', 'b') WHERE agent = 'npc-0'")
    with pytest.warns(DamagedAgentWarning, match="'npc-0'.*checksum mismatch"):
        bank = MemoryBank.load(tmp_path)
    assert bank.agents() == ["npc-1"] and "npc-0" in bank.damaged
    with pytest.raises(DamagedAgentError, match="refused"):
        bank.write_notes(tmp_path, "npc-0", [_note("x")])
    with pytest.raises(StoreError, match="could not be loaded"):
        MemoryBank.load(tmp_path, on_damaged="raise")


def test_edited_agent_rows_are_refused(tmp_path: Path) -> None:
    _bank(tmp_path)
    with sqlite3.connect(tmp_path / BANK_DB) as conn:  # swap two agents' names
        conn.execute("UPDATE agents SET agent = 'tmp' WHERE agent = 'npc-0'")
        conn.execute("UPDATE agents SET agent = 'npc-0' WHERE agent = 'npc-1'")
        conn.execute("UPDATE agents SET agent = 'npc-1' WHERE agent = 'tmp'")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bank = MemoryBank.load(tmp_path)
    assert bank.agents() == [] and set(bank.damaged) == {"npc-0", "npc-1"}
    assert caught


def test_tensor_agent_blob_flips_are_refused(tmp_path: Path) -> None:
    bank = MemoryBank()
    bank.add_agent("notes", sample_notes(list(range(5))))
    bank.add_agent_graph("tensors", bank.graph("notes"))
    bank.save(tmp_path)
    back = MemoryBank.load(tmp_path)
    assert torch.equal(back.graph("tensors").tag_emb, bank.graph("notes").tag_emb)
    with sqlite3.connect(tmp_path / BANK_DB) as conn:
        (payload,) = conn.execute("SELECT payload FROM graphs").fetchone()
    for at in range(0, len(payload), max(1, len(payload) // 60)):
        flipped = bytearray(payload)
        flipped[at] ^= 0x10
        with sqlite3.connect(tmp_path / BANK_DB) as conn:
            conn.execute("UPDATE graphs SET payload = ?", (bytes(flipped),))
        with pytest.warns(DamagedAgentWarning, match="'tensors'"):
            loaded = MemoryBank.load(tmp_path)
        assert loaded.agents() == ["notes"]


def test_legacy_bank_directory_opens_and_migrates(tmp_path: Path) -> None:
    from soulmem_torch.store import DirectoryStore

    notes = sample_notes(list(range(6)))
    agent_dir = tmp_path / "agents" / "abc"
    DirectoryStore(agent_dir).save(notes)
    manifest = {"format": "soulmem-bank", "version": 1, "embedder": "HashingEmbedder",
                "agents": [{"id": "npc-9", "dir": "agents/abc", "kind": "notes"}]}  # fmt: skip
    (tmp_path / "bank.json").write_text(json.dumps(manifest))
    bank = MemoryBank.load(tmp_path)
    assert bank.agents() == ["npc-9"] and len(bank.agent("npc-9")) == 6
    bank.write_notes(tmp_path, "npc-10", [_note("first write migrates")])
    assert (tmp_path / BANK_DB).exists()
    again = MemoryBank.load(tmp_path)
    assert again.agents() == ["npc-9", "npc-10"] and len(again.agent("npc-9")) == 6


@pytest.mark.parametrize("damage", ["missing", "flipped", "duplicate"])
def test_legacy_manifest_damage_is_refused_not_emptied(tmp_path: Path, damage: str) -> None:
    from soulmem_torch.store import DirectoryStore

    DirectoryStore(tmp_path / "agents" / "abc").save(sample_notes(list(range(3))))
    entry = {"id": "npc-9", "dir": "agents/abc", "kind": "notes"}
    manifest = {"format": "soulmem-bank", "version": 1, "agents": [entry]}
    if damage == "duplicate":
        manifest["agents"] = [entry, entry]
    text = json.dumps(manifest)
    if damage == "flipped":
        text = text.replace('"agents"', '"agentz"')
    if damage != "missing":
        (tmp_path / "bank.json").write_text(text)
    if damage == "missing":
        with pytest.raises(StoreError, match="manifest is missing; refusing to start an empty"):
            MemoryBank.load(tmp_path)
    elif damage == "flipped":
        with pytest.raises(StoreError, match="'agents' must be a list"):
            MemoryBank.load(tmp_path)
    else:
        with pytest.warns(DamagedAgentWarning, match="listed twice"):
            bank = MemoryBank.load(tmp_path)
        assert bank.agents() == ["npc-9"]


def test_a_store_is_not_a_bank(tmp_path: Path) -> None:
    from soulmem_torch.bank._persist import bank_db
    from soulmem_torch.store import MemoryStore

    MemoryStore(tmp_path).save(sample_notes([0]))
    (tmp_path / "store.sqlite3").rename(tmp_path / BANK_DB)
    with pytest.raises(StoreError, match="holds a store, not a bank"):
        MemoryBank.load(tmp_path)
    assert bank_db(tmp_path).exists()


def test_another_embedder_reembeds_and_a_write_rewrites_that_agent_whole(tmp_path: Path) -> None:
    from soulmem_torch.embedding import HashingEmbedder
    from soulmem_torch.store.codec import decode_embedding

    bank = MemoryBank(embedder=HashingEmbedder(64))
    bank.add_agent("npc-0", sample_notes(list(range(5))))
    bank.add_agent("npc-1", sample_notes(list(range(5, 10))))
    bank.save(tmp_path)
    other = MemoryBank.load(tmp_path, embedder=HashingEmbedder(32))
    assert other.reembedded and other.graph("npc-0").tag_emb.shape[1] == 32
    with pytest.raises(Exception, match="refusing to mix"):
        MemoryBank.load(tmp_path, embedder=HashingEmbedder(32), on_embedder_mismatch="refuse")
    other.write_notes(tmp_path, "npc-0", [_note("one more")])
    with sqlite3.connect(tmp_path / BANK_DB) as conn:
        widths = {
            agent: {decode_embedding(e).tag.shape[0] for (e,) in conn.execute(
                "SELECT emb FROM notes WHERE agent = ?", (agent,))}
            for agent in ("npc-0", "npc-1")
        }  # fmt: skip
    assert widths == {"npc-0": {32}, "npc-1": {64}}  # never two embedders in one agent
    again = MemoryBank.load(tmp_path, embedder=HashingEmbedder(32))
    assert len(again.agent("npc-0")) == 6 and again.graph("npc-1").tag_emb.shape[1] == 32
