"""Dynamic edge weights (docs/spec.md §5, the original's ``DynWeightFuncBuilder``) as tensor ops.

Every edge ``u -> v`` of the memory graph gets a weight from its link kind, its intensity and
(for Sem links) its confidence, computed for all edges at once in float64 so that the numbers
are the original's to the last bit, float32 casts included.

Example:
    >>> import torch
    >>> from soulmem_torch.functional.codes import LINK_SEM, NODE_SEMANTIC
    >>> w = dynamic_edge_weight(
    ...     torch.tensor([[0], [1]]),
    ...     torch.tensor([LINK_SEM]),
    ...     torch.tensor([1.0], dtype=torch.float64),
    ...     torch.tensor([0.7], dtype=torch.float32),
    ...     torch.tensor([NODE_SEMANTIC, NODE_SEMANTIC]),
    ...     preference=PREFERENCE_SEMANTIC,
    ...     intensity_factor=1.0,
    ...     confidence_factor=1.0,
    ... )
    >>> w.item()
    0.88888888447373
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from soulmem_torch.errors import ValidationError
from soulmem_torch.functional.codes import (
    LINK_PROC,
    LINK_SEM,
    LINK_SIT_ABSTRACT_TO_SPECIFIC,
    LINK_SIT_SPECIFIC_TO_ABSTRACT,
    NODE_PROCEDURE,
    SITUATION_LINK_CONFIDENCE,
)

__all__ = [
    "PREFERENCE_SEMANTIC",
    "PREFERENCE_SITUATION",
    "compute_rowptr",
    "dynamic_edge_weight",
    "normalized_edge_weight",
    "out_weight_sum",
]

PREFERENCE_SEMANTIC: tuple[float, float] = (0.7, 0.3)
"""``TypePreference::Semantic`` as ``(semantic_boost, situation_boost)``."""
PREFERENCE_SITUATION: tuple[float, float] = (0.3, 0.7)
"""``TypePreference::Situation`` (the default) as ``(semantic_boost, situation_boost)``."""

_KNOWN_KINDS = (LINK_PROC, LINK_SEM, LINK_SIT_ABSTRACT_TO_SPECIFIC, LINK_SIT_SPECIFIC_TO_ABSTRACT)


def _check_factor(name: str, value: float) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValidationError(f"{name}: expected a finite number >= 0, found {value!r}") from None
    if not math.isfinite(value) or value < 0.0:
        raise ValidationError(f"{name}: expected a finite number >= 0, found {value!r}")
    return value


def _check_edge_index(edge_index: Tensor, num_nodes: int | None = None) -> None:
    if not isinstance(edge_index, Tensor):
        raise ValidationError(f"edge_index: expected a tensor, found {type(edge_index).__name__}")
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValidationError(f"edge_index: expected shape (2, E), found {tuple(edge_index.shape)}")
    if edge_index.dtype.is_floating_point or edge_index.dtype == torch.bool:
        raise ValidationError(f"edge_index: expected an integer tensor, found {edge_index.dtype}")
    if num_nodes is not None and edge_index.numel() > 0:
        lo, hi = int(edge_index.min()), int(edge_index.max())
        if lo < 0 or hi >= num_nodes:
            raise ValidationError(
                f"edge_index: expected node indices in [0, {num_nodes}), found range [{lo}, {hi}]"
            )


def _check_edge_vector(name: str, value: Tensor, num_edges: int) -> None:
    if not isinstance(value, Tensor):
        raise ValidationError(f"{name}: expected a tensor, found {type(value).__name__}")
    if value.shape != (num_edges,):
        raise ValidationError(f"{name}: expected shape ({num_edges},), found {tuple(value.shape)}")


def dynamic_edge_weight(
    edge_index: Tensor,
    edge_kind: Tensor,
    intensity: Tensor,
    confidence: Tensor,
    node_type: Tensor,
    *,
    preference: tuple[float, float] = PREFERENCE_SITUATION,
    intensity_factor: float = 1.0,
    confidence_factor: float = 0.8,
) -> Tensor:
    """Dynamic weight of every edge, exactly as the original's ``DynWeightFuncBuilder``.

    For an edge ``u -> v`` (docs/spec.md §5):

    1. ``v`` is a Procedure note -> ``0``.
    2. ``(cb, tb)``: Proc link -> ``(0, 0)``; Situation link (either direction) ->
       ``(float32(0.8), preference[1])``; Sem link -> ``(float32 confidence, preference[0])``.
    3. ``den = (intensity_factor + confidence_factor) + tb``; ``den == 0`` -> ``0``; else
       ``w = ((intensity * intensity_factor + cb * confidence_factor) + tb) / den``.

    The float32 confidences are widened to float64 before use (the original stores them as
    ``f32`` and computes in ``f64``); everything else is float64, in the original's operation
    order, so the result is bit-identical to it.

    Args:
        edge_index: shape (2, E), integer. Source / target node of every edge.
        edge_kind: shape (E,), integer. ``LINK_*`` code of every edge (see ``codes``).
        intensity: shape (E,), float64. Link intensity (read as float64).
        confidence: shape (E,). Sem-link confidence; rounded to float32 first (as the
            original stores it), then widened. Ignored for other kinds.
        node_type: shape (N,), integer. ``NODE_*`` code of every node.
        preference: ``(semantic_boost, situation_boost)``; finite, >= 0. Defaults to
            ``TypePreference::Situation`` = ``(0.3, 0.7)``; ``PREFERENCE_SEMANTIC`` is
            ``(0.7, 0.3)``.
        intensity_factor: finite, >= 0. ``i_f`` (the original's default 1.0).
        confidence_factor: finite, >= 0. ``c_f`` (the original's default 0.8).

    Returns:
        shape (E,), float64, on the device of ``edge_index``. Edge weights (not normalized).

    Raises:
        ValidationError: on a bad shape, an unknown link kind, a non-finite or negative factor,
            or an out-of-range node index.
    """
    if not isinstance(node_type, Tensor) or node_type.dim() != 1:
        raise ValidationError(
            f"node_type: expected a tensor of shape (N,), found "
            f"{tuple(node_type.shape) if isinstance(node_type, Tensor) else type(node_type).__name__}"
        )
    num_nodes = node_type.shape[0]
    _check_edge_index(edge_index, num_nodes)
    num_edges = edge_index.shape[1]
    _check_edge_vector("edge_kind", edge_kind, num_edges)
    _check_edge_vector("intensity", intensity, num_edges)
    _check_edge_vector("confidence", confidence, num_edges)
    if len(preference) != 2:
        raise ValidationError(
            f"preference: expected (semantic_boost, situation_boost), found {preference!r}"
        )
    sem_boost = _check_factor("preference[0] (semantic_boost)", preference[0])
    sit_boost = _check_factor("preference[1] (situation_boost)", preference[1])
    i_f = _check_factor("intensity_factor", intensity_factor)
    c_f = _check_factor("confidence_factor", confidence_factor)

    kind = edge_kind.to(device=edge_index.device, dtype=torch.int64)
    if num_edges > 0:
        known = torch.zeros_like(kind, dtype=torch.bool)
        for code in _KNOWN_KINDS:
            known |= kind == code
        if not bool(known.all()):
            bad = kind[~known][0].item()
            raise ValidationError(f"edge_kind: expected LINK_* codes {_KNOWN_KINDS}, found {bad}")

    f64 = torch.float64
    is_sem = kind == LINK_SEM
    is_sit = (kind == LINK_SIT_ABSTRACT_TO_SPECIFIC) | (kind == LINK_SIT_SPECIFIC_TO_ABSTRACT)
    # Confidence is an f32 in the original; widen the f32 value, never a f64 one.
    conf32 = confidence.to(device=edge_index.device).to(torch.float32).to(f64)
    zero = torch.zeros((), dtype=f64, device=edge_index.device)
    cb = torch.where(is_sem, conf32, torch.where(is_sit, SITUATION_LINK_CONFIDENCE, zero))
    tb = torch.where(is_sem, sem_boost, torch.where(is_sit, sit_boost, zero))

    den = (i_f + c_f) + tb
    num = intensity.to(device=edge_index.device, dtype=f64) * i_f + cb * c_f + tb
    # den == 0 only when every term is 0; the original returns 0 there instead of 0/0.
    safe_den = torch.where(den == 0, 1.0, den)
    weight = torch.where(den == 0, zero, num / safe_den)

    target_is_proc = node_type.to(edge_index.device)[edge_index[1]] == NODE_PROCEDURE
    return torch.where(target_is_proc, zero, weight)


def compute_rowptr(source: Tensor, *, num_nodes: int) -> Tensor:
    """CSR row pointer of edges sorted by source.

    Args:
        source: shape (E,), integer, sorted ascending. ``edge_index[0]``.
        num_nodes: >= 0. Number of nodes ``N``.

    Returns:
        shape (N + 1,), int64. ``rowptr[u]:rowptr[u + 1]`` are ``u``'s out-edges.

    Raises:
        ValidationError: if ``source`` is not sorted or holds an index outside ``[0, N)``.
    """
    if source.dim() != 1:
        raise ValidationError(f"source: expected shape (E,), found {tuple(source.shape)}")
    if source.numel() > 0:
        if bool((source[1:] < source[:-1]).any()):
            raise ValidationError(
                "source: expected edges sorted by source (CSR order), found unsorted"
            )
        lo, hi = int(source[0]), int(source[-1])
        if lo < 0 or hi >= num_nodes:
            raise ValidationError(
                f"source: expected node indices in [0, {num_nodes}), found range [{lo}, {hi}]"
            )
    counts = torch.bincount(source.to(torch.int64), minlength=num_nodes)
    rowptr = source.new_zeros(num_nodes + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=rowptr[1:])
    return rowptr


def out_weight_sum(edge_index: Tensor, edge_weight: Tensor, *, num_nodes: int) -> Tensor:
    """Sum of each node's out-edge weights.

    Args:
        edge_index: shape (2, E), integer.
        edge_weight: shape (E,), float.
        num_nodes: >= 0. ``N``.

    Returns:
        shape (N,), same dtype as ``edge_weight`` (0 for a node without out-edges).
    """
    out = edge_weight.new_zeros(num_nodes)
    return out.scatter_add_(0, edge_index[0], edge_weight)


def normalized_edge_weight(edge_index: Tensor, edge_weight: Tensor, *, num_nodes: int) -> Tensor:
    """Row-normalize edge weights: each weight divided by its source's out-weight sum.

    A node whose out-weights sum to 0 keeps its (zero) weights, as in the original.

    Args:
        edge_index: shape (2, E), integer.
        edge_weight: shape (E,), float (float64 recommended).
        num_nodes: >= 0. ``N``.

    Returns:
        shape (E,), same dtype as ``edge_weight``.
    """
    _check_edge_index(edge_index, num_nodes)
    _check_edge_vector("edge_weight", edge_weight, edge_index.shape[1])
    total = out_weight_sum(edge_index, edge_weight, num_nodes=num_nodes)[edge_index[0]]
    return torch.where(total != 0, edge_weight / torch.where(total != 0, total, 1.0), edge_weight)
