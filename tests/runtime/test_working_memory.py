"""WorkingMemory: state, records, feedback, notes without embeddings, graph, window."""

from __future__ import annotations

import asyncio

import pytest

from soulmem_torch.errors import ValidationError
from soulmem_torch.graph import MemoryGraph
from soulmem_torch.model import MemoryId
from soulmem_torch.runtime import (
    Feedback,
    MemoryCluster,
    SlidingWindow,
    User,
    WorkingMemory,
    WorkingState,
)
from tests.runtime.helpers import embedding, sem, sem_link


def test_state_machine():
    wm = WorkingMemory()
    assert wm.state is WorkingState.IDLE and wm.state is WorkingState.Idle and not wm.is_working
    wm.transition_to_working()
    assert wm.state == WorkingState.Working and wm.is_working
    wm.transition_to_idle()
    assert wm.state is WorkingState.IDLE


def test_add_node_opens_a_record_and_needs_no_embedding():
    wm = WorkingMemory()
    note = sem()
    assert wm.add_node(note)
    assert wm.cluster[note.id].embedding is None
    assert set(wm.records) == {note.id} and wm.records[note.id].retrieval_count == 0
    assert not wm.add_node(sem(id=note.id))  # duplicate: not replaced, record kept
    assert len(wm.records) == 1
    other = sem("with embedding")
    assert wm.add_node(other, embedding())
    assert wm.cluster[other.id].embedding is not None


def test_add_nodes_and_remove_node():
    wm = WorkingMemory()
    a, b = sem("a"), sem("b")
    a.mem_links.append(sem_link(a.id, b.id))
    assert wm.add_nodes([a, b]) == [True, True]
    assert set(wm.records) == {a.id, b.id} and wm.cluster.num_links == 1
    removed = wm.remove_node(b.id)
    assert removed.note is b and b.id not in wm.records and b.id not in wm.cluster
    assert wm.remove_node(MemoryId()) is None


def test_record_retrieval_and_feedback():
    wm = WorkingMemory()
    a, b = sem("a"), sem("b")
    wm.add_nodes([a, b])
    wm.record_retrieval([a.id, a.id, b.id])
    wm.record_retrieval(a.id)
    assert wm.records[a.id].retrieval_count == 3 and wm.records[b.id].retrieval_count == 1
    assert a.retrieval_count == 0  # the note's own count is separate
    for fb in (Feedback.Positive, Feedback.POSITIVE, Feedback.Negative, Feedback.Neutral):
        assert wm.feedback(a.id, fb)
    record = wm.records[a.id]
    assert record.feedback_score == 1
    assert [f for _, f in record.feedback_history] == [
        Feedback.POSITIVE, Feedback.POSITIVE, Feedback.NEGATIVE, Feedback.NEUTRAL,
    ]  # fmt: skip
    assert not wm.feedback(MemoryId(), Feedback.POSITIVE)  # no record: ignored
    stranger = MemoryId()
    wm.record_retrieval([stranger])  # as the original: a record is opened
    assert wm.records[stranger].retrieval_count == 1
    with pytest.raises(ValidationError, match="ids: expected MemoryId"):
        wm.record_retrieval(["not-an-id"])


def test_record_retrieval_can_touch_the_notes():
    wm = WorkingMemory()
    note = sem()
    wm.add_node(note)
    g = wm.graph()
    wm.record_retrieval([note.id], touch_notes=True)
    assert note.retrieval_count == 1
    g2 = wm.graph()
    assert g2 is not g and g2.retrieval_count.tolist() == [1]


def test_graph_and_window_wiring(device):
    cluster = MemoryCluster()
    wm = WorkingMemory(cluster=cluster, window_capacity=2, llm=None)
    wm.add_node(sem())
    assert wm.graph(device) is MemoryGraph.of(cluster, device)
    assert wm.sliding_window.capacity == 2

    async def talk():
        for t in ("a", "b", "c"):
            await wm.push(User(t))

    asyncio.run(talk())
    assert [m.text for m in wm.sliding_window.messages()] == ["b", "c"]
    window = SlidingWindow(5)
    assert WorkingMemory(sliding_window=window).sliding_window is window
    assert "WorkingMemory(state=Idle" in repr(wm)


def test_original_spellings() -> None:
    from tests.runtime.helpers import sem as _sem

    wm = WorkingMemory(10)
    assert wm.sliding_window.capacity == 10
    assert WorkingMemory.new(3).sliding_window.capacity == 3
    assert wm.memory_cluster() is wm.cluster
    note = _sem("x")
    assert wm.memory_cluster().add_single_node(note) is True
    assert note.id in wm.cluster
