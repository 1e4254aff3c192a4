"""Batched building blocks shared by the strategies: devices, cached operators, PPR, top-k.

Everything here works on a ``MemoryGraph`` and ``(N, B)`` matrices (one column per request), so
one request and a thousand take the same code path. Ids are converted to indices on the way in
and back to ids once on the way out.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from soulmem_torch.errors import DeviceResolutionError, ValidationError
from soulmem_torch.functional.codes import NODE_ABSTRACT, NODE_SPECIFIC
from soulmem_torch.functional.edge_weights import dynamic_edge_weight
from soulmem_torch.functional.ppr import (
    TransitionOperator,
    build_transition,
    ppr_forward_push,
    ppr_power_iteration,
    ppr_sequential_push,
)
from soulmem_torch.functional.ppr_dense import ppr_dense
from soulmem_torch.functional.topk import stable_topk
from soulmem_torch.model import MemoryId
from soulmem_torch.retrieve._gcpause import gc_paused
from soulmem_torch.retrieve.config import (
    AUTO_SEQUENTIAL_MAX_NODES,
    AssociationConfig,
    PprMethod,
)

__all__ = [
    "BATCH_BYTES_PER_NOTE",
    "DEFAULT_MAX_BATCH_BYTES",
    "batch_chunk_size",
    "edge_weights",
    "max_batch_bytes",
    "resolve_device",
    "resolve_method",
    "run_association",
    "sources_matrix",
    "situation_mask",
    "topk_lists",
    "topk_mask",
    "transition",
]

Source = Sequence[tuple[MemoryId, float]]

DEFAULT_MAX_BATCH_BYTES: int = 512 * 2**20
"""Working-memory budget of one batched call (512 MiB) unless ``SOULMEM_MAX_BATCH_BYTES`` says
otherwise: the strategies split a large batch into chunks that fit it (see
:func:`batch_chunk_size`)."""
BATCH_BYTES_PER_NOTE: int = 192
"""Bytes one query needs per note while a strategy runs (about 24 float64 ``(N,)`` columns:
personalization, iterates, scores, masks and top-k buffers of every stage)."""


def max_batch_bytes() -> int:
    """The batch memory budget: env ``SOULMEM_MAX_BATCH_BYTES`` (an integer number of bytes,
    > 0), else :data:`DEFAULT_MAX_BATCH_BYTES`.

    Raises:
        ValidationError: the variable is set but not a positive integer.
    """
    raw = os.environ.get("SOULMEM_MAX_BATCH_BYTES")
    if raw is None or not raw.strip():
        return DEFAULT_MAX_BATCH_BYTES
    try:
        value = int(raw.strip().replace("_", ""))
    except ValueError:
        value = 0
    if value <= 0:
        raise ValidationError(
            f"SOULMEM_MAX_BATCH_BYTES: expected a positive integer number of bytes, found {raw!r}"
        )
    return value


def batch_chunk_size(num_nodes: int, batch: int, *, budget: int | None = None) -> int:
    """How many of ``batch`` queries on a ``num_nodes``-note memory run at once.

    ``budget // (num_nodes * BATCH_BYTES_PER_NOTE)``, clamped to ``[1, batch]``: a call's extra
    memory stays ``O(num_nodes x chunk)`` whatever the batch size. Queries never interact, so a
    query gets the same notes in the same order in any chunk; its scores are those of a batch
    of the chunk's size (the forward push is bit-identical for any batch; a BLAS / sparse
    product may round the last bits differently for another batch shape).

    Args:
        num_nodes: >= 0. Notes in the memory.
        batch: >= 0. Queries in the call.
        budget: bytes; ``None`` = :func:`max_batch_bytes`.
    """
    budget = max_batch_bytes() if budget is None else int(budget)
    per_query = max(int(num_nodes), 1) * BATCH_BYTES_PER_NOTE
    return max(1, min(int(batch), budget // per_query))


def resolve_device(device: torch.device | str | None) -> torch.device:
    """``None`` → CPU; ``"auto"`` → CUDA when available, else CPU; otherwise as given."""
    if device is None:
        return torch.device("cpu")
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise DeviceResolutionError(
            f"device: expected None, 'auto', 'cpu', 'cuda' or 'cuda:N', found {device!r} ({exc})"
        ) from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DeviceResolutionError(
            f"device: {device!r} asked for CUDA, but torch.cuda.is_available() is False"
        )
    return dev


def _weight_key(config: AssociationConfig) -> tuple[Any, ...]:
    return (
        config.preference.boosts,
        config.resolved_intensity_factor,
        config.resolved_confidence_factor,
    )


def dynamic_weights(graph: Any, config: AssociationConfig) -> Tensor:
    """Dynamic edge weights (docs/spec.md §5), float64, of anything with a snapshot's edge
    fields (``edge_index``, ``edge_kind``, ``intensity``, ``confidence``, ``node_type``): one
    agent's snapshot or the bank's union. Not cached (see :func:`edge_weights`)."""
    return dynamic_edge_weight(
        graph.edge_index,
        graph.edge_kind,
        graph.intensity,
        graph.confidence,
        graph.node_type,
        preference=config.preference.boosts,
        intensity_factor=config.resolved_intensity_factor,
        confidence_factor=config.resolved_confidence_factor,
    )


def edge_weights(graph: Any, config: AssociationConfig) -> Tensor:
    """Dynamic edge weights (docs/spec.md §5), float64, cached on the snapshot per preference/factors."""
    key = ("edge_weight", *_weight_key(config))
    cached = graph.cache.get(key)
    if cached is None:
        cached = graph.cache[key] = dynamic_weights(graph, config)
    return cached


def transition(graph: Any, config: AssociationConfig) -> TransitionOperator:
    """The row-normalized transition operator, built once per snapshot and preference."""
    key = ("transition", *_weight_key(config))
    cached = graph.cache.get(key)
    if cached is None:
        cached = build_transition(
            graph.edge_index, edge_weights(graph, config), num_nodes=int(graph.num_nodes)
        )
        graph.cache[key] = cached
    return cached


def sources_matrix(
    graph: Any, sources: Sequence[Source], *, float32_scores: bool, what: str = "source"
) -> tuple[Tensor, Tensor]:
    """Scored ids of B requests → ``(weights (N, B) float64, keys (N, B) bool)``.

    Unknown ids are dropped; a repeated id keeps its last score. With ``float32_scores`` the
    scores are rounded to float32 first and widened (the original's ``f32`` similarity scores).

    Raises:
        ValidationError: a score that is NaN, infinite or negative (naming the request and id).
    """
    n = int(graph.num_nodes)
    b = len(sources)
    index_of = graph.index_of
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    for j, source in enumerate(sources):
        seen: dict[int, float] = {}
        for item in source:
            try:
                mid, score = item
            except (TypeError, ValueError):
                raise ValidationError(
                    f"{what}[{j}]: expected (MemoryId, score) pairs, found {item!r}"
                ) from None
            score = float(score)
            if not (score >= 0.0 and score != float("inf")):
                raise ValidationError(
                    f"{what}[{j}]: expected finite scores >= 0, found {score!r} for {mid}"
                )
            i = index_of.get(mid)
            if i is not None:
                seen[i] = score
        rows.extend(seen)
        cols.extend([j] * len(seen))
        vals.extend(seen.values())
    device = graph.device
    weights = torch.zeros(n, b, dtype=torch.float64)
    keys = torch.zeros(n, b, dtype=torch.bool)
    if rows:
        r = torch.tensor(rows, dtype=torch.int64)
        c = torch.tensor(cols, dtype=torch.int64)
        v = torch.tensor(vals, dtype=torch.float32 if float32_scores else torch.float64)
        weights[r, c] = v.to(torch.float64)
        keys[r, c] = True
    return weights.to(device), keys.to(device)


def resolve_method(method: PprMethod, *, num_nodes: int, device: torch.device) -> PprMethod:
    """``auto`` → ``sequential`` on a CPU graph of ≤ 4096 notes, else ``power``."""
    if method is not PprMethod.AUTO:
        return method
    if device.type == "cpu" and num_nodes <= AUTO_SEQUENTIAL_MAX_NODES:
        return PprMethod.SEQUENTIAL
    return PprMethod.POWER


def power_ppr(
    operator: TransitionOperator, weights: Tensor, keys: Tensor, config: AssociationConfig
) -> Tensor:
    """The ``power`` method on one operator: the exact dense solve (:func:`~soulmem_torch.
    functional.ppr_dense.ppr_dense`, its inverse cached on ``operator``) for a graph of at most
    ``config.power_dense_max_nodes`` notes, else the power iteration to ``config.power_tol``.
    The choice depends only on the graph's size, so a query scores the same in any batch.

    Args:
        operator: the graph's transition (directed or undirected).
        weights: (N, B) float64 personalization, every column with a positive sum.
        keys: (N, B) bool, the keys.

    Returns:
        (N, B) float64, columns normalized.
    """
    if operator.num_nodes <= config.power_dense_max_nodes:
        return ppr_dense(operator, weights, key_mask=keys, damping=config.damping_factor)
    return ppr_power_iteration(
        operator,
        weights,
        key_mask=keys,
        damping=config.damping_factor,
        tol=config.power_tol,
        dtype=torch.float32 if config.power_dtype == "float32" else torch.float64,
        local=config.power_local,
    )


def run_association(
    graph: Any, weights: Tensor, keys: Tensor, config: AssociationConfig
) -> tuple[Tensor, Tensor]:
    """PPR of every column with the configured method → ``(scores (N, B) f64, ok (B,) bool)``.

    A column with no key or a zero weight sum gives ``ok = False`` (the strategies return ``[]``).
    """
    n = int(graph.num_nodes)
    b = weights.shape[1]
    ok = keys.any(dim=0) & (weights.sum(dim=0) > 0)
    if n == 0 or not bool(ok.any()):
        return torch.zeros(n, b, dtype=torch.float64, device=weights.device), ok
    every = bool(ok.all())  # the usual case: no (N, B) copies of the inputs or the result
    cols = ok.nonzero().reshape(-1)
    p, k = (weights, keys) if every else (weights[:, cols], keys[:, cols])
    damping, threshold = config.damping_factor, config.residue_threshold
    method = resolve_method(config.method, num_nodes=n, device=weights.device)
    if method is PprMethod.SEQUENTIAL:
        edge_index = graph.edge_index.cpu()
        w = edge_weights(graph, config).cpu()
        pc, kc = p.cpu(), k.cpu()
        results = []
        for j in range(pc.shape[1]):  # the parity oracle is sequential by definition
            idx = kc[:, j].nonzero().reshape(-1)
            r = ppr_sequential_push(
                edge_index, w, idx, pc[idx, j], num_nodes=n, damping=damping, threshold=threshold
            )
            results.append(r if r.numel() else torch.zeros(n, dtype=torch.float64))
        res = torch.stack(results, dim=1).to(weights.device)
    elif method is PprMethod.PUSH:
        res = ppr_forward_push(
            transition(graph, config), p, key_mask=k, damping=damping, threshold=threshold
        )
    else:
        res = power_ppr(transition(graph, config), p, k, config)
    ok = ok.clone()
    ok[cols] = res.sum(dim=0) > 0
    if every:
        return res, ok
    out = torch.zeros(n, b, dtype=torch.float64, device=weights.device)
    out[:, cols] = res
    return out, ok


def _topk_select(
    scores: Tensor, present: Tensor, top_k: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per column of ``scores`` (N, B): the first ``top_k`` present entries of a stable
    descending sort (:func:`~soulmem_torch.functional.topk.stable_topk`).

    Returns:
        ``selected (N, B) bool``, ``values (B, k)``, ``index (B, k)`` and ``valid (B, k)``
        (False where a column had fewer than k present entries).
    """
    n, b = scores.shape
    values, index, valid = stable_topk(scores.T, int(top_k), mask=present.T)
    selected = torch.zeros(b, n, dtype=torch.bool, device=scores.device)
    selected.scatter_(1, index, valid)
    return selected.T, values, index, valid


def topk_mask(scores: Tensor, present: Tensor, top_k: int) -> Tensor:
    """Bool (N, B): the entries :func:`topk_lists` would return."""
    return _topk_select(scores, present, top_k)[0]


def topk_lists(
    graph: Any,
    scores: Tensor,
    present: Tensor,
    top_k: int,
    *,
    as_float32: bool = False,
) -> list[list[tuple[MemoryId, float]]]:
    """Per column: entries where ``present`` is True, stable-sorted descending, first ``top_k``.

    Ties keep node order. ``scores``/``present``: shape (N, B). One host transfer in all.
    """
    n, b = scores.shape
    if n == 0 or b == 0:
        return [[] for _ in range(b)]
    _, values, index, valid = _topk_select(scores, present, top_k)
    if as_float32:
        values = values.to(torch.float32)
    ids = graph.ids
    with gc_paused():  # B·k fresh tuples, none cyclic (see _gcpause)
        return [
            [(ids[i], v) for v, i, kk in zip(vrow, irow, krow) if kk]
            for vrow, irow, krow in zip(values.tolist(), index.tolist(), valid.tolist())
        ]


def situation_mask(graph: Any) -> Tensor:
    """Bool (N,): Specific or Abstract situation notes."""
    nt = graph.node_type
    return (nt == NODE_SPECIFIC) | (nt == NODE_ABSTRACT)
