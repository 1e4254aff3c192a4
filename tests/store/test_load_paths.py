"""The load's bulk paths give what the one-by-one paths give, and still name the bad row: the
notes of a store parsed in one pass, the embedding blobs decoded in whole-array steps, the
checksums unrolled; a row whose JSON, id or stored vector is bad (with a valid checksum, i.e.
written by something else than this store) is refused naming the note."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
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


def _cluster_state(cluster) -> tuple:  # type: ignore[no-untyped-def]
    """Everything a cluster holds, in its dicts' orders (insertion order is behaviour)."""
    nodes = [(k, e.note.to_json(), e.embedding is None) for k, e in cluster._nodes.items()]
    links = [(k, e.from_, e.to, e.intensity, e.link_type) for k, e in cluster._links.items()]
    out = [(k, list(v)) for k, v in cluster._out.items()]
    into = [(k, list(v)) for k, v in cluster._in.items()]
    pending = [(k, [(s, lk.id, lk.to_json() if hasattr(lk, "to_json") else lk.model_dump_json())
                    for s, lk in v]) for k, v in cluster._pending.items()]  # fmt: skip
    index = None if cluster._index is None else list(cluster._index.items())
    return nodes, links, out, into, pending, index, cluster._num_embedded, cluster._dim


def test_a_load_is_the_one_by_one_reference_bit_for_bit(tmp_path: Path) -> None:
    """``SoulMem.load`` (bulk parse, bulk decode into vectors built on first read, inlined
    insertion, load-time caches, records in note order) gives
    exactly what the plain paths give: each row's JSON parsed on its own, each blob decoded
    on its own, each note added with ``add_note`` — notes, edges (and their order), parked
    links, records and embedding bits — on the bundled sample memory (every note kind, links
    to later and to missing notes) plus notes with duplicate times and forward links."""
    from soulmem_torch.data import sample_memory_path
    from soulmem_torch.model import MemoryLink, SemMemLink
    from soulmem_torch.model.soul_tune import load_soul_tune_graph
    from soulmem_torch.runtime.cluster import MemoryCluster
    from soulmem_torch.runtime.deferred import untouched_layout
    from soulmem_torch.runtime.records import records_to_json
    from soulmem_torch.store.codec import decode_embedding

    sample = load_soul_tune_graph(sample_memory_path()).notes
    extra = notes(0, 12)
    for i, n in enumerate(extra):  # a forward link, a backward one, one to a missing note
        n.mem_links.append(MemoryLink.new(n.id, extra[(i + 1) % 12].id,
                                          SemMemLink(verb="next", confidence=0.25)))  # fmt: skip
        n.mem_links.append(MemoryLink.new(n.id, note(100 + i).id,
                                          SemMemLink(verb="gone", confidence=0.5)))  # fmt: skip
    mem = SoulMem(embedder=EMB)
    mem.add_notes(sample + extra, readable_ids={extra[3].id: "three"})
    wm = mem.working_memory
    wm.record_retrieval([extra[2].id, sample[0].id, extra[2].id])
    mem.save(tmp_path)

    back = SoulMem.load(tmp_path, embedder=EMB)
    layouts = [untouched_layout(e.embedding) for e in back.cluster]  # vectors built on first read
    assert all(lay is not None and not lay[0].built for lay in layouts)
    with sqlite3.connect(tmp_path / DB_FILE) as conn:
        rows = conn.execute("SELECT note, emb FROM notes ORDER BY pos, id").fetchall()
    ref = MemoryCluster()
    for text, blob in rows:
        ref.add_note(MemoryNote.from_json(text), None if blob is None else decode_embedding(blob))
    assert _cluster_state(back.cluster) == _cluster_state(ref) == _cluster_state(mem.cluster)
    for a, b in zip(back.cluster, ref, strict=True):
        assert a.note == b.note
        for name in ("tag", *sorted(b.embedding.fields)):
            va = a.embedding.tag if name == "tag" else a.embedding.fields[name]
            vb = b.embedding.tag if name == "tag" else b.embedding.fields[name]
            assert torch.equal(_bits(va), _bits(vb))
        assert sorted(a.embedding.fields) == sorted(b.embedding.fields)
    assert records_to_json(back.working_memory) == records_to_json(wm)
    assert back.readable_ids == {extra[3].id: "three"}
    assert len(back.cluster.pending_links()) == 12


