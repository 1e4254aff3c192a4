"""Mixing the results of several prioritized queries (SPEC §7, the original's evaluation tool)."""

from __future__ import annotations

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
    by_object: dict[int, int] = {}  # id(key) -> code (the keys stay alive in ``groups``)
    by_value: dict[K, int] = {}  # key -> code, for equal keys that are distinct objects
    keys: list[K] = []
    codes: list[int] = []
    values: list[float] = []
    sizes: list[int] = []
    for lists in groups:
        size = 0
        for items, extra in zip(lists, extras):
            pairs = list(items)
            if not pairs:
                continue
            ks, ss = zip(*pairs)
            for k in ks:
                c = by_object.get(id(k))
                if c is None:
                    c = by_object[id(k)] = by_value.setdefault(k, len(keys))
                    if c == len(keys):
                        keys.append(k)
                codes.append(c)
            values.extend(float(x) + extra for x in ss)
            size += len(pairs)
        sizes.append(size)
    if not values:
        return [[] for _ in groups]
    vals = torch.tensor(values, dtype=torch.float64)
    if bool(torch.isnan(vals).any()):  # NaN compares like nothing else: the per-group rules
        return [mix_by_priority(lists, priorities, bonus=bonus, top_k=top_k) for lists in groups]
    num_groups, num_keys = len(sizes), len(keys)
    group = torch.repeat_interleave(torch.arange(num_groups), torch.tensor(sizes))
    pair = group * num_keys + torch.tensor(codes, dtype=torch.int64)  # (group, key)
    uniq, inverse = torch.unique(pair, return_inverse=True)
    m = int(uniq.shape[0])
    best = torch.zeros(m, dtype=torch.float64).scatter_reduce_(
        0, inverse, vals, "amax", include_self=False
    )
    first = torch.zeros(m, dtype=torch.int64).scatter_reduce_(
        0, inverse, torch.arange(len(values)), "amin", include_self=False
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
    """Σ priority × score per id (the evaluation suites' merge, SPEC §9), descending, cut."""
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
