"""Peer implementations, each handed the same problem as soulmem_torch (benchmark-only deps).

Every PPR adapter solves ``x = (1 - d) s + d M_s x`` (normalized), with the library's weights
and conventions, mapped onto the peer's parameters:

================  ==========================================  ===================================
peer              call                                        mapping / mismatch
================  ==========================================  ===================================
torch CSR loop    ``K x addmm(P^T, X)`` (and ``sparse.mm``)   the bare sparse product, no
                                                              dangling rule, no normalization
scipy             ``P^T @ X`` power iteration, float64        same algorithm, same K, dangling
                                                              rule included: same problem
igraph            ``Graph.personalized_pagerank(prpack)``     ``damping`` = continue probability
                  (what HippoRAG calls)                       (same); ``reset_vertices`` = keys
                                                              (equal weights); dangling mass
                                                              follows the reset distribution =
                                                              keys evenly: same problem
networkx          ``pagerank(alpha=d, personalization,        ``alpha`` = continue probability;
                  weight, tol)``                              dangling follows personalization:
                                                              same problem; ``tol`` calibrated
PyG               ``utils.get_ppr(alpha=1 - d, eps)``         **unweighted**, one seed per call
                                                              (multi-key queries averaged), a
                                                              dangling node keeps its mass: a
                                                              different problem -- its error is
                                                              reported against the weighted
                                                              reference *and* against the exact
                                                              solution of its own problem
faiss             ``IndexFlatIP.search`` on L2-normalized     exact inner-product top-k: same
                  float32 vectors                             problem (float32 only)
================  ==========================================  ===================================

Parallel edges are merged (weights summed) before a peer sees the graph: the same Markov chain,
and what scipy / networkx do internally anyway. Graph conversion happens outside the timed call;
each peer's per-call work (e.g. networkx's graph-to-matrix conversion) stays inside it, since
that is what a user of that library pays per query.

Each adapter is ``prepare(case) -> state`` (untimed) and ``run(state, knob) -> (N, B) float64``.
A missing peer raises ``ImportError`` from ``prepare``; benchmarks turn that into a skip.
"""

from __future__ import annotations

import importlib.util
import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "PEERS",
    "available",
    "coalesced_edges",
    "faiss_topk",
    "igraph_prepare",
    "igraph_run",
    "networkx_prepare",
    "networkx_run",
    "pyg_own_reference",
    "pyg_prepare",
    "pyg_run",
    "scipy_prepare",
    "scipy_run",
    "torch_csr_prepare",
    "torch_csr_run",
]

PEERS = {
    "scipy": "scipy",
    "igraph": "igraph",
    "networkx": "networkx",
    "pyg": "numba",  # torch_geometric.utils.get_ppr needs numba
    "faiss": "faiss",
}


def available(peer: str) -> bool:
    """Whether the peer's package is importable."""
    return importlib.util.find_spec(PEERS[peer]) is not None


def coalesced_edges(edge_index: Tensor, edge_weight: Tensor, num_nodes: int):
    """``(src, dst, w)`` numpy arrays with parallel edges merged (weights summed), sorted."""
    src = edge_index[0].cpu().numpy().astype(np.int64)
    dst = edge_index[1].cpu().numpy().astype(np.int64)
    key = src * max(num_nodes, 1) + dst
    uniq, inv = np.unique(key, return_inverse=True)
    w = np.bincount(inv, weights=edge_weight.cpu().to(torch.float64).numpy())
    return uniq // max(num_nodes, 1), uniq % max(num_nodes, 1), w


def _keys(personalization: Tensor) -> list[np.ndarray]:
    p = personalization.cpu().numpy()
    return [np.flatnonzero(p[:, j]) for j in range(p.shape[1])]


# ------------------------------------------------------------------------------------------
# bare torch CSR product loop (the floor the library's power iteration is held to)
# ------------------------------------------------------------------------------------------
@dataclass
class _TorchCsr:
    a: Tensor  # sparse CSR (N, N) = P^T (the library operator's transpose: same bytes)
    x0: Tensor  # (N, B)
    bufs: list[Tensor]


