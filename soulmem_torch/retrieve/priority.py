"""Mixing the results of several prioritized queries (docs/spec.md §7, the original's evaluation tool)."""

from __future__ import annotations

from array import array
from collections.abc import Hashable, Iterable, Sequence
from typing import TypeVar

import torch

from soulmem_torch.errors import ValidationError

__all__ = ["mix_by_priority", "mix_by_priority_batch", "merge_weighted_sum"]

K = TypeVar("K", bound=Hashable)


def _check_priorities(priorities: Sequence[float]) -> None:
    for i, p in enumerate(priorities):
        if not (p == p) or p < 0:  # NaN or negative
            raise ValidationError(f"priorities[{i}]: expected a number >= 0, found {p!r}")


def mix_by_priority(
    results: Sequence[Iterable[tuple[K, float]]],
    priorities: Sequence[float],
    *,
    bonus: float = 0.05,
    top_k: int | None = None,
) -> list[tuple[K, float]]:
    """Mixes ranked lists: ``score + bonus · priority / max_priority``, best per id, descending.

    Ties keep first-seen order. ``max_priority == 0`` → no bonus.
    """
    if len(results) != len(priorities):
        raise ValidationError(
            f"priorities: expected one per result list ({len(results)}), found {len(priorities)}"
        )
    _check_priorities(priorities)
    max_p = max(priorities, default=0)
    best: dict[K, float] = {}
    for items, p in zip(results, priorities):
        extra = bonus * p / max_p if max_p > 0 else 0.0
        for key, score in items:
            value = float(score) + extra
            if key not in best or value > best[key]:
                best[key] = value
    ranked = sorted(best.items(), key=lambda kv: -kv[1])
    return ranked if top_k is None else ranked[:top_k]


def mix_by_priority_batch(
    groups: Sequence[Sequence[Iterable[tuple[K, float]]]],
    priorities: Sequence[float],
    *,
    bonus: float = 0.05,
    top_k: int | None = None,
) -> list[list[tuple[K, float]]]:
    """:func:`mix_by_priority` of every group of ranked lists (list ``i`` of each group has
    ``priorities[i]``), the whole batch at once: same lists, same scores, same order.

    The ids are numbered once for the batch (by object identity first, so the Python-level
    ``MemoryId.__hash__`` runs once per distinct id object rather than per item); the best score
    per (group, id), its first-seen position and the ranking are tensor ops over all groups.
    """
    for g, lists in enumerate(groups):
        if len(lists) != len(priorities):
            raise ValidationError(
                f"groups[{g}]: expected one result list per priority ({len(priorities)}), "
                f"found {len(lists)}"
            )
    _check_priorities(priorities)
    max_p = max(priorities, default=0)
    extras = [bonus * p / max_p if max_p > 0 else 0.0 for p in priorities]
    lists = [items if isinstance(items, list) else list(items) for g in groups for items in g]
    if not any(lists):
        return [[] for _ in groups]
    list_sizes = torch.frombuffer(array("q", map(len, lists)), dtype=torch.int64)
    flat = [pair for items in lists for pair in items]
    ks, ss = zip(*flat)
    objects = list(map(id, ks))  # the keys stay alive in ``groups`` while their ids are used
    by_object: dict[int, int] = {}  # id(key) -> code
    by_value: dict[K, int] = {}  # key -> code, for equal keys that are distinct objects
    keys: list[K] = []
    for obj, k in dict(zip(objects, ks)).items():  # one entry per distinct key object
        by_object[obj] = code = by_value.setdefault(k, len(keys))
        if code == len(keys):
            keys.append(k)
    codes = torch.frombuffer(array("q", map(by_object.__getitem__, objects)), dtype=torch.int64)
    vals = torch.frombuffer(array("d", map(float, ss)), dtype=torch.float64)
    if any(extras):  # float64 adds, as ``float(score) + extra``
        vals += torch.tensor(extras * len(groups), dtype=torch.float64).repeat_interleave(
            list_sizes
        )
    if bool(torch.isnan(vals).any()):  # NaN compares like nothing else: the per-group rules
        return [mix_by_priority(g, priorities, bonus=bonus, top_k=top_k) for g in groups]
    sizes = list_sizes.view(len(groups), len(priorities)).sum(dim=1)
    num_groups, num_keys = len(groups), len(keys)
    group = torch.repeat_interleave(torch.arange(num_groups), sizes)
    pair = group * num_keys + codes  # (group, key)
    uniq, inverse = torch.unique(pair, return_inverse=True)
    m = int(uniq.shape[0])
    best = torch.zeros(m, dtype=torch.float64).scatter_reduce_(
        0, inverse, vals, "amax", include_self=False
    )
    first = torch.zeros(m, dtype=torch.int64).scatter_reduce_(
        0, inverse, torch.arange(len(flat)), "amin", include_self=False
    )
    # group ascending, then score descending, then first seen (successive stable sorts)
    order = torch.argsort(first, stable=True)
    order = order[torch.argsort(-best[order], stable=True)]
    order = order[torch.argsort(uniq[order] // num_keys, stable=True)]
    counts = torch.bincount(uniq // num_keys, minlength=num_groups).tolist()
    out_codes = (uniq[order] % num_keys).tolist()
    out_values = best[order].tolist()
    out: list[list[tuple[K, float]]] = []
    start = 0
    for count in counts:
        stop = start + (count if top_k is None else len(range(count)[:top_k]))  # as [:top_k]
        out.append([(keys[c], v) for c, v in zip(out_codes[start:stop], out_values[start:stop])])
        start += count
    return out


def merge_weighted_sum(
    results: Sequence[Iterable[tuple[K, float]]],
    priorities: Sequence[float],
    *,
    top_k: int | None = None,
) -> list[tuple[K, float]]:
    """Σ priority × score per id (the evaluation suites' merge, docs/spec.md §9), descending, cut."""
    if len(results) != len(priorities):
        raise ValidationError(
            f"priorities: expected one per result list ({len(results)}), found {len(priorities)}"
        )
    _check_priorities(priorities)
    total: dict[K, float] = {}
    for items, p in zip(results, priorities):
        for key, score in items:
            total[key] = total.get(key, 0.0) + float(p) * float(score)
    ranked = sorted(total.items(), key=lambda kv: -kv[1])
    return ranked if top_k is None else ranked[:top_k]
