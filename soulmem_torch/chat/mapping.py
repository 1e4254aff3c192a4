"""Conversations as SoulMem notes (docs/spec.md §11, DECISION "chat mapping").

``level="turn"`` (the default of :meth:`SoulMem.add_sessions`): every kept turn is a
``SpecificSituation`` (narrative = the turn's text with its image caption, ``time_span`` = the
turn's time or its session's, the speaker a participant with their role); every session is
an ``AbstractSituation`` episode (an ``Event``: action ``"conversation"``, initiator / target
the session's first two speakers) linked to each of its turns both ways
(``AbstractToSpecific`` / ``SpecificToAbstract``); neighbouring turns are linked forward
(``Sem`` verb ``"then"``); every named speaker is one ``Semantic`` entity, and each turn links
to its speaker (``Sem`` verb ``"said by"``). ``level="session"``: one ``SpecificSituation`` per
session (narrative = its kept turns joined by a space, as the LongMemEval session corpus),
no other notes.

Every note keeps where it came from in its tags — ``chat:session=<id>`` and, for turns,
``chat:turn=<id>`` (``chat:episode`` / ``chat:speaker=<name>`` mark the other kinds) — so
results map back after a save and a load (:func:`chat_source`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Literal

from soulmem_torch._gcpause import gc_paused
from soulmem_torch.chat._types import ChatSession
from soulmem_torch.errors import ValidationError
from soulmem_torch.model import (
    AbstractSituation,
    ConceptType,
    Context,
    Event,
    MemoryId,
    MemoryLink,
    MemoryNote,
    Participant,
    SemMemLink,
    SemMemory,
    SpecificSituation,
)
from soulmem_torch.model.links import AbstractToSpecific, SpecificToAbstract
from soulmem_torch.model.timestamp import Timestamp

__all__ = ["ChatNotes", "chat_source", "sessions_to_notes"]

SESSION_TAG = "chat:session="
TURN_TAG = "chat:turn="
SPEAKER_TAG = "chat:speaker="
EPISODE_TAG = "chat:episode"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@dataclass
class ChatNotes:
    """Notes made from sessions: ``notes`` (turns or session documents first, in order, then
    episodes and speakers), ``corpus`` the ids of the turn / session-document notes with their
    source id (``source[note_id]`` = the turn id at turn level, the session id at session
    level) and ``session_of[note_id]`` their session id."""

    notes: list[MemoryNote]
    corpus: list[MemoryId]
    source: dict[MemoryId, str]
    session_of: dict[MemoryId, str]


def chat_source(note: MemoryNote) -> tuple[str | None, str | None]:
    """``(session id, turn id)`` of a note made by :func:`sessions_to_notes` (``None`` where
    the note has none)."""
    session = turn = None
    for t in note.tags:
        if t.startswith(SESSION_TAG):
            session = t[len(SESSION_TAG) :]
        elif t.startswith(TURN_TAG):
            turn = t[len(TURN_TAG) :]
    return session, turn


def _ts(value: datetime | None) -> Timestamp:
    return Timestamp.from_datetime(value if value is not None else _EPOCH)


def _note(mem_type: object, tags: list[str], time: Timestamp) -> MemoryNote:
    return MemoryNote(
        id=MemoryId.new(),
        tags=tags,
        retrieval_count=0,
        create_time=time,
        last_accessed_time=time,
        mem_type=mem_type,
        mem_links=[],
    )


def _link(a: MemoryNote, b: MemoryNote, link_type: object) -> None:
    a.mem_links.append(MemoryLink(from_=a.id, to=b.id, link_type=link_type))


@gc_paused()  # ~10 small acyclic objects a note (see soulmem_torch._gcpause)
def sessions_to_notes(
    sessions: Iterable[ChatSession],
    *,
    level: Literal["turn", "session"] = "turn",
    roles: Sequence[str] | None = None,
    episodes: bool = True,
    speakers: bool = True,
    neighbours: bool = True,
    known_speakers: dict[str, MemoryId] | None = None,
) -> ChatNotes:
    """The notes of a chat history (see the module docstring for the mapping).

    Args:
        sessions: ``ChatSession`` objects.
        level: ``"turn"`` (a note per turn) or ``"session"`` (a note per session).
        roles: keep only turns of these roles (LongMemEval's corpus: ``["user"]``); ``None``
            keeps every turn. Turn ids stay the source's (their index among *all* turns).
        episodes, speakers, neighbours: at turn level, the session episodes, the speaker
            entities and the links between neighbouring turns.
        known_speakers: speaker name → the id of an existing speaker note (linked to, not
            made again).

    Raises:
        ValidationError: not a sequence of ``ChatSession``, or a bad ``level``. A session id
            that repeats (LongMemEval haystacks hold a few) is kept as given: its notes are
            separate notes with the same source id.
    """
    if level not in ("turn", "session"):
        raise ValidationError(f"level: expected 'turn' or 'session', found {level!r}")
    keep = None if roles is None else frozenset(roles)
    notes: list[MemoryNote] = []
    corpus: list[MemoryId] = []
    source: dict[MemoryId, str] = {}
    session_of: dict[MemoryId, str] = {}
    extra: list[MemoryNote] = []
    people: dict[str, MemoryNote] = {}
    for j, s in enumerate(sessions):
        if not isinstance(s, ChatSession):
            raise ValidationError(
                f"sessions[{j}]: expected a ChatSession, found {type(s).__name__}"
            )
        turns = [t for t in s.turns if keep is None or t.role in keep]
        stime = _ts(s.time)
        s_tag = SESSION_TAG + s.id
        names = list(dict.fromkeys(t.speaker for t in turns))
        if level == "session":
            if not turns:
                continue
            ctx = Context.new(participants=[Participant(name=n, role=n) for n in names])
            text = " ".join(t.content for t in turns)
            note = _note(
                SpecificSituation(narrative=text, time_span=stime, context=ctx),
                ["chat", s_tag],
                stime,
            )
            notes.append(note)
            corpus.append(note.id)
            source[note.id] = s.id
            session_of[note.id] = s.id
            continue
        episode = None
        if episodes and turns:
            leaf = Event(
                action="conversation",
                action_intensity=1.0,
                initiator=names[0],
                target=names[1] if len(names) > 1 else "",
            )
            episode = _note(AbstractSituation(leaf), ["chat", EPISODE_TAG, s_tag], stime)
            extra.append(episode)
        previous = None
        for t in turns:
            time = _ts(t.time) if t.time is not None else stime
            ctx = Context.new(participants=[Participant(name=t.speaker, role=t.role)])
            note = _note(
                SpecificSituation(narrative=t.content, time_span=time, context=ctx),
                ["chat", s_tag, TURN_TAG + str(t.id)],
                time,
            )
            notes.append(note)
            corpus.append(note.id)
            source[note.id] = str(t.id)
            session_of[note.id] = s.id
            if episode is not None:
                _link(episode, note, AbstractToSpecific())
                _link(note, episode, SpecificToAbstract())
            if neighbours and previous is not None:
                _link(previous, note, SemMemLink(verb="then", confidence=1.0))
            previous = note
            if speakers and known_speakers and t.speaker in known_speakers:
                note.mem_links.append(
                    MemoryLink(
                        from_=note.id,
                        to=known_speakers[t.speaker],
                        link_type=SemMemLink(verb="said by", confidence=1.0),
                    )
                )
            elif speakers:
                person = people.get(t.speaker)
                if person is None:
                    person = people[t.speaker] = _note(
                        SemMemory(
                            content=t.speaker,
                            aliases=[],
                            concept_type=ConceptType.ENTITY,
                            description=f"a speaker in the conversation ({t.role})",
                        ),
                        ["chat", SPEAKER_TAG + t.speaker],
                        stime,
                    )
                _link(note, person, SemMemLink(verb="said by", confidence=1.0))
    return ChatNotes(notes + extra + list(people.values()), corpus, source, session_of)
