"""Ids in, ids out: scored ``MemoryId`` lists of B requests as ``(N, B)`` columns, and columns
back to ``[(MemoryId, score)]`` lists (stable top-k, one host transfer).

Everything between works on a ``MemoryGraph`` and ``(N, B)`` matrices (one column per request),
so one request and a thousand take the same code path; ids become indices here on the way in
and ids again here, once, on the way out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from soulmem_torch._gcpause import gc_paused
from soulmem_torch.errors import ValidationError
from soulmem_torch.functional.codes import NODE_ABSTRACT, NODE_SPECIFIC
from soulmem_torch.functional.topk import stable_topk
from soulmem_torch.model import MemoryId

__all__ = [
    "Source",
    "situation_mask",
    "sources_matrix",
    "topk_lists",
    "topk_mask",
    "topk_select",
]

Source = Sequence[tuple[MemoryId, float]]


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


def topk_select(
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
    return topk_select(scores, present, top_k)[0]


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
    _, values, index, valid = topk_select(scores, present, top_k)
    if as_float32:
        values = values.to(torch.float32)
    ids = graph.ids
    with gc_paused():  # B·k fresh tuples, none cyclic (see soulmem_torch._gcpause)
        return [
            [(ids[i], v) for v, i, kk in zip(vrow, irow, krow) if kk]
            for vrow, irow, krow in zip(values.tolist(), index.tolist(), valid.tolist())
        ]


def situation_mask(graph: Any) -> Tensor:
    """Bool (N,): Specific or Abstract situation notes."""
    nt = graph.node_type
    return (nt == NODE_SPECIFIC) | (nt == NODE_ABSTRACT)
