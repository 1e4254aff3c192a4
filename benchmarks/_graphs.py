"""Benchmark graphs, query batches and the float64 reference PPR (benchmarks and notebooks).

Every generator is deterministic (seeded) and builds a :class:`~soulmem_torch.graph.MemoryGraph`
from tensors, so the weights the kernels see are the library's own dynamic edge weights (SPEC
§5) and every peer is handed those same weights.

Graphs:

* :func:`original_graph` -- the original's benchmark graph: node ``i`` links to the first
  ``min(fanout, i + 1)`` nodes (``fanout = 10``; ``5`` for graphs of more than 1000 nodes) plus
  a self loop (so nodes below ``fanout`` carry two self loops, as in the original's loop).
* :func:`barabasi_albert_graph` -- preferential attachment, ``m`` links per new node, each
  oriented at random, then ``dangling`` of the nodes lose every out-edge (~5% dangling).
* :func:`chung_lu_graph` -- expected-degree power law (exponent ``gamma``), ``E`` endpoint pairs
  drawn by inverse CDF on the target device (1M / 10M and 10M / 100M on CUDA).

Benchmark graphs have no Procedure notes (a Procedure target gets weight 0, which can leave a row
with zero total weight -- mass the original drops but that igraph / networkx would teleport), so
every peer can be given exactly the same Markov chain.

Queries (:func:`seed_batch`): ``keys`` distinct random nodes per query, **equal weights**. With
equal weights the library's dangling rule (dangling mass goes to the query's keys, evenly) is
the same as "dangling mass follows the personalization vector", which is what networkx and
igraph do -- so those peers solve exactly the same problem.

Reference (:func:`reference_ppr`): ``x = (1 - d) (I - d M_s)^-1 s`` normalized, where ``M_s`` is
the column-stochastic transition with the dangling rule folded in; by a sparse direct solve
(scipy ``spsolve``) up to :data:`SPSOLVE_MAX_NODES` nodes, otherwise by a float64 power
iteration run to a certified ``1e-13`` (:func:`reference_power`). The code here is
independent of ``soulmem_torch.functional.ppr`` (it builds its own matrices).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

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
from soulmem_torch.functional.edge_weights import PREFERENCE_SITUATION, dynamic_edge_weight
from soulmem_torch.graph import MemoryGraph

__all__ = [
    "DAMPING",
    "SPSOLVE_MAX_NODES",
    "PprCase",
    "barabasi_albert_edges",
    "barabasi_albert_graph",
    "chung_lu_edges",
    "chung_lu_graph",
    "graph_weights",
    "l1_error",
    "make_case",
    "memory_graph",
    "original_edges",
    "original_graph",
    "reference_power",
    "reference_ppr",
    "seed_batch",
    "synthetic_memory_graph",
    "topk_overlap",
]

DAMPING = 0.65
"""The original's default ``damping_factor`` (continue probability)."""
SPSOLVE_MAX_NODES = 5_000
"""Largest graph solved directly by :func:`reference_ppr`; above it, certified power iteration."""

_NODE_KINDS = torch.tensor([NODE_SEMANTIC, NODE_SPECIFIC, NODE_ABSTRACT])
_EDGE_KINDS = torch.tensor([LINK_SEM, LINK_SIT_ABSTRACT_TO_SPECIFIC, LINK_SIT_SPECIFIC_TO_ABSTRACT])


# ------------------------------------------------------------------------------------------
# edge lists
# ------------------------------------------------------------------------------------------
def original_edges(num_nodes: int) -> Tensor:
    """The original benchmark's edges: ``i -> j`` for ``j < min(fanout, i + 1)`` plus ``i -> i``.

    ``fanout`` is 10, or 5 for graphs of more than 1000 nodes. Edges are listed source by
    source in insertion order (links first, then the self loop).
    """
    fanout = 10 if num_nodes <= 1000 else 5
    i = torch.arange(num_nodes)
    links = torch.clamp(i + 1, max=fanout)
    src = torch.repeat_interleave(i, links + 1)
    first = torch.cumsum(links + 1, 0) - (links + 1)
    pos = torch.arange(src.numel()) - first[src]
    dst = torch.where(pos < links[src], pos, src)  # the last slot of each row is the self loop
    return torch.stack([src, dst])