def torch_csr_prepare(
    operator: Any, personalization: Tensor, *, dtype: torch.dtype = torch.float64
) -> _TorchCsr:
    """The library operator's ``P^T`` (int32 CSR; float64, or cast to ``dtype``) and two
    output buffers."""
    a = operator.transpose
    if dtype != a.dtype:
        a = torch.sparse_csr_tensor(
            a.crow_indices(), a.col_indices(), a.values().to(dtype), a.shape
        )
    x0 = personalization.to(operator.device, dtype).contiguous()
    return _TorchCsr(a, x0, [torch.empty_like(x0), torch.empty_like(x0)])


def torch_csr_run(state: _TorchCsr, steps: int, *, how: str = "addmm") -> Tensor:
    """``steps`` products ``X <- P^T X`` and nothing else.

    ``how="addmm"``: ``torch.addmm(x0, A, X, out=buf)`` into preallocated buffers (the fastest
    torch entry point for CSR x dense on CPU); ``how="spmm"``: ``torch.sparse.mm(A, X)``.
    """
    x = state.x0
    for k in range(steps):
        if how == "addmm":
            x = torch.addmm(state.x0, state.a, x, alpha=0.65, out=state.bufs[k % 2])
        else:
            x = torch.sparse.mm(state.a, x)
    return x


# ------------------------------------------------------------------------------------------
# scipy sparse power iteration (same algorithm, same dangling rule)
# ------------------------------------------------------------------------------------------
@dataclass
class _Scipy:
    pt: Any  # scipy CSR P^T
    s: np.ndarray  # (N, B)
    u: np.ndarray  # (N, B) keys / n_src
    dangling: np.ndarray
    damping: float


def scipy_prepare(case: Any) -> _Scipy:
    import scipy.sparse as sp

    n = case.num_nodes
    src, dst, w = coalesced_edges(case.graph.edge_index, case.edge_weight, n)
    out = np.bincount(src, weights=w, minlength=n)
    vals = np.divide(w, out[src], out=np.zeros_like(w), where=out[src] != 0)
    pt = sp.csr_matrix((vals, (dst, src)), shape=(n, n))
    pt.indices = pt.indices.astype(np.int32)
    pt.indptr = pt.indptr.astype(np.int32)
    deg = np.bincount(src, minlength=n)
    s = case.personalization.cpu().numpy()
    s = s / s.sum(0, keepdims=True)
    keys = (s != 0).astype(np.float64)
    return _Scipy(pt, s, keys / keys.sum(0, keepdims=True), np.flatnonzero(deg == 0), case.damping)


def scipy_run(state: _Scipy, steps: int) -> Tensor:
    d = state.damping
    restart = (1.0 - d) * state.s
    x = restart
    for _ in range(steps):
        nxt = state.pt @ x
        nxt *= d
        nxt += restart
        if state.dangling.size:
            nxt += (d * x[state.dangling].sum(0, keepdims=True)) * state.u
        x = nxt
    return torch.from_numpy(x / x.sum(0, keepdims=True))


# ------------------------------------------------------------------------------------------
# igraph (PRPACK), as HippoRAG calls it
# ------------------------------------------------------------------------------------------
@dataclass
class _Igraph:
    graph: Any
    keys: list[np.ndarray]
    damping: float
    num_nodes: int


def igraph_prepare(case: Any) -> _Igraph:
    import igraph as ig

    n = case.num_nodes
    src, dst, w = coalesced_edges(case.graph.edge_index, case.edge_weight, n)
    g = ig.Graph(n=n, edges=np.stack([src, dst], 1).tolist(), directed=True)
    g.es["weight"] = w.tolist()
    return _Igraph(g, _keys(case.personalization), case.damping, n)


def igraph_run(state: _Igraph, knob: Any = None) -> Tensor:
    out = np.empty((state.num_nodes, len(state.keys)))
    for j, keys in enumerate(state.keys):
        out[:, j] = state.graph.personalized_pagerank(
            directed=True,
            damping=state.damping,
            reset_vertices=keys.tolist(),
            weights="weight",
            implementation="prpack",
        )
    return torch.from_numpy(out / out.sum(0, keepdims=True))


# ------------------------------------------------------------------------------------------
# networkx
# ------------------------------------------------------------------------------------------
@dataclass
class _Networkx:
    graph: Any
    keys: list[np.ndarray]
    damping: float
    num_nodes: int


def networkx_prepare(case: Any) -> _Networkx:
    import networkx as nx

    n = case.num_nodes
    src, dst, w = coalesced_edges(case.graph.edge_index, case.edge_weight, n)
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    g.add_weighted_edges_from(zip(src.tolist(), dst.tolist(), w.tolist()))
    return _Networkx(g, _keys(case.personalization), case.damping, n)


