"""The load's bulk paths give what the one-by-one paths give, and still name the bad row: the
notes of a store parsed in one pass, the embedding blobs decoded in whole-array steps, the
checksums unrolled; a row whose JSON, id or stored vector is bad (with a valid checksum, i.e.
written by something else than this store) is refused naming the note."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import torch

from soulmem_torch import SoulMem
from soulmem_torch.embedding import HashingEmbedder, embed_notes
from soulmem_torch.embedding.fields import MemoryEmbedding
from soulmem_torch.errors import StoreError
from soulmem_torch.model import MemoryNote
from soulmem_torch.store import DB_FILE, MemoryStore
from soulmem_torch.store.codec import (
    _decode_bulk,
    _decode_each,
    decode_embeddings,
    encode_embedding,
    note_digest,
    row_digest,
)
from soulmem_torch.store.rows import parse_notes
from tests.store._helpers import note, notes

EMB = HashingEmbedder(64)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def test_bulk_decode_equals_blob_by_blob_for_every_layout() -> None:
    gen = torch.Generator().manual_seed(5)
    dense = MemoryEmbedding(tag=torch.randn(64, generator=gen),
                            fields={"content": torch.randn(64, generator=gen)})  # fmt: skip
    sparse = embed_notes(notes(0, 6), EMB)
    blobs = [encode_embedding(e) for e in sparse[:3]] + [None, encode_embedding(dense)]
    blobs += [encode_embedding(e) for e in sparse[3:]]
    bulk, each = _decode_bulk(blobs), _decode_each(blobs)
    assert bulk is not None and len(bulk) == len(each) == len(blobs) and bulk[3] is None
    for got, want in zip(bulk, each):
        if want is None:
            continue
        assert got is not None and list(got.fields) == list(want.fields)
        assert torch.equal(_bits(got.tag), _bits(want.tag))
        for name in want.fields:
            assert torch.equal(_bits(got.fields[name]), _bits(want.fields[name]))
    wide = MemoryEmbedding(tag=torch.zeros(70_000).index_fill_(0, torch.tensor([69_999]), -0.0))
    (big,) = decode_embeddings([encode_embedding(wide)])  # 32-bit positions, -0.0 kept
    assert big is not None and torch.equal(_bits(big.tag), _bits(wide.tag))


def test_unusual_blobs_fall_back_and_bad_ones_are_named() -> None:
    a, b = (encode_embedding(e) for e in embed_notes(notes(0, 2), EMB))
    other = encode_embedding(MemoryEmbedding(tag=torch.ones(8, dtype=torch.float64)))
    assert _decode_bulk([a, other]) is None  # two dtypes / widths: decoded blob by blob
    assert [e is not None for e in decode_embeddings([a, other, b])] == [True] * 3
    with pytest.raises(ValueError, match="blob 2:"):
        decode_embeddings([a, b, b[:-2]])
    nan = encode_embedding(MemoryEmbedding(tag=torch.full((64,), float("nan"))))
    with pytest.raises(ValueError, match="blob 1: a stored value is NaN"):
        decode_embeddings([a, nan, b])


def test_unrolled_note_checksum_is_the_row_checksum() -> None:
    for row in [("", "id", 3, "{}", None, b"\x00\x01"), ("npc-ü", "i", 0, "t", "rid", None),
                ("a", "b", -1, "", "", b"")]:  # fmt: skip
        assert note_digest(*row) == row_digest(*row)


def test_parse_notes_is_from_json_of_each_and_refuses_joined_tricks() -> None:
    ns = notes(0, 4)
    texts = [n.to_json() for n in ns]
    parsed = parse_notes(texts)
    assert parsed is not None and parsed == [MemoryNote.from_json(t) for t in texts] == ns
    assert parse_notes([texts[0] + "," + texts[1], texts[2]]) is None  # two notes in one row
    assert parse_notes([texts[0], "{}"]) is None
    assert parse_notes([]) == []


def _rewrite(path: Path, victim: str, **changes: object) -> None:
    """Changes a note row *and* recomputes its checksum (what another writer could do)."""
    with sqlite3.connect(path / DB_FILE) as conn:
        row = conn.execute(
            "SELECT agent, id, pos, note, rid, emb FROM notes WHERE id = ?", (victim,)
        ).fetchone()
        agent, id_, pos, text, rid, emb = row
        text = changes.get("note", text)
        emb = changes.get("emb", emb)
        conn.execute(
            "UPDATE notes SET note = ?, emb = ?, sha = ? WHERE id = ?",
            (text, emb, row_digest(agent, id_, pos, text, rid, emb), victim),
        )


@pytest.mark.parametrize("damage", ["json", "other note", "nan vector"])
def test_a_bad_row_with_a_valid_checksum_is_named(tmp_path: Path, damage: str) -> None:
    ns = notes(0, 30)
    MemoryStore(tmp_path).save(ns, embed_notes(ns, EMB))
    victim = str(ns[17].id)
    if damage == "json":
        _rewrite(tmp_path, victim, note='{"id": "' + victim + '"}')
    elif damage == "other note":
        _rewrite(tmp_path, victim, note=ns[3].to_json())
    else:
        nan = MemoryEmbedding(tag=torch.full((64,), float("inf")))
        _rewrite(tmp_path, victim, emb=encode_embedding(nan))
    with pytest.raises(StoreError, match=f"note {victim}"):
        SoulMem.load(tmp_path, embedder=EMB)


def test_a_loaded_memory_keeps_its_records_in_note_order(tmp_path: Path) -> None:
    mem = SoulMem(embedder=EMB)
    mem.add_notes(notes(0, 8))
    mem.working_memory.record_retrieval([notes(5, 6)[0].id, notes(2, 3)[0].id])
    mem.save(tmp_path)
    back = SoulMem.load(tmp_path, embedder=EMB)
    assert list(back.working_memory.records) == list(mem.working_memory.records)
    for mid, rec in mem.working_memory.records.items():
        assert back.working_memory.records[mid] == rec
    assert note(5).id in back.working_memory.records
