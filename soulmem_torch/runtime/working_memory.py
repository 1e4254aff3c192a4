"""``WorkingMemory``: state, sliding window, memory cluster and access records (docs/spec.md §2).

Example:
    >>> from soulmem_torch.model import MemoryNote, SemMemory
    >>> wm = WorkingMemory(window_capacity=4)
    >>> note = MemoryNote.build(SemMemory(content="tea", aliases=[], concept_type="Entity",
    ...                                   description=""))
    >>> wm.add_node(note)            # a note may have no embedding
    True
    >>> wm.record_retrieval([note.id])
    >>> wm.feedback(note.id, Feedback.POSITIVE)
    True
    >>> wm.records[note.id].retrieval_count, wm.records[note.id].feedback_score
    (1, 1)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from enum import Enum
from typing import TYPE_CHECKING

from soulmem_torch.embedding.fields import EmbeddedMemoryNote, MemoryEmbedding
from soulmem_torch.errors import ValidationError
from soulmem_torch.model.ids import MemoryId
from soulmem_torch.model.notes import MemoryNote
from soulmem_torch.model.timestamp import Timestamp
from soulmem_torch.runtime.cluster import MemoryCluster
from soulmem_torch.runtime.records import Feedback, Record
from soulmem_torch.runtime.window import Information, LLMCallable, PushResult, SlidingWindow

if TYPE_CHECKING:
    import torch

    from soulmem_torch.graph import MemoryGraph

__all__ = ["WorkingMemory", "WorkingState"]


class WorkingState(str, Enum):
    """``Idle`` or ``Working``. ``WorkingState.Idle`` / ``.Working`` are aliases."""

    IDLE = "Idle"
    WORKING = "Working"
    Idle = "Idle"
    Working = "Working"


class WorkingMemory:
    """The agent's working memory: ``state``, ``sliding_window``, ``cluster``, ``records``.

    Args:
        cluster: the long-term graph to work on; ``None`` -> a new empty ``MemoryCluster``.
        sliding_window: the short-term window; ``None`` -> ``SlidingWindow(window_capacity,
            llm, timeout=summary_timeout)``.
        window_capacity: >= 1, used only when ``sliding_window`` is ``None``.
        llm: summary LLM ``(system, user) -> str``, used only when ``sliding_window`` is None.
        summary_timeout: seconds or ``None``, used only when ``sliding_window`` is ``None``.
    """

    def __init__(
        self,
        window_capacity: int = 20,
        *,
        cluster: MemoryCluster | None = None,
        sliding_window: SlidingWindow | None = None,
        llm: LLMCallable | None = None,
        summary_timeout: float | None = None,
    ) -> None:
        self.state = WorkingState.IDLE
        self.cluster = cluster if cluster is not None else MemoryCluster()
        self.sliding_window = (
            sliding_window
            if sliding_window is not None
            else SlidingWindow(window_capacity, llm, timeout=summary_timeout)
        )
        self.records: dict[MemoryId, Record] = {}
        # ids whose record was opened, changed or dropped since the last save took them
        self.records_changed: set[MemoryId] = set()
        self.retrieval_revision = 0
        """Counts :meth:`record_retrieval` calls that recorded something (the original's
        retrieval revision: a plasticity update runs only when it moved since the last one)."""
        self.plasticity_revision = 0
        """:attr:`retrieval_revision` at the last plasticity update
        (:func:`soulmem_torch.consolidate.update_plasticity`)."""

    @classmethod
    def new(cls, window_capacity: int = 20) -> WorkingMemory:
        """``WorkingMemory::new(capacity)``: an empty memory with a window of that capacity."""
        return cls(window_capacity)

    def memory_cluster(self) -> MemoryCluster:
        """The cluster (the original's accessor name)."""
        return self.cluster

    def __repr__(self) -> str:
        return (
            f"WorkingMemory(state={self.state.value}, cluster={self.cluster!r}, "
            f"window={self.sliding_window!r}, records={len(self.records)})"
        )

    # -- state ----------------------------------------------------------------------------
    @property
    def is_working(self) -> bool:
        return self.state is WorkingState.WORKING

    def transition_to_working(self) -> None:
        self.state = WorkingState.WORKING

    def transition_to_idle(self) -> None:
        self.state = WorkingState.IDLE

    # -- cluster --------------------------------------------------------------------------
    def add_node(
        self, note: MemoryNote | EmbeddedMemoryNote, embedding: MemoryEmbedding | None = None
    ) -> bool:
        """Adds a note to the cluster (see ``MemoryCluster.add_note``) and opens its record.

        Returns ``False`` if the id was already present (the note is not replaced).
        """
        added = self.cluster.add_note(note, embedding)
        self._open_record(note)
        return added

    def add_nodes(
        self,
        notes: Iterable[MemoryNote | EmbeddedMemoryNote],
        embeddings: Sequence[MemoryEmbedding | None] | None = None,
        *,
        links_after_nodes: bool = False,
    ) -> list[bool]:
        """Adds several notes (``MemoryCluster.add_notes``) and opens their records."""
        notes = list(notes)
        added = self.cluster.add_notes(notes, embeddings, links_after_nodes=links_after_nodes)
        now = Timestamp.now()  # the records opened by one call share its time
        for note in notes:
            self._open_record(note, now)
        return added

    def remove_node(self, id: MemoryId) -> EmbeddedMemoryNote | None:
        """Removes a note from the cluster together with its record."""
        self.records.pop(id, None)
        self.records_changed.add(id)
        return self.cluster.remove_note(id)

    def graph(self, device: torch.device | str | None = None) -> MemoryGraph:
        """The cluster's tensor snapshot (cached per cluster version and device).

        See :meth:`soulmem_torch.graph.MemoryGraph.of`.
        """
        from soulmem_torch.graph import MemoryGraph

        return MemoryGraph.of(self.cluster, device)

    # -- records --------------------------------------------------------------------------
    def record_retrieval(
        self,
        ids: MemoryId | Iterable[MemoryId],
        *,
        touch_notes: bool = False,
        mark_changed: bool = True,
    ) -> None:
        """Counts one retrieval of each id in its record (a record is opened if missing) and
        moves :attr:`retrieval_revision` on.

        Args:
            ids: one ``MemoryId`` or several (repeats count repeatedly).
            touch_notes: also call ``retrieval_increment()`` on each note present in the
                cluster (the note's own count drives forgetting).
            mark_changed: with ``touch_notes``, mark each touched note changed (the cluster's
                version moves on and its snapshot is rebuilt). ``False`` (what the retrieval
                pipeline uses) leaves the version alone: a note's count and access time are
                read by forgetting from the note itself, never from the snapshot, so retrieval
                caches (transitions, dense inverses) survive a recorded retrieval.
        """
        if isinstance(ids, MemoryId):
            ids = [ids]
        ids = list(ids)
        for mid in ids:
            if not isinstance(mid, MemoryId):
                raise ValidationError(f"ids: expected MemoryId values, found {type(mid).__name__}")
        now = Timestamp.now()  # the retrievals counted by one call share its time
        records, get = self.records, self.cluster.get
        self.records_changed.update(ids)
        if touch_notes and not mark_changed:  # counts a save must write, not the snapshot
            self.cluster.note_changed(ids)
        for mid in ids:
            record = records.get(mid)
            if record is None:
                record = records[mid] = Record.new(mid, now=now)
            record.record_retrieval(now=now)
            if touch_notes:
                item = get(mid)
                if item is not None:
                    item.note.retrieval_increment(now=now)
                    if mark_changed:
                        self.cluster.mark_changed(mid)
        if ids:
            self.retrieval_revision += 1

    def feedback(self, id: MemoryId, feedback: Feedback | str) -> bool:
        """Adds user feedback to the record of ``id``; ``False`` (ignored) if it has none."""
        record = self.records.get(id)
        if record is None:
            return False
        record.add_feedback(feedback)
        self.records_changed.add(id)
        return True

    # -- short-term memory ----------------------------------------------------------------
    async def push(self, info: Information, *, raise_on_error: bool = False) -> PushResult:
        """``sliding_window.push(info)``."""
        return await self.sliding_window.push(info, raise_on_error=raise_on_error)

    def _open_record(
        self, note: MemoryNote | EmbeddedMemoryNote, now: Timestamp | None = None
    ) -> None:
        mid = note.note.id if isinstance(note, EmbeddedMemoryNote) else note.id
        if mid not in self.records:
            self.records[mid] = Record.new(mid, now=now)
            self.records_changed.add(mid)
