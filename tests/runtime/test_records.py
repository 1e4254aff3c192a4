"""Record and Feedback (the original's record.rs tests)."""

from __future__ import annotations

from datetime import timedelta

from soulmem_torch.model import MemoryId, Timestamp
from soulmem_torch.runtime import Feedback, Record

T = Timestamp.from_ns(1_700_000_000_000_000_000)


def test_new_record():
    mid = MemoryId()
    record = Record.new(mid, now=T)
    assert record.memory_id == mid and record.retrieval_count == 0 and record.feedback_score == 0
    assert record.first_access_time == record.last_access_time == T
    assert record.access_time_span() == 0


def test_record_retrieval_and_time_span():
    record = Record.new(MemoryId(), now=T)
    for i in range(1, 4):
        record.record_retrieval(now=T + timedelta(seconds=1.5 * i))
        assert record.retrieval_count == i
    assert record.access_time_span() == 4  # 4.5 s, truncated
    record.record_retrieval()  # the current time
    assert record.last_access_time > T


def test_feedback_score_and_history_queries():
    record = Record.new(MemoryId(), now=T)
    times = [T + timedelta(seconds=s) for s in (1, 2, 3, 4, 5)]
    for t, fb in zip(times, ["Positive", "Positive", "Negative", "Neutral", Feedback.Positive]):
        record.add_feedback(fb, now=t)
    assert record.feedback_score == 2
    assert len(record.feedback_between(times[1], times[3])) == 3
    assert record.feedback_between(times[3], times[1]) == []
    assert [f for _, f in record.feedback_after(times[3])] == [Feedback.NEUTRAL, Feedback.POSITIVE]
    assert [f for _, f in record.feedback_before(times[1])] == [Feedback.POSITIVE]
    assert record.feedback_before(T) == []


def test_feedback_enum():
    assert [f.score for f in Feedback] == [1, -1, 0]
    assert Feedback("Negative") is Feedback.NEGATIVE is Feedback.Negative
    assert len(Feedback) == 3


def test_record_json_roundtrip():
    record = Record.new(MemoryId(), now=T)
    record.record_retrieval(now=T + timedelta(seconds=2))
    record.add_feedback(Feedback.POSITIVE, now=T + timedelta(seconds=3))
    text = record.model_dump_json()
    back = Record.model_validate_json(text)
    assert back == record
    assert '"Positive"' in text
