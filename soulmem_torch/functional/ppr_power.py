"""Batched weighted power iteration to a certified L1 tolerance, and the original's unweighted
``naive_ppr`` (docs/spec.md §6, §6.2).

Conventions (damping, row-stochastic ``P``, the dangling rule, ``(N, B)`` personalization):
see :mod:`soulmem_torch.functional.ppr`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from soulmem_torch.errors import ValidationError
from soulmem_torch.functional._ppr_common import (
    _F64,
    _LOCAL_MIN_NODES,
    _check_count,
    _check_damping,
    _check_num_nodes,
    _check_positive,
    _colsum,
    _finish,
    _prepare_personalization,
    _Queries,
)
from soulmem_torch.functional.edge_weights import _check_edge_index
from soulmem_torch.functional.transition import (
    TransitionOperator,
    _check_operator,
    _to,
)

__all__ = ["MAX_POWER_STEPS", "power_iteration_steps", "ppr_naive", "ppr_power_iteration"]

MAX_POWER_STEPS: int = 10_000
"""The most steps :func:`ppr_power_iteration` runs. The certified step count
``ceil(ln tol / ln d) - 1`` grows like ``1 / (1 - d)``: damping 0.999999 at ``tol`` 1e-6 would
need 13.8M steps. Above this cap (e.g. ``d > 0.998`` at ``tol = 1e-9``; the configs bound
``damping_factor`` to 0.99) a clear :class:`~soulmem_torch.errors.ValidationError` names the
damping and the tolerance."""


def power_iteration_steps(damping: float, tol: float) -> int:
    """Steps that certify an L1 error ``<= tol`` for :func:`ppr_power_iteration`.

    ``K = ceil(ln tol / ln d) - 1`` (so that ``d ** (K + 1) <= tol``), at least 0; 0 when
    ``damping == 0``.

    Args:
        damping: in [0, 1).
        tol: finite, > 0.

    Returns:
        ``K`` >= 0.

    Raises:
        ValidationError: bad damping or tol, or ``K`` above :data:`MAX_POWER_STEPS`.
    """
    d = _check_damping(damping)
    tol = _check_positive("tol", tol)
    if d == 0.0 or tol >= 1.0:
        return 0
    k = max(math.ceil(math.log(tol) / math.log(d)) - 1, 0)
    if k > MAX_POWER_STEPS:
        raise ValidationError(
            f"damping / tol: damping={d!r} with tol={tol!r} needs {k} power-iteration steps, "
            f"more than MAX_POWER_STEPS={MAX_POWER_STEPS}; use a smaller damping (at most "
            f"{math.exp(math.log(tol) / (MAX_POWER_STEPS + 1)):.6f} for this tol) or a larger tol"
        )
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
        num_steps: in [0, MAX_POWER_STEPS]. Fixed step count instead of ``tol`` (not both).
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
        ValidationError: bad damping / tol / num_steps / personalization / key_mask, or a
            damping and tol that need more than :data:`MAX_POWER_STEPS` steps.
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
        if steps > MAX_POWER_STEPS:
            raise ValidationError(
                f"num_steps: expected at most MAX_POWER_STEPS={MAX_POWER_STEPS}, found {steps}"
            )
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
    src = torch.repeat_interleave(torch.arange(n, device=operator.col.device), operator.out_degree)[
        live
    ]
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
# The original's unweighted naive power iteration (docs/spec.md §6.2)
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