def test_a_big_decode_buffer_is_its_own_mapping_with_the_same_bits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from soulmem_torch.store import codec

    ns = notes(0, 40)
    blobs = [encode_embedding(e) for e in embed_notes(ns, EMB)]
    small = decode_embeddings(blobs)
    monkeypatch.setattr(codec, "_MMAP_MIN", 1)
    mapped = decode_embeddings(blobs)
    buffer = codec.zeroed(1000, np.dtype("<i4"))
    assert not buffer.flags.owndata and not buffer.any()  # the mapping's zero pages
    for a, b in zip(small, mapped, strict=True):
        assert a is not None and b is not None and sorted(a.fields) == sorted(b.fields)
        assert torch.equal(_bits(a.tag), _bits(b.tag))
        for name in a.fields:
            assert torch.equal(_bits(a.fields[name]), _bits(b.fields[name]))
    mapped[3].tag[0] = 7.0  # writable, and a view of the one buffer
    assert mapped[3].tag[0].item() == 7.0


def test_a_wide_float32_load_is_one_compact_table_bit_for_bit(tmp_path: Path, monkeypatch) -> None:
    """A store of 1,024-wide float32 vectors (the default ``HashingEmbedder``'s, plus a dense
    one and a -0.0) loads into one compact table: each note a compact embedding of it, its
    vectors bit for bit the blob-by-blob decode's; the first snapshot takes the table as it is
    (no dense buffer: ``SparseRows.from_dense`` never runs) and answers as the saved memory."""
    from soulmem_torch.embedding.compact import compact_ref
    from soulmem_torch.functional.sparse_rows import SparseRows
    from soulmem_torch.store.codec import decode_embedding

    emb = HashingEmbedder()
    mem = SoulMem(embedder=emb)
    items = notes(0, 40)
    mem.add_notes(items)
    odd = items[7].id  # a dense vector (random: every cell non-zero) and a -0.0 cell
    gen = torch.Generator().manual_seed(3)
    tag = torch.randn(1024, generator=gen)
    content = torch.zeros(1024)
    content[5], content[900] = -0.0, 2.5
    mem.cluster.set_embedding(odd, MemoryEmbedding(tag=tag, fields={"content": content}))
    want = mem.ask("note three", record=False)[0].association
    mem.save(tmp_path)

    back = SoulMem.load(tmp_path, embedder=emb)
    refs = [compact_ref(e.embedding) for e in back.cluster]
    assert all(r is not None for r in refs) and len({id(r.table) for r in refs}) == 1
    with sqlite3.connect(tmp_path / DB_FILE) as conn:
        blobs = dict(conn.execute("SELECT id, emb FROM notes").fetchall())
    for e in back.cluster:
        ref = decode_embedding(blobs[str(e.note.id)])
        assert list(e.embedding.fields) == list(ref.fields)
        assert torch.equal(_bits(e.embedding.tag), _bits(ref.tag))
        for name in ref.fields:
            assert torch.equal(_bits(e.embedding.fields[name]), _bits(ref.fields[name]))
    assert torch.equal(_bits(back.cluster[odd].embedding.fields["content"]), _bits(content))
    import copy
    import pickle

    table = refs[0].table
    for twin in (copy.deepcopy(table), pickle.loads(pickle.dumps(table))):
        assert len(twin) == len(table) and twin.dim == table.dim
        assert torch.equal(twin.pos, table.pos) and torch.equal(twin.rows.val, table.rows.val)

    def no_dense(*_a, **_k):
        raise AssertionError("a loaded compact table was densified")

    monkeypatch.setattr(SparseRows, "from_dense", classmethod(no_dense))
    got = back.ask("note three", record=False)[0].association
    assert [i for i, _ in got] == [i for i, _ in want]
    assert [s for _, s in got] == pytest.approx([s for _, s in want], rel=1e-6)
