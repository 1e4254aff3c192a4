"""Batched, vectorized forward push over ``(N, B)`` residues (docs/spec.md §6).

Conventions (damping, row-stochastic ``P``, the dangling rule, ``(N, B)`` personalization):
see :mod:`soulmem_torch.functional.ppr`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from soulmem_torch.functional._ppr_common import (
    PushStats,
    _check_count,
    _check_damping,
    _check_positive,
    _colsum,
    _finish,
    _make_stats,
    _prepare_personalization,
)
from soulmem_torch.functional.transition import (
    TransitionOperator,
    _check_operator,
    _to,
)

__all__ = ["ppr_forward_push"]


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
