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
from soulmem_torch.retrieve.pipeline import DefaultPipelineResult
from soulmem_torch.retrieve.priority import mix_by_priority_batch

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


def question_results(
    results: Sequence[DefaultPipelineResult], merge_top_k: int
) -> list[DefaultPipelineResult]:
    """One answer per question from the pipeline's answers to its (concept, episode) queries,
    laid out as ``text_queries`` made them (``results[2i]``, ``results[2i + 1]``): memories,
    actions and seeds mixed max per note (equal priorities), memories cut to ``merge_top_k``;
    the short-term window is the first query's. All questions' mixes are one batch."""
    if len(results) % 2:
        raise ValidationError(
            f"results: expected a (concept, episode) pair per question, found {len(results)}"
        )
    pairs = list(zip(results[0::2], results[1::2]))
    q = len(pairs)
    mixed = mix_by_priority_batch(  # the three mixes of every question in one batch
        [[a.association, b.association] for a, b in pairs]
        + [[a.action, b.action] for a, b in pairs]
        + [[a.seeds, b.seeds] for a, b in pairs],
        [0, 0],
    )
    return [
        DefaultPipelineResult(
            association=mixed[i][:merge_top_k],
            action=mixed[q + i],
            short_history=a.short_history,
            short_mem=a.short_mem,
            priority=0,
            seeds=mixed[2 * q + i],
        )
        for i, (a, _) in enumerate(pairs)
    ]