def barabasi_albert_edges(
    num_nodes: int, m: int, *, dangling: float = 0.05, seed: int = 0
) -> Tensor:
    """Preferential attachment with ``m`` links per new node, each link oriented at random;
    then a ``dangling`` fraction of the nodes (chosen at random) lose all their out-edges.

    Returns:
        shape (2, E), int64, ``E ~ (1 - dangling) * m * (num_nodes - m)``.
    """
    rng = np.random.default_rng(seed)
    # the classic "repeated nodes" list: each endpoint appears once per incident edge
    repeated = np.empty(2 * m * num_nodes, dtype=np.int64)
    repeated[:m] = np.arange(m)
    filled = m
    src = np.empty((num_nodes - m) * m, dtype=np.int64)
    dst = np.empty_like(src)
    pick = rng.random((num_nodes - m, m))
    for k, new in enumerate(range(m, num_nodes)):
        targets = repeated[(pick[k] * filled).astype(np.int64)]
        src[k * m : (k + 1) * m] = new
        dst[k * m : (k + 1) * m] = targets
        repeated[filled : filled + m] = targets
        repeated[filled + m : filled + 2 * m] = new
        filled += 2 * m
    flip = rng.random(src.shape[0]) < 0.5
    src, dst = np.where(flip, dst, src), np.where(flip, src, dst)
    dead = rng.random(num_nodes) < dangling
    keep = ~dead[src]
    return torch.from_numpy(np.stack([src[keep], dst[keep]]))


