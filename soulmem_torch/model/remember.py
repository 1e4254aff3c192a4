"""Notes from plain text: :func:`note_from_text` builds one ``MemoryNote`` of any kind.

The serde shape of a note has many required fields (a situation's context alone has six);
``note_from_text("I like tea")`` fills every one with the empty defaults the original's
constructors use, so a user writes only what they know::

    note_from_text("osmanthus cake", aliases=["桂花糕"], description="Grandma's recipe")
    note_from_text("Baked osmanthus cake with Grandma", kind="situation",
                   location="Grandma's kitchen", participants=["外婆:teacher"])
    note_from_text("Offer a slice of cake", kind="action", action_type="speak")
    note_from_text("Grandma's kitchen", kind="location")     # an abstract situation

Kinds (``KINDS``): ``"semantic"`` (a concept: ``SemMemory``), ``"situation"`` (an episode at
``time``: ``SpecificSituation``), ``"action"`` (``ProcMemory``), and the four abstract
situations ``"location"``, ``"participant"``, ``"environment"`` and ``"event"`` (one leaf each).
``time`` (an aware ``datetime`` or an RFC 3339 string; default now) is the note's creation and
last-access time and a situation's ``time_span``. Outgoing links are built by :func:`link_type`
from one of ``verb`` (a semantic link), ``trigger`` (this note triggers the target action) or
``situation_link`` (``"to-abstract"`` / ``"to-specific"``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from soulmem_torch.errors import ValidationError
from soulmem_torch.model.ids import MemoryId
from soulmem_torch.model.links import (
    AbstractToSpecific,
    MemoryLink,
    SemMemLink,
    SpecificToAbstract,
    TrigToAction,
)
from soulmem_torch.model.notes import (
    AbstractSituation,
    Action,
    ActionType,
    ConceptType,
    Context,
    Environment,
    Event,
    Location,
    MemoryNote,
    Participant,
    ProcMemory,
    SemMemory,
    SpecificSituation,
)
from soulmem_torch.model.timestamp import Timestamp

__all__ = ["KINDS", "add_link", "link_type", "note_from_text", "parse_time"]

KINDS = ("semantic", "situation", "action", "location", "participant", "environment", "event")
_ACTION_TYPES = {"speak": ActionType.SPEAK, "think": ActionType.THINK, "skill": ActionType.SKILL}


def parse_time(value: Any, what: str = "time") -> Timestamp:
    """``None`` → now; an aware ``datetime``; or an RFC 3339 string (``"now"`` too)."""
    if value is None:
        return Timestamp.now()
    if isinstance(value, str):
        if value.strip().lower() == "now":
            return Timestamp.now()
        try:
            return Timestamp.parse(value.strip())
        except (ValueError, TypeError):
            raise ValidationError(
                f"{what}: expected an RFC 3339 time such as 2026-07-20T12:00:00Z, found {value!r}"
            ) from None
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValidationError(
                f"{what}: expected an aware datetime (with a time zone), found the naive {value}"
            )
        return Timestamp.from_datetime(value)
    raise ValidationError(
        f"{what}: expected a datetime or an RFC 3339 string, found {type(value).__name__}"
    )


def _participants(items: Iterable[Any]) -> list[Participant]:
    out = []
    for i, item in enumerate(items):
        if isinstance(item, Participant):
            out.append(item)
            continue
        if isinstance(item, str):
            name, _, role = item.partition(":")
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            name, role = item
        else:
            raise ValidationError(
                f"participants[{i}]: expected 'NAME', 'NAME:ROLE' or (name, role), found {item!r}"
            )
        if not isinstance(name, str) or not name.strip() or not isinstance(role, str):
            raise ValidationError(f"participants[{i}]: expected a non-empty name, found {item!r}")
        out.append(Participant(name=name.strip(), role=role.strip()))
    return out


def _strings(values: Any, what: str) -> list[str]:
    if isinstance(values, str):
        raise ValidationError(f"{what}: expected a list of strings, found the string {values!r}")
    out = list(values)
    for i, v in enumerate(out):
        if not isinstance(v, str):
            raise ValidationError(f"{what}[{i}]: expected a string, found {type(v).__name__}")
    return out


def note_from_text(
    text: str,
    *,
    kind: str = "semantic",
    time: Any = None,
    tags: Sequence[str] = (),
    aliases: Sequence[str] = (),
    description: str = "",
    abstract: bool = False,
    location: str | None = None,
    participants: Iterable[Any] = (),
    action_type: str = "speak",
    role: str = "",
    tone: str = "",
    initiator: str = "",
    target: str = "",
    intensity: float = 1.0,
    id: MemoryId | None = None,
) -> MemoryNote:
    """One note of ``kind`` from its text (see the module doc for the kinds).

    Args:
        text: the concept's name, the episode's narrative, the action, or the abstract
            situation's place / person / atmosphere / event.
        kind: one of :data:`KINDS`.
        time: when (aware ``datetime`` or RFC 3339; ``None`` → now).
        tags: the note's tags.
        aliases, description, abstract: ``"semantic"`` only (``abstract`` → an
            ``Abstract`` concept, else an ``Entity``).
        location, participants: ``"situation"`` only (participants as ``"NAME"``,
            ``"NAME:ROLE"`` or ``(name, role)``).
        action_type: ``"action"`` only: ``"speak"``, ``"think"`` or ``"skill"``.
        role: ``"participant"`` only. tone: ``"environment"`` only. initiator, target,
            intensity: ``"event"`` only (the event's ``action_intensity``).
        id: the note id (default: a fresh UUID v4).

    Raises:
        ValidationError: naming the argument (an empty text, an unknown kind, an option of
            another kind, a naive datetime, …).
    """
    if not isinstance(text, str) or not text.strip():
        raise ValidationError(f"text: expected a non-empty string, found {text!r}")
    if kind not in KINDS:
        raise ValidationError(f"kind: expected one of {', '.join(KINDS)}; found {kind!r}")
    participants = [participants] if isinstance(participants, str) else list(participants)
    given = {
        "aliases": bool(aliases),
        "description": bool(description),
        "abstract": bool(abstract),
        "location": location is not None,
        "participants": bool(participants),
        "action_type": action_type != "speak",
        "role": bool(role),
        "tone": bool(tone),
        "initiator": bool(initiator),
        "target": bool(target),
        "intensity": intensity != 1.0,
    }
    owner = {
        "aliases": "semantic", "description": "semantic", "abstract": "semantic",
        "location": "situation", "participants": "situation", "action_type": "action",
        "role": "participant", "tone": "environment", "initiator": "event", "target": "event",
        "intensity": "event",
    }  # fmt: skip
    for name, is_given in given.items():
        if is_given and owner[name] != kind:
            raise ValidationError(
                f"{name}: only applies to kind={owner[name]!r} notes (this note is {kind!r})"
            )
    when = parse_time(time)
    tags = _strings(tags, "tags")
    mem_type: Any
    if kind == "semantic":
        mem_type = SemMemory(
            content=text,
            aliases=_strings(aliases, "aliases"),
            concept_type=ConceptType.ABSTRACT if abstract else ConceptType.ENTITY,
            description=description,
        )
    elif kind == "situation":
        context = Context.new(
            location=None if location is None else Location(name=location, coordinates=""),
            participants=_participants(participants),
        )
        mem_type = SpecificSituation(narrative=text, time_span=when, context=context)
    elif kind == "action":
        if action_type not in _ACTION_TYPES:
            raise ValidationError(
                f"action_type: expected one of {', '.join(_ACTION_TYPES)}; found {action_type!r}"
            )
        mem_type = ProcMemory(action=Action(content=text, action_type=_ACTION_TYPES[action_type]))
    elif kind == "location":
        mem_type = AbstractSituation(Location(name=text, coordinates=""))
    elif kind == "participant":
        mem_type = AbstractSituation(Participant(name=text, role=role))
    elif kind == "environment":
        mem_type = AbstractSituation(Environment(atmosphere=text, tone=tone))
    else:
        mem_type = AbstractSituation(
            Event(action=text, action_intensity=intensity, initiator=initiator, target=target)
        )
    return MemoryNote.build(mem_type, id=id, tags=tags, create_time=when, last_accessed_time=when)


def link_type(
    *,
    verb: str | None = None,
    trigger: float | None = None,
    situation_link: str | None = None,
    confidence: float = 1.0,
) -> Any:
    """The link type given by exactly one of ``verb`` / ``trigger`` / ``situation_link``."""
    given = [
        n
        for n, v in (("verb", verb), ("trigger", trigger), ("situation_link", situation_link))
        if v is not None
    ]
    if len(given) != 1:
        raise ValidationError(
            "link: expected exactly one of verb (a semantic link), trigger (the probability "
            "that this note triggers the target action) or situation_link ('to-abstract' / "
            "'to-specific')" + (f"; found {' and '.join(given)}" if given else "; found none")
        )
    if verb is not None:
        if not isinstance(verb, str) or not verb.strip():
            raise ValidationError(f"verb: expected a non-empty string, found {verb!r}")
        if (
            isinstance(confidence, bool)
            or not isinstance(confidence, (int, float))
            or not (0 <= confidence <= 1)
        ):
            raise ValidationError(f"confidence: expected a number in [0, 1], found {confidence!r}")
        return SemMemLink(verb=verb, confidence=float(confidence))
    if trigger is not None:
        if (
            isinstance(trigger, bool)
            or not isinstance(trigger, (int, float))
            or not 0 <= trigger <= 1
        ):
            raise ValidationError(f"trigger: expected a probability in [0, 1], found {trigger!r}")
        return TrigToAction(prob=float(trigger))
    if situation_link == "to-abstract":
        return SpecificToAbstract()
    if situation_link == "to-specific":
        return AbstractToSpecific()
    raise ValidationError(
        f"situation_link: expected 'to-abstract' or 'to-specific', found {situation_link!r}"
    )


def add_link(
    note: MemoryNote, target: MemoryId, kind: Any, *, intensity: float = 1.0
) -> MemoryLink:
    """Appends a link ``note → target`` of link type ``kind`` (see :func:`link_type`)."""
    if isinstance(intensity, bool) or not isinstance(intensity, (int, float)) or intensity < 0:
        raise ValidationError(f"intensity: expected a number >= 0, found {intensity!r}")
    link = MemoryLink.new(note.id, target, kind, intensity=float(intensity))
    note.mem_links.append(link)
    return link
