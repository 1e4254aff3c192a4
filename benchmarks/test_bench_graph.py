"""Snapshot build time: synthetic graphs from tensors, and clusters from note objects.

Run: ``pytest benchmarks/test_bench_graph.py --benchmark-enable``. Data is built outside the
timed call; on CUDA the timed call is synchronized.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.conftest import sync
from soulmem_torch.embedding.fields import FIELD_NAMES, MemoryEmbedding
from soulmem_torch.graph import MemoryGraph
from soulmem_torch.model import (
    MemoryLink,
    MemoryNote,
    SemMemLink,
    SemMemory,
    Timestamp,
)
from soulmem_torch.runtime import MemoryCluster

SYNTHETIC = {"100k-1M": (100_000, 1_000_000)}


def synthetic_tensors(num_nodes: int, num_edges: int, *, sorted_edges: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, num_nodes, (2, num_edges), generator=g)
    if sorted_edges:
        edge_index = edge_index[:, torch.sort(edge_index[0], stable=True).indices]
    return dict(
        edge_index=edge_index,
        num_nodes=num_nodes,
        edge_kind=torch.randint(0, 4, (num_edges,), generator=g),
        node_type=torch.randint(0, 4, (num_nodes,), generator=g),
        intensity=torch.rand(num_edges, generator=g, dtype=torch.float64),
        confidence=torch.rand(num_edges, generator=g),
        prob=torch.rand(num_edges, generator=g, dtype=torch.float64),
        create_time_ns=torch.randint(0, 2**62, (num_nodes,), generator=g),
        retrieval_count=torch.randint(0, 50, (num_nodes,), generator=g),
    )


@pytest.mark.benchmark(group="graph-from-tensors")
@pytest.mark.parametrize("order", ["random", "presorted"])
@pytest.mark.parametrize("size", list(SYNTHETIC), ids=list(SYNTHETIC))
def test_bench_from_tensors(benchmark, bench_device, size, order):
    num_nodes, num_edges = SYNTHETIC[size]
    args = synthetic_tensors(num_nodes, num_edges, sorted_edges=order == "presorted")
    args = {k: v.to(bench_device) if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    sync(bench_device)

    def build():
        graph = MemoryGraph.from_tensors(**args)
        sync(bench_device)
        return graph

    graph = benchmark.pedantic(build, rounds=5, warmup_rounds=1)
    assert graph.num_nodes == num_nodes and graph.num_edges == num_edges
    assert graph.rowptr[-1].item() == num_edges


def _random_embedding(g: torch.Generator, dim: int) -> MemoryEmbedding:
    return MemoryEmbedding(
        tag=torch.randn(dim, generator=g),
        fields={name: torch.randn(dim, generator=g) for name in FIELD_NAMES[:3]},
    )


def _congyu_notes():
    from soulmem_torch.model.soul_tune import load_soul_tune_graph
    from tests.conftest import fixture_path

    return load_soul_tune_graph(fixture_path("soul_tune", "congyu", "graph.json")).notes


@pytest.mark.benchmark(group="graph-from-cluster")
@pytest.mark.parametrize("embedded", [False, True], ids=["no-emb", "emb512"])
def test_bench_congyu_snapshot(benchmark, embedded):
    """Snapshot of the congyu cluster (34 notes, 61 links) from note objects."""
    notes = _congyu_notes()
    g = torch.Generator().manual_seed(0)
    cluster = MemoryCluster()
    for note in notes:
        cluster.add_note(note, _random_embedding(g, 512) if embedded else None)
    graph = benchmark(MemoryGraph.from_cluster, cluster)
    assert graph.num_nodes == 34 and graph.num_edges == 61


@pytest.mark.benchmark(group="graph-from-cluster")
def test_bench_congyu_cluster_and_snapshot(benchmark):
    """Cluster build (add_note loop, pending links) plus snapshot, from congyu's notes."""
    notes = _congyu_notes()

    def build():
        cluster = MemoryCluster()
        cluster.add_notes(notes)
        return cluster.graph()

    graph = benchmark(build)
    assert graph.num_edges == 61


@pytest.mark.benchmark(group="graph-from-cluster")
def test_bench_synthetic_cluster_snapshot(benchmark):
    """Snapshot of a 10k-note / 50k-link cluster built from note objects."""
    num_nodes, num_links = 10_000, 50_000
    g = torch.Generator().manual_seed(1)
    t0 = Timestamp.from_ns(1_700_000_000_000_000_000)
    notes = [
        MemoryNote.build(
            SemMemory(content=f"n{i}", aliases=[], concept_type="Entity", description=""),
            create_time=t0,
        )
        for i in range(num_nodes)
    ]
    pairs = torch.randint(0, num_nodes, (num_links, 2), generator=g).tolist()
    link_type = SemMemLink(verb="related", confidence=0.5)
    for s, t in pairs:
        notes[s].mem_links.append(MemoryLink.new(notes[s].id, notes[t].id, link_type))
    cluster = MemoryCluster()
    cluster.add_notes(notes)
    graph = benchmark.pedantic(MemoryGraph.from_cluster, args=(cluster,), rounds=3, warmup_rounds=1)
    assert graph.num_nodes == num_nodes and graph.num_edges == num_links