def networkx_run(state: _Networkx, tol: float) -> Tensor:
    """``nx.pagerank`` per query; ``tol`` is networkx's (stop when ``L1 step < N * tol``)."""
    import networkx as nx

    out = np.zeros((state.num_nodes, len(state.keys)))
    for j, keys in enumerate(state.keys):
        pers = {int(k): 1.0 for k in keys}
        r = nx.pagerank(
            state.graph, alpha=state.damping, personalization=pers, weight="weight",
            tol=tol, max_iter=10_000,
        )  # fmt: skip
        out[list(r.keys()), j] = list(r.values())
    return torch.from_numpy(out / out.sum(0, keepdims=True))


# ------------------------------------------------------------------------------------------
# PyG get_ppr (unweighted, single-seed push, numba)
# ------------------------------------------------------------------------------------------
@dataclass
class _Pyg:
    edge_index: Tensor
    index: Tensor  # (B, keys)
    damping: float
    num_nodes: int


def pyg_prepare(case: Any) -> _Pyg:
    if not available("pyg"):
        raise ImportError("torch_geometric.utils.get_ppr needs numba")
    import numba
    from torch_geometric.utils import get_ppr

    numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))
    ei = case.graph.edge_index.cpu()
    # numba JIT, untimed (the target-array signature the runs use)
    get_ppr(ei[:, :1], alpha=1 - case.damping, eps=1e-2, target=ei[0, :1], num_nodes=case.num_nodes)
    return _Pyg(ei, case.index, case.damping, case.num_nodes)


def pyg_run(state: _Pyg, eps: float) -> Tensor:
    """``get_ppr`` for every key of the batch at once; a query = mean of its keys' vectors."""
    from torch_geometric.utils import get_ppr

    targets = torch.unique(state.index.reshape(-1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ei, val = get_ppr(
            state.edge_index, alpha=1.0 - state.damping, eps=eps, target=targets,
            num_nodes=state.num_nodes,
        )  # fmt: skip
    # rows of (target, node) -> dense (num_targets, N) via the target's position
    pos = torch.searchsorted(targets, ei[0])
    dense = torch.zeros(targets.numel(), state.num_nodes, dtype=torch.float64)
    dense.index_put_((pos, ei[1]), val.to(torch.float64), accumulate=True)
    sel = torch.searchsorted(targets, state.index.contiguous())  # (B, keys)
    x = dense[sel].mean(1).T.contiguous()  # (N, B)
    return x / x.sum(0, keepdim=True).clamp_min(1e-300)


def pyg_own_reference(case: Any, columns: int) -> Tensor:
    """Exact solution of the problem get_ppr solves (unweighted; a dangling node reserves its
    ``(1 - d)`` share and the rest is lost; a multi-key query = the mean of its keys' vectors),
    normalized, for the first ``columns`` queries: ``(1 - d) sum_k d^k (P^T)^k s``."""
    n = case.num_nodes
    ei = case.graph.edge_index.cpu()
    src, dst = ei[0], ei[1]
    deg = torch.bincount(src, minlength=n).to(torch.float64)
    vals = 1.0 / deg[src]
    d = case.damping
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        pt = torch.sparse_coo_tensor(torch.stack([dst, src]), vals, (n, n)).coalesce()
        pt = pt.to_sparse_csr()
    s = case.personalization[:, :columns].cpu().to(torch.float64)
    s = s / s.sum(0, keepdim=True)
    x = (1.0 - d) * s
    acc = x.clone()
    for _ in range(math.ceil(math.log(1e-13) / math.log(d))):
        x = d * (pt @ x)  # dangling columns of P^T are empty: their walk mass is lost
        acc += x
    return acc / acc.sum(0, keepdim=True)


# ------------------------------------------------------------------------------------------
# faiss exact inner-product top-k
# ------------------------------------------------------------------------------------------
def faiss_topk(bank_unit: np.ndarray, k: int):
    """An ``IndexFlatIP`` over L2-normalized float32 rows; returns ``search(q_unit) -> (D, I)``."""
    import faiss

    index = faiss.IndexFlatIP(bank_unit.shape[1])
    index.add(np.ascontiguousarray(bank_unit, dtype=np.float32))

    def search(queries_unit: np.ndarray):
        return index.search(np.ascontiguousarray(queries_unit, dtype=np.float32), k)

    return search
