"""Which notes were active in a consolidation cycle: :func:`select_active_nodes` (docs/spec.md §10)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from soulmem_torch.errors import ValidationError

__all__ = ["select_active_nodes"]


def _check_count(name: str, value: Any, low: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValidationError(f"{name}: expected an int >= {low}, found {value!r}")
    return value


def select_active_nodes(
    records: Mapping[Any, Any],
    cycle_hits: Mapping[Any, int],
    top_k: int = 8,
    min_cycle_hits: int = 1,
) -> list[Any]:
    """The notes most retrieved during this cycle, most active first.

    Keeps the ids with ``cycle_hits >= min_cycle_hits``; sorts them by cycle hits (descending),
    then by their record's total ``retrieval_count`` (descending; 0 for an id without a
    record), then by id (ascending); returns the first ``top_k``.

    Args:
        records: id → ``Record`` (``working_memory.records``).
        cycle_hits: id → retrievals during the cycle.
        top_k: >= 0.
        min_cycle_hits: >= 0.

    Example:
        >>> from soulmem_torch.model import MemoryId
        >>> ids = [MemoryId() for _ in range(5)]
        >>> hits = dict(zip(ids, [1, 2, 3, 4, 5]))
        >>> [hits[i] for i in select_active_nodes({}, hits, top_k=3)]
        [5, 4, 3]
    """
    top_k = _check_count("top_k", top_k, 0)
    min_cycle_hits = _check_count("min_cycle_hits", min_cycle_hits, 0)
    if not isinstance(records, Mapping):
        raise ValidationError(f"records: expected a mapping id -> Record, found {records!r:.60}")
    if not isinstance(cycle_hits, Mapping):
        raise ValidationError(f"cycle_hits: expected a mapping id -> int, found {cycle_hits!r:.60}")
    rows = []
    for mid, hits in cycle_hits.items():
        hits = _check_count(f"cycle_hits[{mid}]", hits, 0)
        if hits < min_cycle_hits:
            continue
        record = records.get(mid)
        total = 0 if record is None else int(record.retrieval_count)
        rows.append((-hits, -total, mid))
    rows.sort(key=lambda row: (row[0], row[1], row[2].int))
    return [mid for _, _, mid in rows[:top_k]]
