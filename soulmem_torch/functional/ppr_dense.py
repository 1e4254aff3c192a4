"""Exact PPR of small graphs from a cached dense inverse (docs/spec.md §6, DECISION "exact
small graphs").

Conventions (damping, row-stochastic ``P``, the dangling rule, ``(N, B)`` personalization):
see :mod:`soulmem_torch.functional.ppr`.

For a graph of ``N`` notes, :func:`dense_factors` inverts ``I - d P^T`` once (``O(N^3)``,
cached on the :class:`~soulmem_torch.functional.transition.TransitionOperator` per damping).
A query then costs ``O(N)`` per key instead of a sparse product per power-iteration step:
with ``M = (I - d P^T)^-1``, keys ``K`` (``n_src`` of them), normalized personalization ``s``
and ``g`` the indicator of the dangling nodes, the dangling rule is a rank-one term and
(Sherman–Morrison)

    ``alpha = (1 - d) (g^T M s) / (1 - d (g^T M 1_K) / n_src)``  (the dangling mass),
    ``x = M v`` with ``v = (1 - d) s + d alpha 1_K / n_src``,

so ``x`` is a combination of the columns of ``M`` at the keys. ``x / sum(x)`` is the exact
PPR (the limit the power iteration approaches; rounding error ~1e-15).

Every reduction runs over the (query, key) entries in key order, and the final column sums
add the notes in order (:func:`~soulmem_torch.functional._ppr_common._colsum`), so a query
gives the same bits in any batch and in any zero-padded layout: the per-agent path and the
:class:`~soulmem_torch.bank.MemoryBank` share :func:`dense_ppr_entries`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from soulmem_torch.errors import ValidationError
from soulmem_torch.functional._ppr_common import (
    _F64,
    _check_damping,
    _colsum,
    _prepare_personalization,
)
from soulmem_torch.functional.transition import TransitionOperator, _check_operator, _to

__all__ = ["DenseFactors", "dense_factors", "dense_factors_many", "dense_ppr_entries", "ppr_dense"]


@dataclass(frozen=True, eq=False)
class DenseFactors:
    """What :func:`ppr_dense` reads of a graph at one damping.

    Attributes:
        damping: the damping they were computed for.
        inverse_t: shape (N, N), float64. ``M^T`` with ``M = (I - d P^T)^-1``: row ``k`` is
            the (unnormalized, ``1 - d`` left out) PPR vector of a walk restarting at ``k``
            without the dangling rule.
        dangling_mass: shape (N,), float64. ``g^T M``: entry ``k`` is the mass row ``k`` of
            ``inverse_t`` puts on the dangling nodes.
    """

    damping: float
    inverse_t: Tensor
    dangling_mass: Tensor


def dense_factors(
    operator: TransitionOperator, damping: float, *, cache: bool = True
) -> DenseFactors:
    """``M^T`` and ``g^T M`` of ``operator`` at ``damping`` (:class:`DenseFactors`).

    Args:
        operator: the graph's :class:`TransitionOperator`.
        damping: in [0, 1).
        cache: keep the result on ``operator`` (reused by later calls at the same damping);
            ``False`` still reuses a cached result but does not store a new one (the
            :class:`~soulmem_torch.bank.MemoryBank` keeps its own copy).

    Returns:
        :class:`DenseFactors` on the operator's device. ``O(N^2)`` memory, ``O(N^3)`` time.
    """
    _check_operator(operator)
    d = _check_damping(damping)
    key = ("dense_factors", d)
    found = operator.cache.get(key)
    if found is not None:
        return found
    n = operator.num_nodes
    device = operator.device
    if n == 0:
        empty = torch.zeros(0, 0, dtype=_F64, device=device)
        factors = DenseFactors(d, empty, torch.zeros(0, dtype=_F64, device=device))
    else:
        a = torch.eye(n, dtype=_F64, device=device)
        a.sub_(operator.transpose.to_dense().to(_F64), alpha=d)
        inverse = torch.linalg.inv(a)
        mass = _colsum(inverse.index_select(0, operator.dangling_index))
        factors = DenseFactors(d, inverse.T.contiguous(), mass)
    if cache:
        operator.cache[key] = factors
    return factors


_BATCH_FLOATS = 1 << 22  # floats of one batched inverse (32 MiB): the batch is cut past it


def dense_factors_many(
    operators: list[TransitionOperator], damping: float, *, cache: bool = True
) -> list[DenseFactors]:
    """:func:`dense_factors` of many operators, the inverses of same-sized CPU graphs taken
    by one batched ``torch.linalg.inv`` (LAPACK inverts each matrix of a batch as it inverts
    one: the same bits; what a bank's first question to many small new agents wants). Results
    already cached on an operator are reused; ``cache`` as for :func:`dense_factors`."""
    d = _check_damping(damping)
    key = ("dense_factors", d)
    out: list[DenseFactors | None] = []
    groups: dict[int, list[int]] = {}
    for k, operator in enumerate(operators):
        _check_operator(operator)
        found = operator.cache.get(key)
        out.append(found)
        if found is None and operator.num_nodes and operator.device.type == "cpu":
            groups.setdefault(operator.num_nodes, []).append(k)
    chunks = [
        members[i : i + max(1, _BATCH_FLOATS // (n * n))]
        for n, members in groups.items()
        for i in range(0, len(members), max(1, _BATCH_FLOATS // (n * n)))
    ]
    for members in chunks:
        if len(members) == 1:
            continue  # one matrix: the single path below
        n = operators[members[0]].num_nodes
        a = torch.eye(n, dtype=_F64).repeat(len(members), 1, 1)
        for row, k in enumerate(members):
            a[row].sub_(operators[k].transpose.to_dense().to(_F64), alpha=d)
        inverses = torch.linalg.inv(a)
        for row, k in enumerate(members):
            operator, inverse = operators[k], inverses[row]
            mass = _colsum(inverse.index_select(0, operator.dangling_index))
            factors = DenseFactors(d, inverse.T.contiguous(), mass)
            if cache:
                operator.cache[key] = factors
            out[k] = factors
    return [
        found if found is not None else dense_factors(operator, d, cache=cache)
        for operator, found in zip(operators, out)
    ]


def dense_ppr_entries(
    rows: Tensor,
    dangling_mass: Tensor,
    weight: Tensor,
    query: Tensor,
    *,
    num_queries: int,
    damping: float,
    scratch: bool = False,
) -> Tensor:
    """Exact PPR of ``num_queries`` queries from their (query, key) entries.

    Entries must be sorted by query, and by key within a query (the order of
    ``keys.nonzero()`` on a ``(queries, notes)`` mask); a query without entries, or whose
    weights sum to 0, gives a zero row.

    Args:
        rows: shape (E, n), float64. Row ``key`` of :attr:`DenseFactors.inverse_t` per entry
            (zero-padded past the graph's notes when ``n`` is larger).
        dangling_mass: shape (E,), float64. :attr:`DenseFactors.dangling_mass` at the key.
        weight: shape (E,), float64, >= 0. The key's personalization weight (0 for a key of
            ``key_mask`` only).
        query: shape (E,), int64. The entry's query, in ``[0, num_queries)``.
        num_queries: ``Q`` >= 0.
        damping: the damping of the factors.
        scratch: ``rows`` is the caller's to spend (a fresh gather): each row is scaled by
            its weight in place instead of in a copy (the same products; at 1,000 agents the
            copy was ~50 MB of fresh pages a call).

    Returns:
        shape (Q, n), float64, each row normalized to sum 1 (rows summed note by note).
    """
    d = float(damping)
    n = rows.shape[1]
    device = rows.device
    zeros = torch.zeros(num_queries, dtype=_F64, device=device)
    total = zeros.clone().index_add_(0, query, weight)
    count = zeros.clone().index_add_(0, query, torch.ones_like(weight))
    safe_total = torch.where(total > 0, total, 1.0)
    safe_count = torch.where(count > 0, count, 1.0)
    s = weight / safe_total.index_select(0, query)
    on_dangling = zeros.clone().index_add_(0, query, dangling_mass * s)
    key_dangling = zeros.clone().index_add_(0, query, dangling_mass)
    alpha = (1.0 - d) * on_dangling / (1.0 - d * key_dangling / safe_count)
    share = d * alpha / safe_count
    v = (1.0 - d) * s + share.index_select(0, query)
    x = torch.zeros(num_queries, n, dtype=_F64, device=device)
    x.index_add_(0, query, rows.mul_(v.unsqueeze(1)) if scratch else rows * v.unsqueeze(1))
    xt = x.T.contiguous()  # (n, Q): column sums note by note, trailing zero padding exact
    sums = _colsum(xt)
    live = total > 0
    scale = torch.where((sums != 0) & live, sums, 1.0)
    return (xt / scale).T.mul_(live.unsqueeze(1))  # finite: rows of dead queries → 0


def ppr_dense(
    operator: TransitionOperator,
    personalization: Tensor,
    *,
    key_mask: Tensor | None = None,
    damping: float = 0.65,
    validate: bool = True,
    factors: DenseFactors | None = None,
) -> Tensor:
    """Exact PPR (same weights and dangling rule as :func:`ppr_power_iteration`) from the dense
    inverse of ``I - d P^T`` (:func:`dense_factors`, computed once per operator and damping).

    Meant for small graphs (the retrieve layer uses it up to
    ``AssociationConfig.power_dense_max_nodes`` notes): ``O(N^3)`` once, then ``O(N)`` per key
    of each query. The result is what the power iteration converges to (within rounding),
    so it meets any ``tol`` of the power iteration.

    Args:
        operator: the graph's :class:`TransitionOperator`.
        personalization: shape (N,) or (N, B), float, finite, >= 0; each column's sum > 0.
        key_mask: shape as ``personalization``, bool. Extra (zero-weight) keys.
        damping: in [0, 1). Continue probability (default 0.65).
        validate: check the personalization (host syncs); ``False`` only for trusted input.
        factors: precomputed :func:`dense_factors` of ``operator`` at ``damping``.

    Returns:
        shape as ``personalization``, float64, on the operator's device, each column
        normalized to sum 1. An empty graph (``N = 0``) gives an empty result.

    Raises:
        ValidationError: bad damping / personalization / key_mask, or ``factors`` for another
            damping or size.
    """
    _check_operator(operator)
    d = _check_damping(damping)
    n = operator.num_nodes
    q = _prepare_personalization(
        personalization.to(operator.device), _to(key_mask, operator), n, validate=validate
    )
    b = q.p.shape[1]
    if factors is None:
        factors = dense_factors(operator, d)
    elif factors.damping != d or factors.inverse_t.shape != (n, n):
        raise ValidationError(
            f"factors: expected dense_factors of this operator at damping {d!r} (size "
            f"{n}), found damping {factors.damping!r}, size {tuple(factors.inverse_t.shape)}"
        )
    if n == 0:
        out = q.p.new_zeros(0, b)
        return out.reshape(-1) if q.squeeze else out
    keys = q.p != 0
    if q.extra_keys is not None:
        keys = keys | q.extra_keys
    col, node = keys.T.nonzero(as_tuple=True)  # by query, then by key
    x = dense_ppr_entries(
        factors.inverse_t.index_select(0, node),
        factors.dangling_mass.index_select(0, node),
        q.p[node, col],
        col,
        num_queries=b,
        damping=d,
        scratch=True,  # (a fresh gather)
    )
    out = x.T.contiguous()
    return out.reshape(-1) if q.squeeze else out
