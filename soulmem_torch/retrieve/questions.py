"""Free-text questions: one question → a concept query and an episode query, and back.

``SoulMem.ask`` and ``MemoryBank.ask`` both run every question as the two structured queries of
:func:`text_queries` in one pipeline batch and mix each pair's memories, actions and seeds into
one answer (:func:`question_results`, max per note, the original's priority mix); ``now``
becomes one time per query (:func:`per_query_times`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from soulmem_torch.errors import ValidationError
from soulmem_torch.model.query import MemoryRetrieveQuery
from soulmem_torch.retrieve.stages import question_results

__all__ = ["per_query_times", "question_results", "text_queries"]


def text_queries(text: str, *, tags: Sequence[str] = ()) -> list[MemoryRetrieveQuery]:
    """A free-text question as two structured queries: a concept and an episode.

    ``Semantic([{concept_identifier: text, description: text}])`` finds concepts;
    ``Situation([{narrative: text}])`` finds specific and abstract situations. ``ask`` runs
    both in one batch and mixes their results (max per note, :func:`question_results`).
    """
    if not isinstance(text, str) or not text.strip():
        raise ValidationError(f"text: expected a non-empty string, found {text!r}")
    return [
        MemoryRetrieveQuery.semantic(
            [{"concept_identifier": text, "description": text}], tag=list(tags)
        ),
        MemoryRetrieveQuery.situation([{"narrative": text}], tag=list(tags)),
    ]


def per_query_times(now: Any, n: int) -> list[datetime | None]:
    """``now`` as one aware datetime (or ``None``) per query: a single value is every query's;
    a sequence must have ``n``."""
    if now is None or isinstance(now, datetime):
        values = [now] * n
    elif isinstance(now, (str, bytes)) or not isinstance(now, Sequence):
        raise ValidationError(
            f"now: expected an aware datetime or one per query, found {type(now).__name__}"
        )
    else:
        values = list(now)
        if len(values) != n:
            raise ValidationError(f"now: expected {n} times (one per query), found {len(values)}")
    for i, v in enumerate(values):
        if v is not None and (not isinstance(v, datetime) or v.utcoffset() is None):
            raise ValidationError(f"now[{i}]: expected an aware datetime or None, found {v!r}")
    return values
