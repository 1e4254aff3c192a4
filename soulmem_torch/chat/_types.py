"""Conversations: :class:`ChatTurn` and :class:`ChatSession` (docs/spec.md §11)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone

from soulmem_torch.errors import ValidationError

__all__ = ["ChatSession", "ChatTurn"]


def _check_text(value: object, what: str, *, empty: bool = False) -> str:
    if not isinstance(value, str):
        raise ValidationError(f"{what}: expected a string, found {type(value).__name__}")
    if not empty and not value.strip():
        raise ValidationError(f"{what}: expected a non-empty string, found {value!r}")
    if value.isascii():  # (a constant-time test: ASCII text always encodes)
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValidationError(
            f"{what}: expected text that can be written as UTF-8, found {exc.reason} at "
            f"position {exc.start}"
        ) from None
    return value


def _check_time(value: object, what: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise ValidationError(f"{what}: expected a datetime or None, found {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValidationError(
            f"{what}: expected a timezone-aware datetime, found naive {value.isoformat()!r}"
        )
    return value.astimezone(timezone.utc)


@dataclass(frozen=True)
class ChatTurn:
    """One utterance of a conversation.

    Args:
        speaker: who spoke (a name; for a two-party chat without names, the role).
        role: ``"user"``, ``"assistant"`` or any other role string (e.g. a character name).
        text: what was said (an empty turn is kept: it holds its place and id, and matches
            nothing).
        time: aware datetime, or ``None`` (the session's time is used).
        id: the turn's id in its source (LongMemEval ``f"{session}_{i+1}"``, LoCoMo ``dia_id``);
            ``None`` → ``f"{session_id}_{index+1}"`` when the session is built.
        caption: a description of an image shared with the turn (LoCoMo ``blip_caption``).
        has_answer: the benchmark's evidence flag (LongMemEval ``has_answer``), else ``None``.
    """

    speaker: str
    role: str
    text: str
    time: datetime | None = None
    id: str | None = None
    caption: str | None = None
    has_answer: bool | None = None

    def __post_init__(self) -> None:
        _check_text(self.speaker, "speaker")
        _check_text(self.role, "role")
        _check_text(self.text, "text", empty=True)
        if self.caption is not None:
            _check_text(self.caption, "caption", empty=True)
        if self.id is not None:
            _check_text(self.id, "id")
        object.__setattr__(self, "time", _check_time(self.time, "time"))

    @property
    def content(self) -> str:
        """The text with the image caption appended (``"… [image: a dog on a beach]"``)."""
        if self.caption:
            return f"{self.text} [image: {self.caption}]".strip()
        return self.text


def checked_turn(
    speaker: str,
    role: str,
    text: str,
    id: str | None = None,
    has_answer: bool | None = None,
    *,
    names: set[str],
) -> ChatTurn:
    """``ChatTurn(speaker, role, text, None, id, None, has_answer)`` for a reader of many turns:
    the same checks (``names`` holds the speaker / role strings already checked, so each is
    checked once), the same turn, without a dataclass ``__post_init__`` per turn."""
    for value, what in ((speaker, "speaker"), (role, "role")):
        if type(value) is not str or value not in names:
            _check_text(value, what)
            names.add(value)
    if type(text) is not str or not text.isascii():
        _check_text(text, "text", empty=True)
    if id is not None:
        _check_text(id, "id")
    turn = object.__new__(ChatTurn)
    vars(turn).update(
        speaker=speaker, role=role, text=text, time=None, id=id, caption=None,
        has_answer=has_answer,
    )  # fmt: skip
    return turn


@dataclass(frozen=True)
class ChatSession:
    """One conversation session: ``id``, ``time`` (aware; ``None`` when unknown) and its turns
    in order. Turns without an id get ``f"{id}_{i+1}"``; turn ids are unique in a session."""

    id: str
    time: datetime | None
    turns: tuple[ChatTurn, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        _check_text(self.id, "session id")
        object.__setattr__(self, "time", _check_time(self.time, f"session {self.id!r}: time"))
        turns = tuple(self.turns)
        fixed = []
        seen: set[str] = set()
        for i, turn in enumerate(turns):
            if not isinstance(turn, ChatTurn):
                raise ValidationError(
                    f"session {self.id!r}: turns[{i}]: expected a ChatTurn, found "
                    f"{type(turn).__name__}"
                )
            if turn.id is None:
                turn = ChatTurn(
                    turn.speaker, turn.role, turn.text, turn.time, f"{self.id}_{i + 1}",
                    turn.caption, turn.has_answer,
                )  # fmt: skip
            if turn.id in seen:
                raise ValidationError(
                    f"session {self.id!r}: turns[{i}]: duplicate turn id {turn.id!r}"
                )
            seen.add(turn.id)
            fixed.append(turn)
        object.__setattr__(self, "turns", tuple(fixed))

    def turn_time(self, i: int) -> datetime | None:
        """Turn ``i``'s own time, else the session's."""
        t = self.turns[i].time
        return t if t is not None else self.time
