"""What the PPR kernels share: argument checks, personalization preparation, statistics,
column sums (docs/spec.md §6).

Conventions (damping, row-stochastic ``P``, the dangling rule, ``(N, B)`` personalization):
see :mod:`soulmem_torch.functional.ppr`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from soulmem_torch.errors import ValidationError

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
            bad = (~torch.isfinite(p)).nonzero()
            if bad.shape[0] == 0:  # every entry finite, but a column's sum overflows
                col = int((~torch.isfinite(total)).nonzero()[0, 0])
                raise ValidationError(
                    f"personalization: expected column sums that fit a float64, found column "
                    f"{col} summing to {total[col].item()} (largest entry "
                    f"{p[:, col].max().item():.3g}); scale the weights down"
                )
            node, col = (int(v) for v in bad[0])
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


def _colsum(x: Tensor) -> Tensor:
    """Column sums of ``(N, B)``, rows added in order: the same bits for any batch size."""
    rows = torch.zeros(x.shape[0], dtype=torch.int64, device=x.device)
    return x.new_zeros(1, x.shape[1]).index_add_(0, rows, x)[0]


def _finish(x: Tensor, squeeze: bool) -> Tensor:
    """Normalize each column to sum 1, in place (a zero column stays zero)."""
    total = _colsum(x)
    x.div_(torch.where(total != 0, total, 1.0))
    return x.reshape(-1) if squeeze else x
