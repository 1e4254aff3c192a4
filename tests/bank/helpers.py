"""Shared helpers of the bank tests: sample notes, random tensor agents, result comparison."""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch

from soulmem_torch.functional.codes import (
    LINK_PROC,
    LINK_SEM,
    LINK_SIT_ABSTRACT_TO_SPECIFIC,
    LINK_SIT_SPECIFIC_TO_ABSTRACT,
    NODE_ABSTRACT,
    NODE_PROCEDURE,
    NODE_SEMANTIC,
    NODE_SPECIFIC,
)
from soulmem_torch.graph import MemoryGraph
from soulmem_torch.retrieve import (
    AssociateWithActionConfig,
    AssociationConfig,
    DefaultPipelineConfig,
    SimilarityConfig,
)

TEXTS = [
    "a rainy afternoon at the café",
    "谁是我的朋友？",
    "the market square at noon",
    "who lent me an umbrella",
    "coffee with an old friend",
]


@functools.cache
def _sample_notes() -> tuple[Any, ...]:
    from soulmem_torch.data import sample_memory_path
    from soulmem_torch.model.soul_tune import load_soul_tune_graph

    return tuple(load_soul_tune_graph(sample_memory_path()).notes)


def sample_notes(indices: list[int] | None = None) -> list[Any]:
    """Deep copies of (a subset of) the bundled sample notes (77 notes, 212 links)."""
    notes = _sample_notes()
    chosen = notes if indices is None else [notes[i] for i in indices]
    return [copy.deepcopy(n) for n in chosen]


def config(method: str = "power", fusion: str = "rank", **similarity: Any) -> DefaultPipelineConfig:
    """The default pipeline with an explicit PPR method, fusion and similarity settings."""
    return DefaultPipelineConfig(
        similarity=SimilarityConfig(**similarity),
        assoc_with_action=AssociateWithActionConfig(association=AssociationConfig(method=method)),
        fusion=fusion,
    )


def random_agent_graph(
    num_nodes: int, num_edges: int, dim: int, seed: int, *, dangling: bool = True
) -> MemoryGraph:
    """A random typed memory graph from tensors (plain single-vector embeddings)."""
    gen = torch.Generator().manual_seed(seed)
    node_type = torch.tensor([NODE_SEMANTIC, NODE_SPECIFIC, NODE_ABSTRACT, NODE_PROCEDURE])[
        torch.randint(0, 4, (num_nodes,), generator=gen)
    ]
    src = torch.randint(0, num_nodes, (num_edges,), generator=gen)
    dst = torch.randint(0, num_nodes, (num_edges,), generator=gen)
    if not dangling and num_nodes > 1:  # every node gets one out-edge
        src = torch.cat([src, torch.arange(num_nodes)])
        dst = torch.cat([dst, (torch.arange(num_nodes) + 1) % num_nodes])
    e = src.numel()
    kinds = torch.tensor(
        [LINK_SEM, LINK_SIT_ABSTRACT_TO_SPECIFIC, LINK_SIT_SPECIFIC_TO_ABSTRACT, LINK_PROC]
    )
    edge_kind = kinds[torch.randint(0, 4, (e,), generator=gen)]
    edge_kind = torch.where(node_type[dst] == NODE_PROCEDURE, LINK_PROC, edge_kind)
    return MemoryGraph.from_tensors(
        torch.stack([src, dst]),
        num_nodes=num_nodes,
        edge_kind=edge_kind,
        node_type=node_type,
        intensity=torch.rand(e, generator=gen, dtype=torch.float64) * 2,
        confidence=torch.rand(e, generator=gen),
        prob=torch.rand(e, generator=gen, dtype=torch.float64),
        tag_emb=torch.randn(num_nodes, dim, generator=gen),
    )


def assert_same_list(
    got: list[tuple[Any, float]], want: list[tuple[Any, float]], tol: float, what: str
) -> None:
    """Same length, scores within ``tol`` position by position, and the same ids in the same
    order except inside groups of tied scores (equal within ``tol``), compared as sets."""
    assert len(got) == len(want), f"{what}: {len(got)} entries, expected {len(want)}"
    for i, ((_, a), (_, b)) in enumerate(zip(got, want)):
        assert abs(a - b) <= tol * max(1.0, abs(b)), f"{what}[{i}]: score {a} vs {b}"
    i = 0
    while i < len(want):
        j = i + 1
        while j < len(want) and abs(want[j][1] - want[i][1]) <= tol * max(1.0, abs(want[i][1])):
            j += 1
        if j - i == 1:
            assert got[i][0] == want[i][0], f"{what}[{i}]: id {got[i][0]} vs {want[i][0]}"
        elif j < len(want):  # a tie group fully inside the list: same members
            assert {g for g, _ in got[i:j]} == {w for w, _ in want[i:j]}, f"{what}[{i}:{j}]"
        i = j


def assert_same_result(got: Any, want: Any, *, tol: float = 1e-6) -> None:
    """Seeds are float32 similarity scores; association / action are float64 but computed from
    those seeds, so both inherit the float32 rounding of the similarity matmuls (whose
    accumulation order depends on the batch shape, in the retrieve layer too): 1e-6 relative.
    The PPR stage itself, from identical seeds, is checked to 1e-9 in test_bank.py."""
    assert_same_list(got.seeds, want.seeds, tol, "seeds")
    assert_same_list(got.association, want.association, tol, "association")
    assert_same_list(got.action, want.action, tol, "action")
    assert got.short_history == want.short_history
    assert got.short_mem == want.short_mem
    assert got.priority == want.priority
