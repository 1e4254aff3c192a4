"""Personalized PageRank kernels (SPEC §6).

Conventions used by every function here:

* ``damping`` is the probability of **continuing** the walk (the original's
  ``damping_factor``); the restart probability is ``1 - damping``. This is *not* PyG's
  ``alpha`` (which is the teleport probability). ``0 <= damping < 1`` is required: with
  ``damping = 1`` no mass ever settles and the walk never converges, so it is rejected.
* The transition matrix ``P`` is **row-stochastic by source**: row ``u`` holds ``u``'s
  out-edge weights divided by their sum (a row whose weights sum to 0, e.g. all targets are
  Procedure notes, stays zero and its mass is lost). A *dangling* node (no out-edge at all)
  instead sends its mass evenly to the personalization **keys** of the query, zero-weight
  keys included (``damping * r / n_src`` each). The exact PPR vector of a query ``s`` is
  ``x = (1 - d) * (I - d * P_s^T)^-1 s`` where ``P_s`` is ``P`` with that dangling rule
  folded in; results are ``x / sum(x)``.
* Personalization for the batched forms is a dense ``(N, B)`` matrix, one column per query,
  non-negative, each column with a positive sum (normalized inside). A node is a *key* of a
  query when its entry is nonzero **or** ``key_mask`` marks it (so zero-weight keys, which
  matter for the dangling rule, are expressible). A 1-D ``(N,)`` personalization is one query
  and gives a 1-D result.

Functions:

* :func:`ppr_sequential_push` -- the original's forward push (``weighted_ppr_fp``), exactly,
  in plain Python on the CPU: the parity oracle.
* :func:`build_transition` -> :class:`TransitionOperator` -- the per-graph prepared operator
  (normalized weights folded into CSR values once); cache it per graph version + preference.
* :func:`ppr_forward_push` -- batched, vectorized forward push over ``(N, B)`` residues.
* :func:`ppr_power_iteration` -- batched weighted power iteration to a certified L1 tolerance.
* :func:`ppr_naive` -- the original's unweighted ``naive_ppr``.
"""

from __future__ import annotations

import heapq
import math
import warnings
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from soulmem_torch.errors import ValidationError
from soulmem_torch.functional.edge_weights import _check_edge_index

__all__ = [
    "PushStats",
    "TransitionOperator",
    "build_transition",
    "power_iteration_steps",
    "ppr_forward_push",
    "ppr_naive",
    "ppr_power_iteration",
    "ppr_sequential_push",
]

_F64 = torch.float64
_LOCAL_MIN_NODES = 512  # below this the reachability scan costs more than it can save


class PushStats(NamedTuple):
    """What a forward push did, and the a-posteriori error certificate of its result.

    Each field is a tensor of shape ``(B,)`` (or ``()`` for a single query) except
    ``iterations`` and ``converged``.

    With ``x`` the exact PPR vector (module docstring) and ``reserve`` the unnormalized push
    result, ``0 <= x - reserve`` elementwise and ``sum(x - reserve) <= residue_mass +
    dropped_mass``; hence the returned (normalized) vector ``reserve / sum(reserve)`` is within
    ``error_bound = 2 * (residue_mass + dropped_mass) / reserve_mass`` of ``x / sum(x)`` in L1.
    """

    iterations: int
    """Pushes performed (sequential) or rounds performed (batched)."""
    converged: bool
    """False when the iteration / round cap stopped the push first (the bound still holds)."""
    reserve_mass: Tensor
    """Sum of the unnormalized result."""
    residue_mass: Tensor
    """Residue left when the push stopped (every entry <= threshold when converged)."""
    dropped_mass: Tensor
    """``damping * r`` mass discarded by the drop rules."""
    error_bound: Tensor
    """L1 bound on the normalized result's error (``inf`` when nothing was reserved)."""


def _make_stats(
    iterations: int, converged: bool, reserve: Tensor, residue: Tensor, dropped: Tensor
) -> PushStats:
    bound = torch.where(
        reserve > 0,
        2.0 * (residue + dropped) / torch.where(reserve > 0, reserve, 1.0),
        torch.full_like(reserve, math.inf),
    )
    return PushStats(iterations, converged, reserve, residue, dropped, bound)


# ------------------------------------------------------------------------------------------
# Validation (at the boundary; the loops below assume valid inputs)
# ------------------------------------------------------------------------------------------


def _check_damping(damping: float) -> float:
    try:
        d = float(damping)
    except (TypeError, ValueError):
        raise ValidationError(
            f"damping: expected a float in [0, 1) (continue probability), found {damping!r}"
        ) from None
    if not (0.0 <= d < 1.0):  # also rejects NaN
        raise ValidationError(
            "damping: expected a float in [0, 1) (the continue probability; 1 never "
            f"converges), found {damping!r}"
        )
    return d


def _check_positive(name: str, value: float) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValidationError(f"{name}: expected a finite float > 0, found {value!r}") from None
    if not (math.isfinite(v) and v > 0.0):
        raise ValidationError(f"{name}: expected a finite float > 0, found {value!r}")
    return v


