"""The prepared transition operator of a graph (normalized weights folded into CSR values once)
for the batched PPR kernels (docs/spec.md §6).

Conventions (damping, row-stochastic ``P``, the dangling rule, ``(N, B)`` personalization):
see :mod:`soulmem_torch.functional.ppr`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from soulmem_torch.errors import ValidationError
from soulmem_torch.functional._ppr_common import (
    _F64,
    _check_edge_weight,
    _check_num_nodes,
)
from soulmem_torch.functional.edge_weights import _check_edge_index

__all__ = ["TransitionOperator", "build_transition"]


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
        cache: what kernels derive from the operator and keep with it (e.g. the dense
            inverse of :func:`~soulmem_torch.functional.ppr_dense.dense_factors`, per
            damping); not carried by :meth:`to`.
    """

    num_nodes: int
    rowptr: Tensor
    col: Tensor
    weight: Tensor
    out_degree: Tensor
    max_weight: Tensor
    dangling_index: Tensor
    transpose: Tensor
    cache: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)

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


def _to(t: Tensor | None, operator: TransitionOperator) -> Tensor | None:
    return None if t is None else t.to(operator.device)