def chung_lu_edges(
    num_nodes: int,
    num_edges: int,
    *,
    gamma: float = 2.5,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> Tensor:
    """Chung–Lu graph: both endpoints of each of ``num_edges`` edges drawn with probability
    proportional to the expected degree ``w_i = (i + i0)^(-1 / (gamma - 1))``; node ids are then
    shuffled so hubs are spread over the index range. Built on ``device``, chunked.
    """
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    i = torch.arange(num_nodes, device=device, dtype=torch.float64)
    w = (i + 10.0) ** (-1.0 / (gamma - 1.0))
    cdf = torch.cumsum(w, 0)
    cdf /= cdf[-1].clone()
    perm = torch.randperm(num_nodes, generator=gen, device=device)
    out = torch.empty(2, num_edges, dtype=torch.int64, device=device)
    chunk = 1 << 24
    for start in range(0, num_edges, chunk):
        stop = min(start + chunk, num_edges)
        u = torch.rand(2, stop - start, generator=gen, device=device, dtype=torch.float64)
        idx = torch.searchsorted(cdf, u).clamp_(max=num_nodes - 1)
        out[:, start:stop] = perm[idx]
    return out


# ------------------------------------------------------------------------------------------
# memory graphs with dynamic weights
# ------------------------------------------------------------------------------------------
def memory_graph(edge_index: Tensor, num_nodes: int, *, seed: int = 0) -> MemoryGraph:
    """A snapshot over ``edge_index`` with seeded random Sem / Situation links and note types
    (no Procedure notes), intensities in [0.1, 1] and confidences in [0, 1], on its device."""
    device = edge_index.device
    gen = torch.Generator().manual_seed(seed)
    e = edge_index.shape[1]
    kind = _EDGE_KINDS[torch.randint(0, 3, (e,), generator=gen)]
    node_type = _NODE_KINDS[torch.randint(0, 3, (num_nodes,), generator=gen)]
    intensity = 0.1 + 0.9 * torch.rand(e, generator=gen, dtype=torch.float64)
    confidence = torch.rand(e, generator=gen)
    return MemoryGraph.from_tensors(
        edge_index,
        num_nodes=num_nodes,
        edge_kind=kind.to(device),
        node_type=node_type.to(device),
        intensity=intensity.to(device),
        confidence=confidence.to(device),
    )


def synthetic_memory_graph(
    num_notes: int,
    tag_emb: Callable[[torch.Generator], Tensor],
    *,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> MemoryGraph:
    """A synthetic agent memory of every note kind (40% Semantic, 35% Specific, 20% Abstract,
    5% Procedure) over a Chung–Lu graph with 5 links per note (links into a Procedure note are
    triggers), intensities in [0.1, 1], confidences and probabilities in [0, 1] and one tag
    vector per note from ``tag_emb(gen)`` (drawn from the same seeded generator, after the
    link kinds), on ``device``; its ids are materialized."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(num_notes, generator=gen)
    node_type = torch.full((num_notes,), NODE_SEMANTIC, dtype=torch.int64)
    node_type[u >= 0.40] = NODE_SPECIFIC
    node_type[u >= 0.75] = NODE_ABSTRACT
    node_type[u >= 0.95] = NODE_PROCEDURE
    edges = chung_lu_edges(num_notes, 5 * num_notes, seed=seed)
    num_edges = edges.shape[1]
    kind = _EDGE_KINDS[torch.randint(0, 3, (num_edges,), generator=gen)]
    kind = torch.where(node_type[edges[1]] == NODE_PROCEDURE, LINK_PROC, kind)
    tag = tag_emb(gen)
    intensity = 0.1 + 0.9 * torch.rand(num_edges, generator=gen, dtype=torch.float64)
    confidence = torch.rand(num_edges, generator=gen)
    prob = torch.rand(num_edges, generator=gen, dtype=torch.float64)
    graph = MemoryGraph.from_tensors(
        edges.to(device),
        num_nodes=num_notes,
        edge_kind=kind.to(device),
        node_type=node_type.to(device),
        intensity=intensity.to(device),
        confidence=confidence.to(device),
        prob=prob.to(device),
        tag_emb=tag.to(device),
    )
    _ = graph.ids  # materialize the ids once (outside any timed call)
    return graph


def original_graph(num_nodes: int) -> MemoryGraph:
    """:func:`original_edges` as a memory graph (random link kinds / intensities, seeded)."""
    return memory_graph(original_edges(num_nodes), num_nodes, seed=num_nodes)


def barabasi_albert_graph(
    num_nodes: int = 100_000, m: int = 11, *, dangling: float = 0.05, seed: int = 0
) -> MemoryGraph:
    """:func:`barabasi_albert_edges` as a memory graph (100k nodes, ~1M edges by default)."""
    return memory_graph(
        barabasi_albert_edges(num_nodes, m, dangling=dangling, seed=seed), num_nodes, seed=seed
    )


def chung_lu_graph(
    num_nodes: int, num_edges: int, *, seed: int = 0, device: torch.device | str = "cpu"
) -> MemoryGraph:
    """:func:`chung_lu_edges` as a memory graph, built on ``device``."""
    edges = chung_lu_edges(num_nodes, num_edges, seed=seed, device=device)
    return memory_graph(edges, num_nodes, seed=seed)


def graph_weights(graph: MemoryGraph) -> Tensor:
    """The graph's dynamic edge weights with the default preference (Situation) and factors."""
    return dynamic_edge_weight(
        graph.edge_index,
        graph.edge_kind,
        graph.intensity,
        graph.confidence,
        graph.node_type,
        preference=PREFERENCE_SITUATION,
    )


# ------------------------------------------------------------------------------------------
# queries
# ------------------------------------------------------------------------------------------
def seed_batch(
    num_nodes: int, batch: int, *, keys: int = 4, seed: int = 0, device: torch.device | str = "cpu"
) -> tuple[Tensor, Tensor]:
    """``batch`` queries of ``keys`` distinct random nodes with equal weights.

    Returns:
        ``(index (B, keys) int64, personalization (N, B) float64)``; columns sum to 1.
    """
    gen = torch.Generator().manual_seed(1_000_003 * seed + batch)
    keys = min(keys, num_nodes)
    # distinct keys per query: the first `keys` of a random score ordering (cheap for any N)
    if num_nodes <= 4096:
        index = torch.rand(batch, num_nodes, generator=gen).argsort(dim=1)[:, :keys]
    else:
        index = torch.randint(0, num_nodes, (batch, 4 * keys), generator=gen)
        index = torch.stack([torch.unique(row, sorted=False)[:keys] for row in index])
    p = torch.zeros(num_nodes, batch, dtype=torch.float64, device=device)
    cols = torch.arange(batch).unsqueeze(1).expand_as(index)
    p[index.reshape(-1).to(device), cols.reshape(-1).to(device)] = 1.0 / keys
    return index, p


# ------------------------------------------------------------------------------------------
# reference solver (independent of soulmem_torch.functional.ppr)
# ------------------------------------------------------------------------------------------
def _column_stochastic(edge_index: Tensor, edge_weight: Tensor, num_nodes: int):
    """Column-stochastic ``P^T`` (scipy CSR, float64) and the dangling mask (no out-edge)."""
    import scipy.sparse as sp

    src = edge_index[0].cpu().numpy()
    dst = edge_index[1].cpu().numpy()
    w = edge_weight.cpu().to(torch.float64).numpy()
    out = np.bincount(src, weights=w, minlength=num_nodes)
    deg = np.bincount(src, minlength=num_nodes)
    vals = np.divide(w, out[src], out=np.zeros_like(w), where=out[src] != 0)
    pt = sp.csr_matrix((vals, (dst, src)), shape=(num_nodes, num_nodes))  # sums duplicates
    return pt, deg == 0


def reference_ppr(
    edge_index: Tensor,
    edge_weight: Tensor,
    personalization: Tensor,
    *,
    num_nodes: int,
    damping: float = DAMPING,
) -> Tensor:
    """Exact weighted PPR of each column of ``personalization`` (N, B), float64, CPU.

    Same problem as the library: row-normalized weights (a zero-total row loses its mass), a
    dangling node sends ``d * r`` evenly to the query's keys (its nonzero entries), restart
    ``1 - d``, result normalized. Direct solve for ``N <= SPSOLVE_MAX_NODES``, else
    :func:`reference_power` to ``1e-13``.
    """
    if num_nodes > SPSOLVE_MAX_NODES:
        return reference_power(
            edge_index, edge_weight, personalization, num_nodes=num_nodes, damping=damping
        )
    import scipy.sparse as sp
    from scipy.sparse.linalg import splu

    pt, dangling = _column_stochastic(edge_index, edge_weight, num_nodes)
    p = personalization.cpu().to(torch.float64).numpy()
    s = p / p.sum(0, keepdims=True)
    eye = sp.identity(num_nodes, format="csc")
    lu = splu((eye - damping * pt).tocsc())
    dang = np.flatnonzero(dangling)
    out = np.empty_like(s)
    for j in range(s.shape[1]):
        # M_s = P^T + u delta^T (u = keys / n_src): Sherman–Morrison on (I - d P^T).
        y = lu.solve((1.0 - damping) * s[:, j])
        keys = s[:, j] != 0
        u = keys / keys.sum()
        if dang.size:
            z = lu.solve(u)
            y = y + damping * z * y[dang].sum() / (1.0 - damping * z[dang].sum())
        out[:, j] = y / y.sum()
    return torch.from_numpy(out)


def reference_power(
    edge_index: Tensor,
    edge_weight: Tensor,
    personalization: Tensor,
    *,
    num_nodes: int,
    damping: float = DAMPING,
    tol: float = 1e-13,
) -> Tensor:
    """The same PPR by float64 power iteration, run until the missing mass ``d^(K+1) <= tol``.

    Torch, on ``personalization``'s device (so it also serves the 10M-node CUDA graphs); its own
    CSR build (coalesced COO), not the library's operator.
    """
    device = personalization.device
    src = edge_index[0].to(device)
    dst = edge_index[1].to(device)
    w = edge_weight.to(device=device, dtype=torch.float64)
    out = torch.zeros(num_nodes, dtype=torch.float64, device=device).index_add_(0, src, w)
    deg = torch.bincount(src, minlength=num_nodes)
    vals = torch.where(out[src] != 0, w / torch.where(out[src] != 0, out[src], 1.0), 0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "sparse ... beta" / invariant notes
        pt = torch.sparse_coo_tensor(torch.stack([dst, src]), vals, (num_nodes, num_nodes))
        pt = pt.coalesce().to_sparse_csr()
    s = personalization.to(torch.float64)
    s = s / s.sum(0, keepdim=True)
    keys = (s != 0).to(torch.float64)
    u = keys / keys.sum(0, keepdim=True)
    dang = (deg == 0).nonzero().reshape(-1)
    steps = math.ceil(math.log(tol) / math.log(damping)) if damping > 0 else 0
    x = (1.0 - damping) * s
    for _ in range(steps):
        nxt = (1.0 - damping) * s + damping * (pt @ x)
        if dang.numel():
            nxt += damping * u * x.index_select(0, dang).sum(0, keepdim=True)
        x = nxt
    return x / x.sum(0, keepdim=True)


# ------------------------------------------------------------------------------------------
# accuracy
# ------------------------------------------------------------------------------------------
def l1_error(x: Tensor, ref: Tensor) -> Tensor:
    """Per-column L1 distance ``sum |x - ref|`` over the columns both (N, B) results have."""
    ref = ref.to("cpu", torch.float64).reshape(ref.shape[0], -1)
    x = x.detach().to("cpu", torch.float64).reshape(ref.shape[0], -1)
    cols = min(x.shape[1], ref.shape[1])
    return (x[:, :cols] - ref[:, :cols]).abs().sum(0)


def topk_overlap(x: Tensor, ref: Tensor, k: int = 20) -> Tensor:
    """Per column, ``|top-k(x) ∩ top-k(ref)| / k`` with ``k = min(k, #nonzero ref entries)``.

    Capping ``k`` at the reference's support keeps ties among exact zeros (nodes the walk never
    reaches, where any order is right) from counting as misses.
    """
    ref = ref.to("cpu", torch.float64).reshape(ref.shape[0], -1)
    x = x.detach().to("cpu", torch.float64).reshape(ref.shape[0], -1)
    cols = min(x.shape[1], ref.shape[1])
    x, ref = x[:, :cols], ref[:, :cols]
    out = []
    for j in range(ref.shape[1]):
        kj = max(1, min(k, int((ref[:, j] > 1e-14).sum())))
        a = set(torch.topk(x[:, j], kj).indices.tolist())
        b = set(torch.topk(ref[:, j], kj).indices.tolist())
        out.append(len(a & b) / kj)
    return torch.tensor(out, dtype=torch.float64)


# ------------------------------------------------------------------------------------------
# a benchmark case: graph + weights + queries + reference, built once
# ------------------------------------------------------------------------------------------
@dataclass
class PprCase:
    """One PPR problem: a graph, its dynamic weights, a query batch and its reference."""

    name: str
    graph: MemoryGraph
    edge_weight: Tensor  # (E,) float64, on the graph's device
    index: Tensor  # (B, keys) int64, CPU
    personalization: Tensor  # (N, B) float64, on the graph's device
    reference: Tensor  # (N, min(B, ref_cols)) float64, CPU
    damping: float = DAMPING

    @property
    def num_nodes(self) -> int:
        return int(self.graph.num_nodes)

    @property
    def num_edges(self) -> int:
        return int(self.graph.edge_index.shape[1])

    @property
    def batch(self) -> int:
        return int(self.personalization.shape[1])

    def error(self, result: Tensor) -> dict[str, float]:
        """Max / mean L1 error and mean top-20 overlap of ``result`` (N, B) vs the reference."""
        err = l1_error(result, self.reference)
        ov = topk_overlap(result, self.reference)
        return {
            "l1_max": float(err.max()),
            "l1_mean": float(err.mean()),
            "top20": float(ov.mean()),
        }


def make_case(
    name: str,
    graph: MemoryGraph,
    batch: int,
    *,
    keys: int = 4,
    ref_cols: int = 16,
    seed: int = 0,
    edge_weight: Tensor | None = None,
) -> PprCase:
    """Queries and the reference for ``graph`` (the reference covers the first ``ref_cols``
    columns; queries are independent, so that is an unbiased sample of the batch)."""
    device = graph.edge_index.device
    w = graph_weights(graph) if edge_weight is None else edge_weight
    index, p = seed_batch(int(graph.num_nodes), batch, keys=keys, seed=seed, device=device)
    cols = min(batch, ref_cols)
    if device.type == "cpu":
        ref = reference_ppr(graph.edge_index, w, p[:, :cols], num_nodes=int(graph.num_nodes))
    else:
        ref = reference_power(
            graph.edge_index, w, p[:, :cols], num_nodes=int(graph.num_nodes)
        ).cpu()
    return PprCase(name, graph, w, index, p, ref)