def _check_count(name: str, value: int | None, *, minimum: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValidationError(f"{name}: expected an int >= {minimum}, found {value!r}")
    return value


def _check_num_nodes(num_nodes: int) -> int:
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 0:
        raise ValidationError(f"num_nodes: expected an int >= 0, found {num_nodes!r}")
    return num_nodes


def _check_edge_weight(edge_weight: Tensor, num_edges: int) -> None:
    if not isinstance(edge_weight, Tensor):
        raise ValidationError(f"edge_weight: expected a tensor, found {type(edge_weight).__name__}")
    if edge_weight.shape != (num_edges,):
        raise ValidationError(
            f"edge_weight: expected shape ({num_edges},), found {tuple(edge_weight.shape)}"
        )
    if not edge_weight.dtype.is_floating_point:
        raise ValidationError(f"edge_weight: expected a float tensor, found {edge_weight.dtype}")
    if num_edges and not bool(torch.isfinite(edge_weight).all()):
        raise ValidationError("edge_weight: expected finite weights, found NaN or inf")


class _Queries(NamedTuple):
    """A validated dense personalization; the derived tensors are computed on demand."""

    p: Tensor  # (N, B) float64, raw weights
    total: Tensor  # (B,) float64, column sums (> 0 when validated)
    extra_keys: Tensor | None  # (N, B) bool, the key_mask
    squeeze: bool  # input was 1-D

    def scaled(self, factor: float = 1.0) -> Tensor:
        """``factor * s`` as a new tensor (``s`` = columns divided by their sums)."""
        safe = torch.where(self.total > 0, self.total, 1.0)
        out = (self.p / safe).contiguous()  # divide first: factor / tiny sum may overflow
        return out if factor == 1.0 else out.mul_(factor)

    def keys(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(flat, cols, n_src)``: every key's flat index ``node * B + column`` in a
        contiguous ``(N, B)`` matrix, its column, and the number of keys per column."""
        keys = self.p != 0
        if self.extra_keys is not None:
            keys |= self.extra_keys
        rows, cols = keys.nonzero(as_tuple=True)
        n_src = torch.bincount(cols, minlength=keys.shape[1]).to(_F64)
        return rows * keys.shape[1] + cols, cols, n_src


def _prepare_personalization(
    personalization: Tensor, key_mask: Tensor | None, num_nodes: int, *, validate: bool = True
) -> _Queries:
    """Validate a dense ``(N,)`` / ``(N, B)`` personalization (and key mask)."""
    if not isinstance(personalization, Tensor):
        raise ValidationError(
            "personalization: expected a tensor of shape (N,) or (N, B), found "
            f"{type(personalization).__name__}"
        )
    if personalization.dim() not in (1, 2) or personalization.shape[0] != num_nodes:
        raise ValidationError(
            f"personalization: expected shape ({num_nodes},) or ({num_nodes}, B), found "
            f"{tuple(personalization.shape)}"
        )
    if personalization.is_complex() or personalization.dtype == torch.bool:
        raise ValidationError(
            f"personalization: expected a real tensor, found {personalization.dtype}"
        )
    squeeze = personalization.dim() == 1
    p = (personalization.unsqueeze(1) if squeeze else personalization).to(_F64)
    extra = None
    if key_mask is not None:
        if not isinstance(key_mask, Tensor) or key_mask.dtype != torch.bool:
            raise ValidationError(
                "key_mask: expected a bool tensor, found "
                f"{key_mask.dtype if isinstance(key_mask, Tensor) else type(key_mask).__name__}"
            )
        if key_mask.shape != personalization.shape:
            raise ValidationError(
                f"key_mask: expected shape {tuple(personalization.shape)} (as personalization), "
                f"found {tuple(key_mask.shape)}"
            )
        extra = (key_mask.unsqueeze(1) if squeeze else key_mask).to(p.device)
    total = _colsum(p)
    if validate and p.numel() > 0:
        # Cheap reductions first (NaN propagates through min, inf through the sums);
        # locate the offending entry only when something is wrong.
        lowest, worst_total = p.min(), total.abs().max()
        if not bool(torch.isfinite(worst_total)):
            bad = ~torch.isfinite(p)
            node, col = (int(v) for v in bad.nonzero()[0])
            raise ValidationError(
                "personalization: expected finite entries, found "
                f"{p[node, col].item()} at node {node} (column {col})"
            )
        if not bool(lowest >= 0):
            neg = p < 0
            node, col = (int(v) for v in neg.nonzero()[0])
            raise ValidationError(
                "personalization: expected entries >= 0, found "
                f"{p[node, col].item()} at node {node} (column {col})"
            )
    if validate and p.shape[1] > 0 and num_nodes > 0:
        nonpos = total <= 0
        if bool(nonpos.any()):
            col = int(nonpos.nonzero()[0, 0])
            raise ValidationError(
                "personalization: expected every column to have a positive sum, found sum "
                f"{total[col].item()} in column {col}"
            )
    return _Queries(p, total, extra, squeeze)


# ------------------------------------------------------------------------------------------
# Sequential forward push: the parity oracle (SPEC §6.1)
# ------------------------------------------------------------------------------------------


def ppr_sequential_push(
    edge_index: Tensor,
    edge_weight: Tensor,
    personalization_index: Tensor,
    personalization_weight: Tensor,
    *,
    num_nodes: int,
    damping: float = 0.65,
    threshold: float = 1e-5,
    max_iterations: int | None = None,
    return_stats: bool = False,
) -> Tensor | tuple[Tensor, PushStats]:
    """The original's weighted forward push (``weighted_ppr_fp``), operation for operation.

    This is the parity oracle: a plain-Python loop on the CPU, float64, reproducing the
    original's float operation order (SPEC §6.1):

    1. ``residue = personalization / sum`` (divided only when the sum is not exactly 1),
       ``reserve = 0``; ``n_src`` = number of keys (zero-weight keys count).
    2. Repeatedly take the node ``u`` with the largest residue ``r`` (ties: the highest node
       index); stop when ``r <= threshold`` or after ``max_iterations`` pushes.
       ``residue[u] = 0``; ``reserve[u] += (1 - damping) * r``. If ``u`` has out-edges, its
       weights are taken **newest first** (reverse of their order in ``edge_index``), summed in
       that order and divided by the sum when it is not 0; if ``r * max(w) > threshold`` every
       out-edge adds ``(damping * w) * r`` to its target's residue (newest edge first), else
       that mass is dropped. If ``u`` has no out-edge and ``r / n_src > threshold``, every key
       gets ``(damping * r) / n_src``, else it is dropped.
    3. ``reserve / sum(reserve)``, summed in node order.

    A binary heap with lazy deletion gives the arg-max in ``O(log N)``.

    Args:
        edge_index: shape (2, E), integer. Edges; within one source, their order in this
            tensor is the link insertion order (oldest first), as in the graph snapshot.
        edge_weight: shape (E,), float. Raw (unnormalized) edge weights, e.g.
            :func:`~soulmem_torch.functional.edge_weights.dynamic_edge_weight`; finite.
        personalization_index: shape (K,), integer, distinct, in ``[0, N)``. The keys.
        personalization_weight: shape (K,), float, finite, >= 0, positive sum. Key weights
            (zero weights allowed: such keys still receive dangling mass).
        num_nodes: >= 0. ``N``.
        damping: in [0, 1). Continue probability (default 0.65).
        threshold: finite, > 0. Residue threshold (default 1e-5).
        max_iterations: >= 0 or None. Push cap; ``None`` is ``max(N, 1) * 1024``.
        return_stats: also return the :class:`PushStats` certificate.

    Returns:
        shape (N,), float64, CPU: the normalized PPR of every node (zeros included); an empty
        tensor (shape (0,)) when nothing was reserved (e.g. every key weight <= threshold).
        For ``N = 0`` (an empty graph, where no key can exist) an empty tensor, without
        checking the personalization sum. With ``return_stats``: ``(ppr, stats)``.

    Raises:
        ValidationError: bad damping / threshold / shapes, out-of-range or duplicate keys,
            negative / NaN weights, non-positive personalization sum.
    """
    d = _check_damping(damping)
    thr = _check_positive("threshold", threshold)
    n = _check_num_nodes(num_nodes)
    max_iterations = _check_count("max_iterations", max_iterations, minimum=0)
    _check_edge_index(edge_index, n)
    _check_edge_weight(edge_weight, edge_index.shape[1])
    if not isinstance(personalization_index, Tensor) or personalization_index.dim() != 1:
        raise ValidationError("personalization_index: expected an integer tensor of shape (K,)")
    if personalization_index.dtype.is_floating_point or personalization_index.dtype == torch.bool:
        raise ValidationError(
            f"personalization_index: expected an integer tensor, found {personalization_index.dtype}"
        )
    keys: list[int] = personalization_index.tolist()
    if not isinstance(personalization_weight, Tensor) or personalization_weight.shape != (
        len(keys),
    ):
        raise ValidationError(
            f"personalization_weight: expected a tensor of shape ({len(keys)},) (one per key)"
        )
    bias: list[float] = personalization_weight.to(_F64).tolist()
    for k in keys:
        if not 0 <= k < n:
            raise ValidationError(
                f"personalization_index: expected node indices in [0, {n}), found {k}"
            )
    if len(set(keys)) != len(keys):
        seen: set[int] = set()
        dup = next(k for k in keys if k in seen or seen.add(k))
        raise ValidationError(f"personalization_index: expected distinct keys, found {dup} twice")
    for k, b in zip(keys, bias):
        if not math.isfinite(b) or b < 0:
            raise ValidationError(
                f"personalization_weight: expected finite weights >= 0, found {b} for node {k}"
            )

    empty = torch.zeros(0, dtype=_F64)
    if n == 0:
        zero = torch.zeros((), dtype=_F64)
        stats = _make_stats(0, True, zero, zero.clone(), zero.clone())
        return (empty, stats) if return_stats else empty

    psum = 0.0
    for b in bias:
        psum += b
    if not psum > 0:
        raise ValidationError(
            f"personalization_weight: expected a positive sum, found {psum} ({len(keys)} keys)"
        )
    if psum != 1.0:
        bias = [b / psum for b in bias]
    n_src = float(len(keys))
    cap = max(n, 1) * 1024 if max_iterations is None else max_iterations

    # Out-edges per source, in order of appearance (= link insertion order).
    src_l: list[int] = edge_index[0].tolist()
    dst_l: list[int] = edge_index[1].tolist()
    w_l: list[float] = edge_weight.to(_F64).tolist()
    out_t: list[list[int]] = [[] for _ in range(n)]
    out_w: list[list[float]] = [[] for _ in range(n)]
    for s_, t_, w_ in zip(src_l, dst_l, w_l):
        out_t[s_].append(t_)
        out_w[s_].append(w_)
    cache: dict[int, tuple[list[int], list[float], float]] = {}

    residue = [0.0] * n
    reserve = [0.0] * n
    for k, b in zip(keys, bias):
        residue[k] = b
    heap = [(-residue[k], -k) for k in keys if residue[k] > 0.0]
    heapq.heapify(heap)
    keep = 1.0 - d
    pushes = 0
    dropped = 0.0
    converged = True

    while heap:
        neg_r, neg_u = heapq.heappop(heap)
        r, u = -neg_r, -neg_u
        if r <= thr:
            break
        if r != residue[u]:  # stale heap entry: u changed since this entry was pushed
            continue
        if pushes >= cap:
            converged = False
            break
        pushes += 1
        entry = cache.get(u)
        if entry is None:
            # Newest first, as the original's graph library yields them.
            targets = out_t[u][::-1]
            weights = out_w[u][::-1]
            total = 0.0
            for w_ in weights:
                total += w_
            if total != 0.0:
                weights = [w_ / total for w_ in weights]
            entry = (targets, weights, max(weights) if weights else 0.0)
            cache[u] = entry
        targets, weights, max_w = entry
        residue[u] = 0.0
        reserve[u] += keep * r
        if targets:
            if r * max_w > thr:
                for t_, w_ in zip(targets, weights):
                    v = residue[t_] + d * w_ * r
                    residue[t_] = v
                    if v > thr:
                        heapq.heappush(heap, (-v, -t_))
            else:
                dropped += d * r
        elif r / n_src > thr:
            share = d * r / n_src
            for k in keys:
                v = residue[k] + share
                residue[k] = v
                if v > thr:
                    heapq.heappush(heap, (-v, -k))
        else:
            dropped += d * r

    total = 0.0
    for v in reserve:
        total += v
    if return_stats:
        res_mass = 0.0
        for v in residue:
            res_mass += v
        stats = _make_stats(
            pushes,
            converged,
            torch.tensor(total, dtype=_F64),
            torch.tensor(res_mass, dtype=_F64),
            torch.tensor(dropped, dtype=_F64),
        )
    if total == 0.0:
        return (empty, stats) if return_stats else empty
    out = torch.tensor([v / total for v in reserve], dtype=_F64)
    return (out, stats) if return_stats else out


# ------------------------------------------------------------------------------------------
# The prepared operator
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class TransitionOperator:
    """A graph's weighted transition, prepared once for the batched kernels.

    Build it with :func:`build_transition` and cache it per graph version and edge-weight
    parameters (preference, factors); it does not depend on damping, threshold or queries.
    All tensors live on one device; :meth:`to` moves them.

    Attributes:
        num_nodes: ``N``.
        rowptr: shape (N + 1,), int64. CSR row pointer by source.
        col: shape (E,), int64. Edge targets in CSR order (stable: insertion order within a
            source).
        weight: shape (E,), float64. Row-normalized weights ``w / sum_out(w)`` (a row whose
            sum is 0 keeps its zeros), CSR order.
        out_degree: shape (N,), int64. Out-edge count (parallel edges and self loops count).
        max_weight: shape (N,), float64. Largest normalized out-weight (0 when none).
        dangling_index: shape (D,), int64. Nodes without any out-edge.
        transpose: sparse CSR (N, N), float64. ``P^T`` (row = target, column = source),
            parallel edges summed, zero weights left out; the operand of the power iteration.
    """

    num_nodes: int
    rowptr: Tensor
    col: Tensor
    weight: Tensor
    out_degree: Tensor
    max_weight: Tensor
    dangling_index: Tensor
    transpose: Tensor

    @property
    def device(self) -> torch.device:
        """Device of the operator's tensors."""
        return self.col.device

    @property
    def num_edges(self) -> int:
        """``E``, the number of edges (parallel edges counted)."""
        return int(self.col.shape[0])

    def to(self, device: torch.device | str) -> TransitionOperator:
        """The same operator on ``device``."""
        return TransitionOperator(
            self.num_nodes,
            self.rowptr.to(device),
            self.col.to(device),
            self.weight.to(device),
            self.out_degree.to(device),
            self.max_weight.to(device),
            self.dangling_index.to(device),
            self.transpose.to(device),
        )


def _sparse_csr(rowptr: Tensor, col: Tensor, values: Tensor, size: tuple[int, int]) -> Tensor:
    """CSR tensor with int32 indices when they fit (smaller, as fast or faster on CPU)."""
    if values.numel() < 2**31 - 1 and size[0] < 2**31 - 1:
        rowptr, col = rowptr.to(torch.int32), col.to(torch.int32)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Ss]parse CSR tensor support is in beta.*")
        return torch.sparse_csr_tensor(rowptr, col, values, size, check_invariants=False)


def build_transition(
    edge_index: Tensor,
    edge_weight: Tensor,
    *,
    num_nodes: int,
    validate: bool = True,
) -> TransitionOperator:
    """Prepare a graph's row-normalized weighted transition for the batched PPR kernels.

    Normalized weights are folded into the CSR values here, once per graph version; the
    iterations never recompute them.

    Args:
        edge_index: shape (2, E), integer. Edges in any order (a stable sort by source is
            applied; within a source the given order is kept).
        edge_weight: shape (E,), float, finite, >= 0. Raw weights, e.g.
            :func:`~soulmem_torch.functional.edge_weights.dynamic_edge_weight`.
        num_nodes: >= 0. ``N``.
        validate: check ranges and weights (one host sync); skip only for trusted inputs.

    Returns:
        The :class:`TransitionOperator`, on ``edge_index``'s device.

    Raises:
        ValidationError: bad shapes, out-of-range nodes, NaN / inf / negative weights.
    """
    n = _check_num_nodes(num_nodes)
    _check_edge_index(edge_index, n if validate else None)
    if validate:
        _check_edge_weight(edge_weight, edge_index.shape[1])
        if edge_weight.numel() and bool((edge_weight < 0).any()):
            raise ValidationError(
                f"edge_weight: expected weights >= 0, found {edge_weight.min().item()}"
            )
    device = edge_index.device
    src = edge_index[0].to(torch.int64)
    dst = edge_index[1].to(torch.int64)
    w = edge_weight.to(device=device, dtype=_F64)
    order = torch.argsort(src, stable=True)
    src, dst, w = src[order], dst[order], w[order]
    rowptr = _rowptr_sorted(src, n)
    out_degree = rowptr[1:] - rowptr[:-1]
    total = w.new_zeros(n).index_add_(0, src, w)
    row_total = total[src]
    weight = torch.where(row_total != 0, w / torch.where(row_total != 0, row_total, 1.0), w)
    max_weight = w.new_zeros(n).scatter_reduce_(0, src, weight, "amax", include_self=True)
    dangling_index = (out_degree == 0).nonzero().reshape(-1)

    # P^T in CSR: rows = targets. Merge parallel edges, leave out zero weights.
    keep = weight != 0
    key = dst[keep] * max(n, 1) + src[keep]
    uniq, inverse = torch.unique(key, sorted=True, return_inverse=True)
    vals = w.new_zeros(uniq.shape[0]).index_add_(0, inverse, weight[keep])
    t_rows = uniq // max(n, 1)
    t_cols = uniq % max(n, 1)
    t_rowptr = _rowptr_sorted(t_rows, n)
    transpose = _sparse_csr(t_rowptr, t_cols, vals, (n, n))
    return TransitionOperator(
        n, rowptr, dst, weight, out_degree, max_weight, dangling_index, transpose
    )


def _rowptr_sorted(sorted_rows: Tensor, n: int) -> Tensor:
    counts = torch.bincount(sorted_rows, minlength=n)
    rowptr = sorted_rows.new_zeros(n + 1)
    torch.cumsum(counts, 0, out=rowptr[1:])
    return rowptr


def _check_operator(operator: TransitionOperator) -> None:
    if not isinstance(operator, TransitionOperator):
        raise ValidationError(
            "operator: expected a TransitionOperator (see build_transition), found "
            f"{type(operator).__name__}"
        )


def _colsum(x: Tensor) -> Tensor:
    """Column sums of ``(N, B)``, rows added in order: the same bits for any batch size."""
    rows = torch.zeros(x.shape[0], dtype=torch.int64, device=x.device)
    return x.new_zeros(1, x.shape[1]).index_add_(0, rows, x)[0]


def _finish(x: Tensor, squeeze: bool) -> Tensor:
    """Normalize each column to sum 1, in place (a zero column stays zero)."""
    total = _colsum(x)
    x.div_(torch.where(total != 0, total, 1.0))
    return x.reshape(-1) if squeeze else x


# ------------------------------------------------------------------------------------------
# Batched forward push
# ------------------------------------------------------------------------------------------


def ppr_forward_push(
    operator: TransitionOperator,
    personalization: Tensor,
    *,
    key_mask: Tensor | None = None,
    damping: float = 0.65,
    threshold: float = 1e-5,
    max_rounds: int = 10_000,
    return_stats: bool = False,
) -> Tensor | tuple[Tensor, PushStats]:
    """Batched, vectorized weighted forward push over a ``(N, B)`` residue matrix.

    Round structure: every ``(node, query)`` whose residue ``r`` exceeds ``threshold`` pushes
    in the same round, with the sequential push's per-node rules: ``reserve += (1 - d) * r``,
    ``residue = 0``; a node with out-edges spreads ``(d * w) * r`` along them when
    ``r * max(w) > threshold``, else drops ``d * r``; a dangling node gives ``(d * r) /
    n_src`` to each key of that query when ``r / n_src > threshold``, else drops it. All pushes
    of a round read the residues from the start of the round (Jacobi style), then are added
    with one gather / scatter over the active rows' out-edges (``index_add``) and one scatter
    onto the keys -- no Python loop over nodes, edges or queries. Queries never interact:
    each column evolves exactly as if pushed alone (bit-identical on CPU for any batch size).

    Error bound: with ``x`` the exact PPR (module docstring), the unnormalized result
    ``reserve`` satisfies ``0 <= x - reserve`` and ``sum(x - reserve) <= R + D``, where ``R``
    is the final residue mass (each entry ``<= threshold`` once converged, so ``R <=
    threshold * N``) and ``D`` the dropped mass (each drop at ``u`` is ``d * r`` with ``r <=
    threshold / max_w(u) <= threshold * outdeg(u)``, or ``r <= threshold * n_src`` when
    dangling). The normalized result is therefore within ``2 * (R + D) / sum(reserve)`` of
    ``x / sum(x)`` in L1, which ``return_stats`` reports per query (``error_bound``). The
    sequential push obeys the same bound, so the two differ by at most the sum of their
    bounds -- both are ``O(threshold)`` errors around the same exact vector.

    Args:
        operator: the graph's :class:`TransitionOperator` (from :func:`build_transition`).
        personalization: shape (N,) or (N, B), float, finite, >= 0; each column's sum > 0.
        key_mask: shape as ``personalization``, bool. Extra keys (zero-weight keys) for the
            dangling rule; nonzero entries are always keys.
        damping: in [0, 1). Continue probability (default 0.65).
        threshold: finite, > 0. Residue threshold (default 1e-5).
        max_rounds: >= 1. Round cap (the push always terminates -- each round reserves at
            least ``(1 - d) * threshold`` -- the cap bounds its time; the error bound above
            still holds when it stops early).
        return_stats: also return :class:`PushStats`.

    Returns:
        shape as ``personalization``, float64, on the operator's device: each column
        normalized to sum 1; a column stays all-zero when nothing was reserved (every key
        weight ``<= threshold``; the sequential push returns an empty vector there). An
        empty graph (``N = 0``) gives an empty result. With ``return_stats``: ``(ppr, stats)``.

    Raises:
        ValidationError: bad damping / threshold / max_rounds / personalization / key_mask.
    """
    _check_operator(operator)
    d = _check_damping(damping)
    thr = _check_positive("threshold", threshold)
    _check_count("max_rounds", max_rounds, minimum=1)
    n = operator.num_nodes
    q = _prepare_personalization(personalization.to(operator.device), _to(key_mask, operator), n)
    residue = q.scaled()
    num_q = residue.shape[1]
    reserve = torch.zeros_like(residue)
    dropped = residue.new_zeros(num_q)
    key_flat, key_cols, n_src = q.keys()
    keep = 1.0 - d
    weight_d = d * operator.weight  # (d * w), multiplied by r below: the original's order
    rowptr, col = operator.rowptr, operator.col
    out_degree, max_weight = operator.out_degree, operator.max_weight

    rounds = 0
    converged = n == 0 or num_q == 0
    while not converged and rounds < max_rounds:
        active = residue > thr
        rows = active.any(1).nonzero().reshape(-1)
        if rows.numel() == 0:
            converged = True
            break
        rounds += 1
        act = active[rows]
        r_rows = residue[rows]
        push = torch.where(act, r_rows, 0.0)
        residue[rows] = torch.where(act, 0.0, r_rows)
        reserve.index_add_(0, rows, keep * push)

        has_out = (out_degree[rows] > 0).unsqueeze(1)
        along_edges = act & has_out & (push * max_weight[rows].unsqueeze(1) > thr)
        to_keys = act & ~has_out & (push / n_src > thr)
        if return_stats:
            lost = torch.where(act & ~along_edges & ~to_keys, push, 0.0)
            dropped += d * _colsum(lost)

        # Along out-edges: gather the active rows' CSR slices, scale, scatter onto targets.
        edge_rows_sel = along_edges.any(1)
        e_rows = rows[edge_rows_sel]
        if e_rows.numel() > 0:
            e_push = torch.where(along_edges[edge_rows_sel], push[edge_rows_sel], 0.0)
            counts = out_degree[e_rows]
            local = torch.repeat_interleave(counts)
            first = torch.cumsum(counts, 0) - counts
            eidx = rowptr[e_rows][local] + (
                torch.arange(local.shape[0], device=local.device) - first[local]
            )
            residue.index_add_(0, col[eidx], weight_d[eidx].unsqueeze(1) * e_push[local])

        # Dangling rows: (d * r) / n_src to every key of the query.
        dang_sel = to_keys.any(1)
        if bool(dang_sel.any()):
            d_push = torch.where(to_keys[dang_sel], push[dang_sel], 0.0)
            # Sequential accumulation (index_add) keeps columns independent of the batch.
            share = (
                d_push.new_zeros(1, num_q).index_add_(
                    0, d_push.new_zeros(d_push.shape[0], dtype=torch.int64), d * d_push
                )[0]
                / n_src
            )
            residue.view(-1).index_add_(0, key_flat, share[key_cols])

    if not return_stats:
        return _finish(reserve, q.squeeze)
    stats = _make_stats(rounds, converged, _colsum(reserve), _colsum(residue), dropped)
    if q.squeeze:
        stats = PushStats(*stats[:2], *(t.reshape(()) for t in stats[2:]))
    return _finish(reserve, q.squeeze), stats


def _to(t: Tensor | None, operator: TransitionOperator) -> Tensor | None:
    return None if t is None else t.to(operator.device)


# ------------------------------------------------------------------------------------------
# Batched power iteration
# ------------------------------------------------------------------------------------------


def power_iteration_steps(damping: float, tol: float) -> int:
    """Steps that certify an L1 error ``<= tol`` for :func:`ppr_power_iteration`.

    ``K = ceil(ln tol / ln d) - 1`` (so that ``d ** (K + 1) <= tol``), at least 0; 0 when
    ``damping == 0``.

    Args:
        damping: in [0, 1).
        tol: finite, > 0.

    Returns:
        ``K`` >= 0.
    """
    d = _check_damping(damping)
    tol = _check_positive("tol", tol)
    if d == 0.0 or tol >= 1.0:
        return 0
    k = max(math.ceil(math.log(tol) / math.log(d)) - 1, 0)
    while d ** (k + 1) > tol:  # guard against the log ratio rounding down
        k += 1
    return k


def ppr_power_iteration(
    operator: TransitionOperator,
    personalization: Tensor,
    *,
    key_mask: Tensor | None = None,
    damping: float = 0.65,
    tol: float | None = None,
    num_steps: int | None = None,
    validate: bool = True,
    dtype: torch.dtype = _F64,
    local: bool = False,
) -> Tensor:
    """Batched weighted power iteration (sparse ``P^T`` times dense ``(N, B)``), to a tolerance.

    ``x_0 = (1 - d) s``; ``x_{k+1} = (1 - d) s + d P^T x_k + d (dangling mass of x_k) / n_src``
    on each key of the query (the same weights and dangling rule as the pushes). Every term is
    non-negative, and the mass still missing after ``K`` steps is at most ``d^(K+1)``, so

    * the unnormalized iterate ``x_K`` satisfies ``0 <= x - x_K`` and ``sum(x - x_K) <=
      d^(K+1) <= tol`` with ``K = ceil(ln tol / ln d) - 1`` (:func:`power_iteration_steps`);
    * the returned column ``x_K / sum(x_K)`` is within ``2 d^(K+1) / sum(x)`` of ``x /
      sum(x)`` in L1 (``sum(x) = 1`` when no row leaks mass, giving ``2 * tol``).

    Each step is one ``torch.addmm`` of the cached CSR ``P^T`` (``alpha = d``, ``out=`` one of
    two preallocated buffers) plus a gather over the dangling nodes and a scatter onto the
    keys (skipped when the graph has no dangling node). The step count and every shape are
    fixed before the loop, and the loop body has no data-dependent control flow and no host
    synchronization, so it can be captured in a CUDA graph (the setup before it -- validation,
    key extraction -- does synchronize; ``validate=False`` removes the validation part).

    Args:
        operator: the graph's :class:`TransitionOperator` (from :func:`build_transition`).
        personalization: shape (N,) or (N, B), float, finite, >= 0; each column's sum > 0.
        key_mask: shape as ``personalization``, bool. Extra (zero-weight) keys.
        damping: in [0, 1). Continue probability (default 0.65). ``0`` returns the
            normalized personalization.
        tol: finite, > 0. Target L1 tolerance (see above); the default mode, ``1e-6``.
        num_steps: >= 0. Fixed step count instead of ``tol`` (not both).
        validate: check the personalization (host syncs); ``False`` only for trusted input.
        dtype: ``torch.float64`` (default) or ``torch.float32``: the iterate's and ``P^T``'s
            precision. float32 halves the memory traffic (the cost of each step) and keeps the
            L1 error near ``tol`` down to ``tol`` ≈ 1e-6 (rounding adds ~1e-7 per step); the
            result is still returned as float64.
        local: restrict the iteration to the nodes reachable from the keys within the step
            count (found by a frontier expansion over the edges of nonzero weight; a node
            outside it has exactly zero mass after ``K`` steps, so the result is identical).
            Used when the graph has more than 512 nodes and that set is at most a quarter of
            it; otherwise the whole graph is iterated. Adds host synchronizations (not for CUDA-graph capture).

    Returns:
        shape as ``personalization``, float64 (whatever ``dtype``), on the operator's device, each column
        normalized to sum 1. An empty graph (``N = 0``) gives an empty result.

    Raises:
        ValidationError: bad damping / tol / num_steps / personalization / key_mask.
    """
    _check_operator(operator)
    d = _check_damping(damping)
    if dtype not in (torch.float32, torch.float64):
        raise ValidationError(f"dtype: expected torch.float32 or torch.float64, found {dtype}")
    if tol is not None and num_steps is not None:
        raise ValidationError(
            f"tol / num_steps: expected at most one of them, found tol={tol!r}, "
            f"num_steps={num_steps!r}"
        )
    if num_steps is None:
        steps = power_iteration_steps(d, 1e-6 if tol is None else tol)
    else:
        steps = _check_count("num_steps", num_steps, minimum=0)
    n = operator.num_nodes
    q = _prepare_personalization(
        personalization.to(operator.device), _to(key_mask, operator), n, validate=validate
    )
    restart = q.scaled(1.0 - d)  # x_0 = (1 - d) s, also the restart term of every step
    if steps == 0 or d == 0.0 or n == 0:
        return _finish(restart, q.squeeze)
    key_flat, key_cols, n_src = q.keys()
    if local and n > _LOCAL_MIN_NODES:
        sub = _reachable_subproblem(operator, q, steps)
        if sub is not None:
            nodes, transpose, dangling, index = sub
            b = restart.shape[1]
            sub_flat = index[torch.div(key_flat, b, rounding_mode="floor")] * b + key_flat % b
            x = _power_loop(
                transpose, dangling, restart.index_select(0, nodes), sub_flat, key_cols,
                n_src, d, steps, dtype,
            )  # fmt: skip
            out = torch.zeros_like(restart)
            out.index_copy_(0, nodes, x.to(_F64))
            return _finish(out, q.squeeze)
    x = _power_loop(
        operator.transpose, operator.dangling_index, restart, key_flat, key_cols, n_src, d,
        steps, dtype,
    )  # fmt: skip
    return _finish(x.to(_F64), q.squeeze)


def _power_loop(
    transpose: Tensor,
    dangling: Tensor,
    restart: Tensor,
    key_flat: Tensor,
    key_cols: Tensor,
    n_src: Tensor,
    d: float,
    steps: int,
    dtype: torch.dtype,
) -> Tensor:
    """``steps`` Jacobi steps of ``x = restart + d P^T x + d (dangling mass) / n_src on keys``.

    Fixed shapes, no data-dependent control flow, no host sync: capturable in a CUDA graph.
    """
    if transpose.dtype != dtype:
        transpose = transpose.to(dtype)
    restart = restart.to(dtype)
    x = restart
    has_dangling = dangling.numel() > 0
    if has_dangling:
        key_share = (d / n_src[key_cols]).to(dtype)
    buffers = [torch.empty_like(restart), torch.empty_like(restart)]
    for step in range(steps):
        nxt = buffers[step % 2]
        torch.addmm(restart, transpose, x, alpha=d, out=nxt)
        if has_dangling:
            lost = x.index_select(0, dangling).sum(0)
            nxt.view(-1).index_add_(0, key_flat, key_share * lost[key_cols])
        x = nxt
    return x


def _reachable_subproblem(
    operator: TransitionOperator, q: _Queries, steps: int
) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
    """Nodes within ``steps`` hops of any key over edges of nonzero weight, and ``P^T`` on them.

    Returns ``(nodes (m,), transpose (m, m) CSR, dangling (sub indices), index (N,) old → new,
    -1 outside)``, or ``None`` when the set exceeds a quarter of the graph (iterate it all).
    """
    n = operator.num_nodes
    limit = n // 4
    keys = q.p != 0
    if q.extra_keys is not None:
        keys |= q.extra_keys
    reach = keys.any(dim=1)
    if int(reach.sum()) > limit:
        return None
    live = operator.weight != 0
    src = torch.repeat_interleave(
        torch.arange(n, device=operator.col.device), operator.out_degree
    )[live]
    dst = operator.col[live]
    weight = operator.weight[live]
    frontier = reach
    for _ in range(steps):
        step_edges = frontier.index_select(0, src)
        new = torch.zeros_like(reach)
        new[dst[step_edges]] = True
        frontier = new & ~reach
        if not bool(frontier.any()):
            break
        reach |= frontier
        if int(reach.sum()) > limit:
            return None
    nodes = reach.nonzero().reshape(-1)
    m = int(nodes.numel())
    index = torch.full((n,), -1, dtype=torch.int64, device=reach.device)
    index[nodes] = torch.arange(m, device=reach.device)
    inside = reach.index_select(0, src) & reach.index_select(0, dst)
    rows, cols = index[dst[inside]], index[src[inside]]
    coo = torch.sparse_coo_tensor(
        torch.stack([rows, cols]), weight[inside], (m, m), dtype=_F64, check_invariants=False
    ).coalesce()
    transpose = coo.to_sparse_csr()
    dangling = index[operator.dangling_index]
    dangling = dangling[dangling >= 0]
    return nodes, transpose, dangling, index


# ------------------------------------------------------------------------------------------
# The original's unweighted naive power iteration (SPEC §6.2)
# ------------------------------------------------------------------------------------------


def ppr_naive(
    edge_index: Tensor,
    personalization: Tensor,
    *,
    num_nodes: int,
    damping: float,
    nb_iter: int,
    key_mask: Tensor | None = None,
) -> Tensor:
    """The original's ``naive_ppr``: unweighted Jacobi iteration, normalized every step.

    ``rank = s`` (the normalized personalization); ``nb_iter`` times:
    ``new[c] = sum over distinct pairs i -> c of (d * rank[i]) / deg(i)`` (``deg`` counts
    parallel edges and self loops, but a pair contributes once) ``+ sum over dangling i of
    (d * rank[i]) / n_src`` (on keys only) ``+ (1 - d) * s[c]``; then ``rank = new /
    sum(new)`` (kept when the sum is 0). Finally ``rank / sum(rank)``. Edge weights are
    ignored, as in the original.

    Args:
        edge_index: shape (2, E), integer.
        personalization: shape (N,) or (N, B), float, finite, >= 0; each column's sum > 0.
        num_nodes: >= 0. ``N``.
        damping: in [0, 1). Continue probability.
        nb_iter: >= 0. Number of steps.
        key_mask: shape as ``personalization``, bool. Extra (zero-weight) keys.

    Returns:
        shape as ``personalization``, float64, on ``edge_index``'s device, columns summing to
        1. An empty graph (``N = 0``) gives an empty result.

    Raises:
        ValidationError: bad damping / nb_iter / shapes / personalization.
    """
    d = _check_damping(damping)
    n = _check_num_nodes(num_nodes)
    _check_count("nb_iter", nb_iter, minimum=0)
    _check_edge_index(edge_index, n)
    device = edge_index.device
    q = _prepare_personalization(personalization.to(device), _to_dev(key_mask, device), n)
    rank = q.scaled()
    if n == 0:
        return _finish(rank, q.squeeze)
    src = edge_index[0].to(torch.int64)
    dst = edge_index[1].to(torch.int64)
    deg = torch.bincount(src, minlength=n).to(_F64)
    pairs = torch.unique(src * n + dst, sorted=True)
    p_src, p_dst = pairs // n, pairs % n
    p_deg = deg[p_src].unsqueeze(1)
    dangling = (deg == 0).nonzero().reshape(-1)
    key_flat, key_cols, n_src = q.keys()
    restart = (1.0 - d) * rank
    for _ in range(nb_iter):
        walk = d * rank
        new = torch.zeros_like(rank).index_add_(0, p_dst, walk[p_src] / p_deg)
        if dangling.numel() > 0:
            lost = (walk.index_select(0, dangling) / n_src).sum(0)
            new.view(-1).index_add_(0, key_flat, lost[key_cols])
        new += restart
        total = _colsum(new)
        rank = torch.where(total != 0, new / torch.where(total != 0, total, 1.0), rank)
    return _finish(rank, q.squeeze)


def _to_dev(t: Tensor | None, device: torch.device) -> Tensor | None:
    return None if t is None else t.to(device)
