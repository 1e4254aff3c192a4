"""Personalized PageRank kernels (docs/spec.md §6).

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
* :func:`~soulmem_torch.functional.ppr_dense.ppr_dense` (module ``ppr_dense``) -- the exact
  PPR of a small graph from a cached dense inverse of ``I - d P^T`` (the ``power`` method's
  route for graphs of at most ``power_dense_max_nodes`` notes).

Modules (this one re-exports them all, private helpers included, so existing imports keep
working):

* :mod:`~soulmem_torch.functional.ppr_sequential` -- :func:`ppr_sequential_push`.
* :mod:`~soulmem_torch.functional.transition` -- :class:`TransitionOperator`,
  :func:`build_transition`.
* :mod:`~soulmem_torch.functional.ppr_push` -- :func:`ppr_forward_push`.
* :mod:`~soulmem_torch.functional.ppr_power` -- :func:`ppr_power_iteration`,
  :func:`power_iteration_steps`, :func:`ppr_naive`.
* :mod:`~soulmem_torch.functional._ppr_common` -- argument checks, personalization
  preparation, :class:`PushStats`.
"""

from __future__ import annotations

# ruff: noqa: F401  (re-exports: private helpers stay importable from here)
from soulmem_torch.functional._ppr_common import (
    _F64,
    _LOCAL_MIN_NODES,
    PushStats,
    _check_count,
    _check_damping,
    _check_edge_weight,
    _check_num_nodes,
    _check_positive,
    _colsum,
    _finish,
    _make_stats,
    _prepare_personalization,
    _Queries,
)
from soulmem_torch.functional.ppr_power import (
    MAX_POWER_STEPS,
    _power_loop,
    _reachable_subproblem,
    _to_dev,
    power_iteration_steps,
    ppr_naive,
    ppr_power_iteration,
)
from soulmem_torch.functional.ppr_push import ppr_forward_push
from soulmem_torch.functional.ppr_sequential import ppr_sequential_push
from soulmem_torch.functional.transition import (
    TransitionOperator,
    _check_operator,
    _rowptr_sorted,
    _sparse_csr,
    _to,
    build_transition,
)

__all__ = [
    "MAX_POWER_STEPS",
    "PushStats",
    "TransitionOperator",
    "build_transition",
    "power_iteration_steps",
    "ppr_forward_push",
    "ppr_naive",
    "ppr_power_iteration",
    "ppr_sequential_push",
]
