"""Mixing the results of several prioritized queries (SPEC §7, the original's evaluation tool)."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import TypeVar

from soulmem_torch.errors import ValidationError

__all__ = ["mix_by_priority", "merge_weighted_sum"]

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
