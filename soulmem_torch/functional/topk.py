"""Exact "stable sort descending, keep the first k", without sorting the whole row."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from soulmem_torch.errors import ValidationError

__all__ = ["stable_argsort_desc", "stable_topk"]

SORT_MAX_ROW = 2048
"""Rows up to this long may be sorted whole on the CPU (:func:`stable_argsort_desc`): numpy's
quicksort of a (1000, 100) block takes ~0.4 ms where ``torch.sort(stable=True)`` takes
~2.9 ms."""


_ONE_KERNEL = 4096
"""Up to this many entries one ``torch.sort`` call beats every multi-step route (a single
query's rows: the per-call overhead dominates)."""


def stable_argsort_desc(key: Tensor) -> Tensor:
    """Indices of a stable descending sort of each row of a 2-D ``key`` (ties: lower column
    first), as ``torch.sort(key, dim=1, descending=True, stable=True).indices``.

    On the CPU (float keys) numpy's unstable quicksort runs first and only the rows where it
    met equal finite-or-+inf values are sorted again stably; the relative order of ``-inf``
    entries is left unspecified (callers use ``-inf`` for "not selectable"). ``key`` must not
    hold NaN. Elsewhere: ``torch.sort``.
    """
    if (
        key.device.type != "cpu"
        or key.dtype not in (torch.float32, torch.float64)
        or key.numel() <= _ONE_KERNEL
    ):
        return torch.sort(key, dim=1, descending=True, stable=True).indices
    neg = -np.ascontiguousarray(key.detach().numpy())
    order = torch.from_numpy(np.argsort(neg, axis=1))
    if neg.shape[1] > 1:
        srt = key.gather(1, order)
        tie = (srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] != float("-inf"))
        rows = tie.any(dim=1).nonzero().reshape(-1)
        if rows.numel():
            again = np.argsort(neg[rows.numpy()], axis=1, kind="stable")
            order[rows] = torch.from_numpy(again)
    return order


def _checked(key: Tensor, vals: Tensor, index: Tensor) -> Tensor:
    """``torch.topk``'s ``index`` made exact: rows whose picked finite values tie, or whose
    k-th value recurs outside the pick, sorted whole and stably."""
    k = index.shape[1]
    kth = vals[:, -1:]
    live = kth > float("-inf")
    straddle = (key == kth).sum(dim=1, keepdim=True) != (vals == kth).sum(dim=1, keepdim=True)
    adjacent = ((vals[:, 1:] == vals[:, :-1]) & (vals[:, 1:] > float("-inf"))).any(
        dim=1, keepdim=True
    )
    rows = ((straddle & live) | adjacent).reshape(-1).nonzero().reshape(-1)
    if rows.numel():
        index[rows] = stable_argsort_desc(key.index_select(0, rows))[:, :k]
    return index


def _first_k(key: Tensor, k: int, selectable: int | None = None) -> Tensor:
    """(R, k) column indices of the first ``k`` entries of each row's stable descending sort
    of a 2-D CPU float ``key`` (no NaN; ``-inf`` = not selectable, their order unspecified;
    rows at most :data:`SORT_MAX_ROW` long).

    numpy's ``argpartition`` (``torch.topk`` when most of ``key`` is ``-inf``; ``selectable``:
    how many entries are not, if known) picks the k largest and a small sort orders them; the
    order among equal values is unspecified there, so a row where two finite picked values are
    equal, or where the k-th value also occurs outside the pick, is sorted whole
    (:func:`stable_argsort_desc`) instead.
    """
    if 4 * k > key.shape[1] or key.numel() <= _ONE_KERNEL:  # one sort is cheaper
        return stable_argsort_desc(key)[:, :k]
    if selectable is None:
        selectable = int((key > float("-inf")).sum())
    if 4 * selectable < key.numel():  # mostly -inf: torch.topk is the faster pick there
        return _checked(key, *torch.topk(key, k, dim=1))
    # numpy's introselect picks the k largest (unordered; ~1.6x faster than torch.topk on
    # dense rows), a sort of the k orders them
    neg = -np.ascontiguousarray(key.detach().numpy())
    pick = np.argpartition(neg, k - 1, axis=1)[:, :k]
    vals = np.take_along_axis(neg, pick, axis=1)
    order = np.argsort(vals, axis=1)
    index = np.take_along_axis(pick, order, axis=1)
    vals = np.take_along_axis(vals, order, axis=1)
    kth = vals[:, -1:]
    live = kth != np.inf  # (-inf keys are +inf here: not selectable, their order is free)
    straddle = (neg == kth).sum(axis=1, keepdims=True) != (vals == kth).sum(axis=1, keepdims=True)
    adjacent = ((vals[:, 1:] == vals[:, :-1]) & (vals[:, 1:] != np.inf)).any(axis=1, keepdims=True)
    rows = np.flatnonzero((straddle & live) | adjacent)
    out = torch.from_numpy(index)
    if rows.size:
        again = torch.from_numpy(rows)
        out[again] = stable_argsort_desc(key.index_select(0, again))[:, :k]
    return out


