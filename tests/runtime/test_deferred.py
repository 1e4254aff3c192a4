"""Deferred embeddings (what a store's load hands out): nothing dense is built until a vector is
read; then every vector is bit for bit the eager decode's, all views of one buffer; a read or
assigned one is checked by the cluster like any other; copies are plain embeddings."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import pytest
import torch

from soulmem_torch import SoulMem
from soulmem_torch.embedding import HashingEmbedder, embed_notes
from soulmem_torch.embedding.fields import MemoryEmbedding
from soulmem_torch.errors import ValidationError
from soulmem_torch.runtime.cluster import MemoryCluster
from soulmem_torch.runtime.deferred import untouched_layout, untouched_width
from soulmem_torch.store.codec import _decode_each, decode_embeddings, encode_embedding
from soulmem_torch.store.rows import layout_of
from tests.store._helpers import notes

EMB = HashingEmbedder(64)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def _decoded(count: int = 6) -> tuple[list, list]:  # type: ignore[type-arg]
    ns = notes(0, count)
    blobs = [encode_embedding(e) for e in embed_notes(ns, EMB)]
    return ns, blobs


def test_nothing_is_built_until_a_vector_is_read_then_all_at_once_bit_for_bit() -> None:
    _, blobs = _decoded()
    got = decode_embeddings(blobs)
    want = _decode_each(blobs)
    assert all(type(e) is MemoryEmbedding for e in got)  # the exact type: every fast path
    layout = untouched_layout(got[0])
    assert layout is not None
    source, names = layout
    assert list(names) == list(want[0].fields)
    assert not source.built and source.dim == 64 and source.dtype is torch.float32
    assert [untouched_width(e) for e in got] == [64] * len(got)
    assert layout_of(got) == layout_of(want) and not source.built  # a store's layout: no vector
    assert list(got[1].fields) == list(want[1].fields) and source.built  # the first read
    for a, b in zip(got, want, strict=True):
        assert a is not None and b is not None and list(a.fields) == list(b.fields)
        assert torch.equal(_bits(a.tag), _bits(b.tag))
        for name in b.fields:
            assert torch.equal(_bits(a.fields[name]), _bits(b.fields[name]))
        assert a.tag.untyped_storage().data_ptr() == got[0].tag.untyped_storage().data_ptr()
    assert untouched_width(got[3]) is None  # read: an ordinary embedding from now on


def test_a_read_or_assigned_deferred_embedding_is_checked_like_any_other() -> None:
    ns, blobs = _decoded(3)
    got = decode_embeddings(blobs)
    got[1].tag = torch.full((64,), float("nan"))  # assigned before any read: kept
    assert untouched_width(got[1]) is None and untouched_width(got[0]) == 64
    assert list(got[1].fields) == list(_decode_each(blobs)[1].fields)
    assert bool(got[1].tag.isnan().all())
    with pytest.raises(ValidationError, match=f"embedding of note {ns[1].id}.tag: expected finite"):
        MemoryCluster().add_notes(ns, got)
    fresh = decode_embeddings(blobs)
    fresh[2].fields["content"] = torch.zeros(65)  # an edit in place of a read dict
    with pytest.raises(ValidationError, match=r"fields\['content'\]: expected width 64"):
        MemoryCluster().add_notes(ns, fresh)
    wide = decode_embeddings(blobs)
    cluster = MemoryCluster(embedding_dim=32)  # an untouched one of another width: refused
    with pytest.raises(ValidationError, match="expected width 32, found 64"):
        cluster.add_notes(ns, wide)
    assert len(cluster) == 0


def test_a_cluster_takes_untouched_ones_without_building_them() -> None:
    ns, blobs = _decoded(4)
    got = decode_embeddings(blobs)
    cluster = MemoryCluster()
    cluster.add_notes(ns, got)
    layout = untouched_layout(cluster[ns[0].id].embedding)
    assert layout is not None and not layout[0].built
    assert cluster.embedding_dim == 64
    ref = MemoryCluster()
    ref.add_notes(ns, _decode_each(blobs))
    assert cluster.embedding_dim == ref.embedding_dim and cluster.version == ref.version


def test_copies_and_pickles_are_plain_embeddings_with_the_same_bits() -> None:
    _, blobs = _decoded(2)
    got = decode_embeddings(blobs)
    for twin in (copy.copy(got[0]), copy.deepcopy(got[0]), pickle.loads(pickle.dumps(got[0]))):
        assert type(twin) is MemoryEmbedding and list(twin.fields) == list(got[0].fields)
        assert torch.equal(_bits(twin.tag), _bits(got[0].tag))
    assert repr(got[1]).startswith("MemoryEmbedding(tag=tensor(")
    moved = got[1].to(torch.float64)
    assert type(moved) is MemoryEmbedding and moved.tag.dtype is torch.float64


def test_a_loaded_memory_builds_its_vectors_on_the_first_ask_and_answers_the_same(
    tmp_path: Path,
) -> None:
    mem = SoulMem(embedder=EMB)
    mem.add_notes(notes(0, 20))
    want = mem.ask(["concept 3 概念3"])[0]
    mem.save(tmp_path)
    back = SoulMem.load(tmp_path, embedder=EMB)
    embs = [e.embedding for e in back.cluster]
    layout = untouched_layout(embs[0])
    assert layout is not None and not layout[0].built  # the load built no dense vector
    got = back.ask(["concept 3 概念3"])[0]
    assert layout[0].built
    assert got.seeds == want.seeds and len(got.seeds) > 0
