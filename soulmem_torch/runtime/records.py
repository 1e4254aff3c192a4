"""Access records kept by the working memory (docs/spec.md §2): ``Record`` and ``Feedback``.

A record counts how often the *working memory* retrieved a note and collects user feedback on
it. Its retrieval count is separate from the note's own ``retrieval_count`` (the forgetting
curve reads the note's).

Example:
    >>> from soulmem_torch.model import MemoryId
    >>> record = Record.new(MemoryId())
    >>> record.add_feedback(Feedback.POSITIVE)
    >>> record.add_feedback(Feedback.NEGATIVE)
    >>> record.add_feedback(Feedback.POSITIVE)
    >>> record.feedback_score
    1
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from soulmem_torch.model.ids import MemoryId
from soulmem_torch.model.timestamp import Timestamp

__all__ = ["Feedback", "Record", "parse_record_rows", "records_from_json", "records_to_json"]


class Feedback(str, Enum):
    """User feedback on a retrieved memory: Positive (+1), Negative (-1), Neutral (0).

    ``Feedback.Positive`` / ``Feedback.Negative`` / ``Feedback.Neutral`` are aliases of the
    upper-case members (the original's variant names). JSON: the bare name.
    """

    POSITIVE = "Positive"
    NEGATIVE = "Negative"
    NEUTRAL = "Neutral"
    # The original's spelling, as aliases (same values -> same members).
    Positive = "Positive"
    Negative = "Negative"
    Neutral = "Neutral"

    @property
    def score(self) -> int:
        """+1, -1 or 0."""
        return _SCORES[self.value]


_SCORES = {"Positive": 1, "Negative": -1, "Neutral": 0}


class Record(BaseModel):
    """How often, and when, the working memory retrieved one note, and the feedback on it."""

    model_config = ConfigDict(extra="forbid")

    memory_id: MemoryId = Field(description="The note this record is about.")
    retrieval_count: int = Field(0, ge=0, description="Retrievals through the working memory.")
    first_access_time: Timestamp = Field(description="When the record was created (aware UTC).")
    last_access_time: Timestamp = Field(description="Last retrieval (aware UTC).")
    feedback_history: list[tuple[Timestamp, Feedback]] = Field(
        default_factory=list, description="Every feedback with its time, oldest first."
    )
    feedback_score: int = Field(0, description="Sum of the feedback scores (+1 / -1 / 0).")

    @classmethod
    def new(cls, memory_id: MemoryId, *, now: Timestamp | None = None) -> Record:
        """A fresh record: no retrievals, both access times ``now`` (default: the current time)."""
        now = Timestamp.now() if now is None else Timestamp.from_datetime(now)
        return cls(memory_id=memory_id, first_access_time=now, last_access_time=now)

    def record_retrieval(self, *, now: Timestamp | None = None) -> None:
        """Adds 1 to ``retrieval_count`` and sets ``last_access_time`` (``now``: an aware
        datetime; default: the current time)."""
        when = Timestamp.now() if now is None else Timestamp.from_datetime(now)
        fields = self.__dict__  # both valid by construction: no per-field __setattr__
        fields["retrieval_count"] = self.retrieval_count + 1
        fields["last_access_time"] = when
        self.__pydantic_fields_set__.update(("retrieval_count", "last_access_time"))

    def add_feedback(self, feedback: Feedback | str, *, now: Timestamp | None = None) -> None:
        """Appends ``feedback`` to the history and adds its score (+1 / -1 / 0)."""
        feedback = Feedback(feedback)
        when = Timestamp.now() if now is None else Timestamp.from_datetime(now)
        self.feedback_history.append((when, feedback))
        self.feedback_score += feedback.score

    def access_time_span(self) -> int:
        """Whole seconds from ``first_access_time`` to ``last_access_time`` (truncated)."""
        delta = self.last_access_time - self.first_access_time
        return int(delta.total_seconds())

    def feedback_between(
        self, start: Timestamp, end: Timestamp
    ) -> list[tuple[Timestamp, Feedback]]:
        """Feedback with ``start <= time <= end``; empty when ``start > end``."""
        return [(t, f) for t, f in self.feedback_history if start <= t <= end]

    def feedback_after(self, start: Timestamp) -> list[tuple[Timestamp, Feedback]]:
        """Feedback with ``time >= start``."""
        return [(t, f) for t, f in self.feedback_history if t >= start]

    def feedback_before(self, end: Timestamp) -> list[tuple[Timestamp, Feedback]]:
        """Feedback with ``time < end``."""
        return [(t, f) for t, f in self.feedback_history if t < end]


RECORDS_FORMAT = "soulmem_torch.records"
RECORDS_VERSION = 1


def records_to_json(working_memory: object) -> dict[str, object]:
    """The working memory's records as a JSON-able dict (what a store keeps beside the notes).

    ``plasticity_pending`` says whether a retrieval was recorded since the last plasticity
    update (its ``retrieval_revision`` moved), so a loaded memory resumes where it stopped;
    ``window_summary`` is the sliding window's rolling summary (what consolidation reads).
    """
    records = getattr(working_memory, "records", {})
    revision = getattr(working_memory, "retrieval_revision", 0)
    done = getattr(working_memory, "plasticity_revision", 0)
    window = getattr(working_memory, "sliding_window", None)
    return {
        "format": RECORDS_FORMAT,
        "version": RECORDS_VERSION,
        "plasticity_pending": revision != done,
        "window_summary": getattr(window, "summary", ""),
        "records": [r.model_dump(mode="json") for r in records.values()],
    }


def records_from_json(data: object, *, where: str = "records") -> tuple[list[Record], bool]:
    """Parses :func:`records_to_json` output: ``(records, plasticity_pending)``.

    Raises:
        ValueError (``ValidationError``): naming ``where`` and the bad entry.
    """
    from soulmem_torch.errors import ValidationError

    if not isinstance(data, dict) or data.get("format") != RECORDS_FORMAT:
        raise ValidationError(f"{where}: expected a {RECORDS_FORMAT} object, found {data!r:.80}")
    if data.get("version") != RECORDS_VERSION:
        raise ValidationError(
            f"{where}: expected version {RECORDS_VERSION}, found {data.get('version')!r}"
        )
    rows = data.get("records")
    if not isinstance(rows, list):
        raise ValidationError(f"{where}.records: expected a list, found {type(rows).__name__}")
    try:  # all at once in pydantic-core; a bad one is named below
        return _RECORD_LIST.validate_python(rows), bool(data.get("plasticity_pending", False))
    except ValueError:
        pass
    out = []
    for i, row in enumerate(rows):
        try:
            out.append(Record.model_validate(row))
        except ValueError as exc:
            raise ValidationError(f"{where}.records[{i}]: {exc}") from None
    return out, bool(data.get("plasticity_pending", False))


_RECORD_LIST = TypeAdapter(list[Record])


def parse_record_rows(rows: list[bytes], *, where: str = "records") -> list[Record]:
    """Records from their stored JSON rows (UTF-8 bytes, one record each) in one pass of
    pydantic-core (what a store's load reads; ``records_from_json`` takes the result as is).

    Raises:
        ValueError (``ValidationError``): naming ``where`` and the bad row.
    """
    from soulmem_torch.errors import ValidationError

    try:
        return _RECORD_LIST.validate_json(b"[" + b",".join(rows) + b"]")
    except ValueError:
        pass
    for i, row in enumerate(rows):
        try:
            Record.model_validate_json(row)
        except ValueError as exc:
            raise ValidationError(f"{where}[{i}]: {exc}") from None
    raise ValidationError(f"{where}: the record rows do not parse one record each")