def stable_topk(
    scores: Tensor, k: int, *, dim: int = -1, mask: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """The first ``k`` entries of a stable descending sort along ``dim`` (ties: lower index first).

    ``torch.topk`` finds the k-th value ``t``; every selectable entry above ``t`` is kept and,
    among entries equal to ``t``, the lowest indices fill the remaining places — the set a
    stable descending sort would keep — which are then ordered by (value descending, index
    ascending). O(size) per row plus two small sorts of k, instead of a full sort.

    Args:
        scores: any shape; compared as given (map NaN beforehand if it may occur).
        k: >= 0; clipped to the size of ``dim``.
        dim: the dimension to select along.
        mask: shape as ``scores``, bool. Entries that may be selected (default: all). Rows with
            fewer than ``k`` selectable entries are padded; ``valid`` tells which are real.

    Returns:
        ``(values, indices, valid)`` with ``min(k, size)`` entries along ``dim``.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValidationError(f"k: expected an int >= 0, found {k!r}")
    x = scores.movedim(dim, -1)
    m = torch.ones_like(x, dtype=torch.bool) if mask is None else mask.movedim(dim, -1)
    k = min(k, x.shape[-1])
    if k == 0 or x.numel() == 0:
        empty = x[..., :k]
        out = (empty, empty.long(), empty.bool())
        return tuple(t.movedim(-1, dim) for t in out)  # type: ignore[return-value]
    key = torch.where(m, x, torch.full_like(x, float("-inf")))
    if (
        x.device.type == "cpu"
        and x.shape[-1] <= SORT_MAX_ROW
        and x.dtype in (torch.float32, torch.float64)
        and (selectable := int(m.sum())) == int((key > float("-inf")).sum())
    ):  # (no selectable -inf / NaN)
        lead, n = x.shape[:-1], x.shape[-1]
        index = _first_k(key.reshape(-1, n), k, selectable)
        out = (x.reshape(-1, n).gather(1, index), index, m.reshape(-1, n).gather(1, index))
        return tuple(t.reshape(*lead, k).movedim(-1, dim) for t in out)  # type: ignore[return-value]
    kth = torch.topk(key, k, dim=-1).values[..., -1:]
    above = (key > kth) & m
    tied = (key == kth) & m
    need = k - above.sum(dim=-1, keepdim=True)
    if bool((tied.sum(dim=-1, keepdim=True) <= need).all()):
        selected = above | tied  # no tie straddles the cut (the usual case): no scan
    else:
        selected = above | (tied & (torch.cumsum(tied, dim=-1) <= need))
    # the k selected positions (a 0/1 top-k: selected entries at -inf are still found first)
    index = torch.topk(selected.to(x.dtype if x.is_floating_point() else torch.float32), k,
                       dim=-1).indices  # fmt: skip
    index = index.sort(dim=-1).values
    by_value = torch.argsort(key.gather(-1, index), dim=-1, descending=True, stable=True)
    index = index.gather(-1, by_value)
    valid = selected.gather(-1, index)
    values = x.gather(-1, index)
    return values.movedim(-1, dim), index.movedim(-1, dim), valid.movedim(-1, dim)
