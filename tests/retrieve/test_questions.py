"""Free-text questions: the (concept, episode) pair of each question mixed into one answer."""

from __future__ import annotations

import pytest

from soulmem_torch.errors import ValidationError
from soulmem_torch.retrieve import DefaultPipelineResult, mix_by_priority
from soulmem_torch.retrieve.questions import per_query_times, question_results, text_queries


def _result(association, action=(), seeds=(), short_mem=""):
    return DefaultPipelineResult(
        association=list(association), action=list(action), short_history=[],
        short_mem=short_mem, priority=0, seeds=list(seeds),
    )  # fmt: skip


def test_question_results_mix_each_pair_as_mix_by_priority() -> None:
    results = [
        _result([("a", 0.9), ("b", 0.5)], [("x", 0.2)], [("a", 0.9)], short_mem="w1"),
        _result([("b", 0.7), ("c", 0.6)], [("x", 0.4)], [("c", 0.6)]),
        _result([("d", 0.3)]),
        _result([]),
    ]
    out = question_results(results, merge_top_k=2)
    assert len(out) == 2
    first = out[0]
    assert first.association == mix_by_priority(
        [results[0].association, results[1].association], [0, 0], top_k=2
    )
    assert first.action == mix_by_priority([results[0].action, results[1].action], [0, 0])
    assert first.seeds == mix_by_priority([results[0].seeds, results[1].seeds], [0, 0])
    assert first.short_mem == "w1" and [i for i, _ in first.association] == ["a", "b"]
    assert out[1].association == [("d", 0.3)] and out[1].action == []
    assert question_results([], merge_top_k=3) == []
    with pytest.raises(ValidationError, match="pair per question"):
        question_results(results[:3], merge_top_k=2)


def test_text_queries_and_times() -> None:
    concept, episode = text_queries("rain at the café")
    assert concept.variant is not None and episode.variant is not None
    with pytest.raises(ValidationError, match="non-empty string"):
        text_queries("  ")
    assert per_query_times(None, 2) == [None, None]
    with pytest.raises(ValidationError, match="expected 3 times"):
        per_query_times([None], 3)
