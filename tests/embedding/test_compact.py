"""Compact raw vectors (embedding/compact.py, docs/spec.md §3 DECISION "compact raw vectors"):
sparse vectors packed by the cluster and held sparse by the snapshot read back bit for bit,
the snapshot's tables and note side equal the dense layout's, and the public embedding API
(reads, assignment, copy, pickle) behaves as for dense vectors."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch

from soulmem_torch.embedding import (
    MemoryEmbedding,
    embed_note_groups,
    embed_notes,
    stack_compact_field_embeddings,
)
from soulmem_torch.embedding.compact import (
    CompactVectors,
    compact_ref,
    pack_embeddings,
    stack_sparse_tables,
)
from soulmem_torch.embedding.fields import FIELD_NAMES, compact_to_dense
from soulmem_torch.embedding.hashing import HashingEmbedder
from soulmem_torch.embedding.query_embedding import cached_note_side
from soulmem_torch.functional.similarity import note_side_compact
from soulmem_torch.functional.sparse_rows import SparseRows
from soulmem_torch.graph import MemoryGraph
from soulmem_torch.runtime.cluster import MemoryCluster
from tests.embedding.helpers import random_note


def _sparse_embeddings(seed: int = 0, n: int = 30, d: int = 256) -> list[MemoryEmbedding | None]:
    """Hashed-feature-like vectors (~5% non-zero), some field vectors shared between notes,
    some notes without an embedding, fields in varying orders."""
    g = torch.Generator().manual_seed(seed)

    def vec() -> torch.Tensor:
        v = torch.zeros(d)
        cols = torch.randperm(d, generator=g)[: d // 20]
        v[cols] = torch.randn(int(cols.numel()), generator=g)
        return v

    shared = [vec() for _ in range(4)]
    out: list[MemoryEmbedding | None] = []
    for i in range(n):
        if i % 9 == 4:
            out.append(None)
            continue
        names = [FIELD_NAMES[k] for k in torch.randperm(len(FIELD_NAMES), generator=g)[: i % 6]]
        fields = {name: shared[(i + k) % 4] if k % 2 else vec() for k, name in enumerate(names)}
        out.append(MemoryEmbedding(tag=vec() if i % 5 else torch.zeros(d), fields=fields))
    return out


def _values(e: MemoryEmbedding) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    return e.tag.clone(), {k: v.clone() for k, v in e.fields.items()}


def _same(a: MemoryEmbedding, b: MemoryEmbedding) -> None:
    assert torch.equal(a.tag, b.tag)
    assert list(a.fields) == list(b.fields)  # the note's field order
    for k in a.fields:
        assert torch.equal(a.fields[k], b.fields[k]), k


@pytest.mark.parametrize("seed", [0, 1])
def test_packed_embeddings_read_back_bit_for_bit(seed: int) -> None:
    embs = _sparse_embeddings(seed)
    packed = pack_embeddings(embs, 256)
    assert packed is not None
    for e, p in zip(embs, packed):
        if e is None:
            assert p is None
            continue
        assert type(p) is MemoryEmbedding and compact_ref(p) is not None
        _same(p, e)
        assert p.dim == 256


@pytest.mark.parametrize("seed", [0, 1])
def test_sparse_tables_equal_the_dense_stacking(seed: int) -> None:
    embs = _sparse_embeddings(seed)
    tag, mask, rows, pos = stack_compact_field_embeddings(embs, 256)
    s_tag, s_mask, s_rows, s_pos = stack_sparse_tables(embs, 256)  # type: ignore[misc]
    assert torch.equal(s_tag.to_dense(), tag) and torch.equal(s_mask, mask)
    assert torch.equal(s_rows.to_dense(), rows) and torch.equal(s_pos, pos)
    # from compact embeddings (one table, then a mix of two tables and dense vectors)
    packed = pack_embeddings(embs, 256)
    assert packed is not None
    again = stack_sparse_tables(packed, 256)
    assert again is not None and torch.equal(again[2].to_dense(), rows)
    mixed = packed[:10] + embs[10:20] + (pack_embeddings(embs[20:], 256) or [])
    m_tag, m_mask, m_rows, m_pos = stack_sparse_tables(mixed, 256)  # type: ignore[misc]
    d_tag, d_mask, d_rows, d_pos = stack_compact_field_embeddings(embs, 256)
    assert torch.equal(m_tag.to_dense(), d_tag) and torch.equal(m_mask, d_mask)
    # a vector shared across sources (two tables, dense tensors) is interned per source:
    # the same cells, maybe more rows
    assert torch.equal(
        compact_to_dense(m_rows.to_dense(), m_pos)[0], compact_to_dense(d_rows, d_pos)[0]
    )


def test_dense_narrow_and_other_vectors_stay_dense() -> None:
    dense = [MemoryEmbedding(tag=torch.randn(256), fields={"content": torch.randn(256)})] * 3
    assert stack_sparse_tables(dense, 256) is None and pack_embeddings(dense, 256) is None
    narrow = [MemoryEmbedding(tag=torch.tensor([1.0, 0, 0, 0, 0, 0, 0, 0]))] * 3
    assert pack_embeddings(narrow, 8) is None
    f64 = [MemoryEmbedding(tag=torch.zeros(256, dtype=torch.float64))] * 3
    assert pack_embeddings(f64, 256) is None
    c = MemoryCluster()
    graph_embs = [MemoryEmbedding(tag=torch.randn(256), fields={}) for _ in range(3)]
    from soulmem_torch.model import MemoryNote, SemMemory

    notes = [
        MemoryNote.build(SemMemory(content=f"n{i}", aliases=[], concept_type="Entity",
                                   description=""))
        for i in range(3)
    ]  # fmt: skip
    c.add_notes(notes, graph_embs)
    g = MemoryGraph.of(c)
    assert isinstance(g.tag_table, torch.Tensor)  # dense: as before
    assert c[notes[0].id].embedding.tag._base is not None  # a view of the snapshot's table


def _cluster_of(embs: list[MemoryEmbedding | None]) -> tuple[MemoryCluster, list]:
    from soulmem_torch.model import MemoryNote, SemMemory

    notes = [
        MemoryNote.build(SemMemory(content=f"n{i}", aliases=[], concept_type="Entity",
                                   description=""))
        for i in range(len(embs))
    ]  # fmt: skip
    c = MemoryCluster()
    c.add_notes(notes, embs)
    return c, notes


def test_cluster_and_snapshot_hold_the_vectors_sparse() -> None:
    embs = _sparse_embeddings(0)
    c, notes = _cluster_of(embs)
    for note, e in zip(notes, embs):
        got = c[note.id].embedding
        assert (got is None) == (e is None)
        if e is not None:
            assert compact_ref(got) is not None
            _same(got, e)
    g = MemoryGraph.of(c)
    assert isinstance(g.tag_table, SparseRows) and isinstance(g.field_table, SparseRows)
    tag, mask, rows, pos = stack_compact_field_embeddings(embs, 256)
    assert torch.equal(g.tag_emb, tag) and torch.equal(g.tag_mask, mask)
    assert torch.equal(g.field_rows, rows) and torch.equal(g.field_pos, pos)
    # the note side from the sparse raw tables: the dense layout's, bit for bit
    ours = cached_note_side(g)
    ref = note_side_compact(tag, mask, rows, pos)
    for a, b in zip(ours, ref):
        a = a.to_dense() if isinstance(a, SparseRows) else a
        b = b.to_dense() if isinstance(b, SparseRows) else b
        assert torch.equal(a, b)
    assert cached_note_side(g) is ours  # cached per snapshot
    # a change: one new dense note, one removed, one replaced: the next snapshot follows
    c.remove_note(notes[3].id)
    donor = embs[2]
    assert donor is not None
    new = MemoryEmbedding(
        tag=torch.zeros(256), fields={"content": next(iter(donor.fields.values()))}
    )
    c.set_embedding(notes[5].id, new)
    kept = [e for k, e in enumerate(embs) if k != 3]
    kept[4] = new
    g2 = MemoryGraph.of(c)
    tag, mask, rows, pos = stack_compact_field_embeddings(kept, 256)
    assert torch.equal(g2.tag_emb, tag) and torch.equal(g2.field_rows, rows)
    assert torch.equal(g2.field_pos, pos)
    _same(c[notes[5].id].embedding, new)


def test_compact_embedding_public_api() -> None:
    embs = _sparse_embeddings(1)
    c, notes = _cluster_of(embs)
    got = c[notes[1].id].embedding
    want = embs[1]
    assert got is not None and want is not None
    # each read is a fresh copy: changing it in place does not reach the memory
    got.tag.add_(1.0)
    _same(got, want)
    # copy / deepcopy / pickle: ordinary dense embeddings with the same values
    for other in (copy.copy(got), copy.deepcopy(got), pickle.loads(pickle.dumps(got))):
        assert type(other) is MemoryEmbedding and compact_ref(other) is None
        assert "tag" in other.__dict__
        _same(other, want)
    # assignment makes the attribute an ordinary one
    got.tag = torch.ones(256)
    assert torch.equal(got.tag, torch.ones(256)) and compact_ref(got) is None
    _same(MemoryEmbedding(tag=want.tag, fields=got.fields), want)
    assert "MemoryEmbedding(tag=" in repr(c[notes[2].id].embedding)


def test_snapshot_copy_move_pickle_and_apply() -> None:
    c, _ = _cluster_of(_sparse_embeddings(0))
    g = MemoryGraph.of(c)
    dense = g.tag_emb
    for other in (copy.copy(g), g.to("cpu"), pickle.loads(pickle.dumps(g))):
        assert torch.equal(other.tag_emb, dense)
    h = copy.copy(g)
    h.tag_emb = torch.zeros_like(dense)  # an assignment replaces the held table on the copy only
    assert isinstance(h.tag_table, torch.Tensor) and not bool(h.tag_emb.any())
    assert torch.equal(g.tag_emb, dense)
    k = copy.copy(g).apply(lambda t: t)  # apply: the tables dense first, same values
    assert isinstance(k.tag_table, torch.Tensor) and torch.equal(k.tag_emb, dense)


def test_hashing_embedder_notes_are_compact_and_retrieval_unchanged() -> None:
    from soulmem_torch.data import sample_memory_path
    from soulmem_torch.model.soul_tune import load_soul_tune_graph

    notes = load_soul_tune_graph(sample_memory_path()).notes
    embedder = HashingEmbedder()
    vectors = embed_notes(notes, embedder)
    packed = pack_embeddings(vectors, embedder.dim)
    assert packed is not None
    table = compact_ref(packed[0]).table  # type: ignore[union-attr]
    assert isinstance(table, CompactVectors)
    dense_bytes = sum(4 * embedder.dim * (1 + len(v.fields)) for v in vectors)
    assert table.nbytes() * 5 < dense_bytes  # hashed features: far smaller


def test_plain_mode_on_compact_vectors_scores_as_dense() -> None:
    from soulmem_torch.embedding import embed_notes_plain
    from soulmem_torch.functional.similarity import cosine_scores
    from soulmem_torch.model import MemoryNote, SemMemory
    from soulmem_torch.retrieve.similarity import _plain_scores

    texts = [f"note {i} about the rainy café and umbrella number {i * 7}" for i in range(40)]
    notes = [
        MemoryNote.build(SemMemory(content=t, aliases=[], concept_type="Entity", description=""))
        for t in texts
    ]
    embedder = HashingEmbedder()
    vectors = embed_notes_plain(notes, embedder)
    c = MemoryCluster()
    c.add_notes(notes, vectors)
    g = MemoryGraph.of(c)
    assert isinstance(g.tag_table, SparseRows)
    q = embedder(["who lent me an umbrella"])[0]
    dense = torch.stack([v.tag for v in vectors])  # type: ignore[union-attr]
    want = cosine_scores(q.unsqueeze(0), dense)
    got = _plain_scores(g, [q], None)
    assert torch.equal(got, want)
    assert torch.equal(_plain_scores(g, [q], None), want)  # the cached dense copy


def test_store_round_trip_of_compact_vectors(tmp_path) -> None:
    from soulmem_torch import SoulMem
    from soulmem_torch.data import sample_memory_path

    mem = SoulMem.from_graph_file(sample_memory_path())
    before = mem.ask("谁教我做桂花糕？")
    cluster = mem.cluster
    ids = cluster.ids()
    assert compact_ref(cluster[ids[0]].embedding) is not None
    want = {i: cluster[i].embedding for i in ids}
    mem.save(tmp_path / "store")
    loaded = SoulMem.load(tmp_path / "store")
    after = loaded.ask("谁教我做桂花糕？")
    assert isinstance(MemoryGraph.of(loaded.cluster).tag_table, SparseRows)
    for i in ids:
        got = loaded.cluster[i].embedding
        assert compact_ref(got) is not None
        a, b = want[i], got
        assert torch.equal(a.tag, b.tag) and sorted(a.fields) == sorted(b.fields)
        assert all(torch.equal(a.fields[k], b.fields[k]) for k in a.fields)
    assert before[0].association and repr(before) == repr(after)  # same answers and scores


@pytest.mark.parametrize("seed", [0, 1])
def test_store_blob_of_a_compact_embedding_is_its_dense_blob(seed: int) -> None:
    from soulmem_torch.store.codec import decode_embedding, encode_embedding
    from soulmem_torch.store.rows import validate_embeddings

    embs = _sparse_embeddings(seed)
    embs[1] = MemoryEmbedding(tag=torch.randn(256), fields={})  # a dense-layout blob
    packed = pack_embeddings(embs, 256)
    assert packed is not None
    assert validate_embeddings(packed) == 256
    for p in packed:
        if p is None:
            continue
        dense = MemoryEmbedding(tag=p.tag, fields=p.fields)
        blob = encode_embedding(p)
        assert blob == encode_embedding(dense)
        back = decode_embedding(blob)  # the store keeps fields in FIELD_NAMES order
        assert torch.equal(back.tag, dense.tag) and sorted(back.fields) == sorted(dense.fields)
        assert all(torch.equal(back.fields[k], v) for k, v in dense.fields.items())


@pytest.mark.parametrize("seed", [0, 1])
def test_note_groups_are_packed_as_each_cluster_would_pack_them(seed: int) -> None:
    """``embed_note_groups``: each group's compact table is ``pack_embeddings`` of the group's
    ``embed_notes`` views, tensor for tensor (every kind of note, shared vectors, an empty
    group); narrow vectors stay the dense views."""
    rng = np.random.default_rng(seed)
    notes = [random_note(rng) for _ in range(40)]
    groups = [notes[:7], [], notes[7:8], notes[8:25], notes[25:]]
    emb = HashingEmbedder(dim=256)
    views = embed_notes(notes, emb)
    packed = embed_note_groups(groups, emb)
    assert [len(g) for g in packed] == [len(g) for g in groups]
    start = 0
    for group, got in zip(groups, packed):
        want = pack_embeddings(views[start : start + len(group)], 256) if group else []
        start += len(group)
        assert want is not None
        for w, p in zip(want, got):
            rw, rp = compact_ref(w), compact_ref(p)
            assert rp is not None and (rp.index, rp.names) == (rw.index, rw.names)
        if got:
            tw, tp = compact_ref(want[0]).table, compact_ref(got[0]).table
            for a, b in ((tw.tag, tp.tag), (tw.rows, tp.rows)):
                for part in ("crow", "col", "val"):
                    x, y = getattr(a, part), getattr(b, part)
                    assert x.dtype == y.dtype and torch.equal(x, y), part
            assert tw.pos.dtype == tp.pos.dtype and torch.equal(tw.pos, tp.pos)
    narrow = embed_note_groups(groups, HashingEmbedder(dim=64))
    dense = embed_notes(notes, HashingEmbedder(dim=64))
    flat = [e for g in narrow for e in g]
    assert all(compact_ref(e) is None for e in flat)
    for a, b in zip(flat, dense):
        _same(a, b)
