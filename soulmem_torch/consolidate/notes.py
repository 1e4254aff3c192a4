"""Turning an LLM's reply into notes and links (docs/spec.md §10): tolerant JSON parsing, note
building, de-duplication and the original's link legality matrix.

Everything here is pure (no LLM call, no memory change); :mod:`.consolidate` drives it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from soulmem_torch.errors import LLMError
from soulmem_torch.model import (
    AbstractSituation,
    Action,
    ActionType,
    ConceptType,
    Context,
    Environment,
    Location,
    MemoryId,
    MemoryLink,
    MemoryNote,
    Participant,
    ProcMemory,
    SemMemory,
    SpecificSituation,
)
from soulmem_torch.model.links import (
    AbstractToSpecific,
    SemMemLink,
    SpecificToAbstract,
    TrigToAction,
)
from soulmem_torch.model.timestamp import Timestamp

__all__ = [
    "BASE_INTENSITY",
    "MAX_LINKS",
    "MAX_NOTES",
    "LinkProposal",
    "NoteProposal",
    "deduplicate",
    "extract_json_array",
    "identity_key",
    "legal_link_type",
    "minimal_links",
    "parse_link_reply",
    "parse_note_reply",
]

BASE_INTENSITY = 0.35
"""Intensity of every link a consolidation creates (the original's activation base)."""
MAX_LINKS = 32
"""Links kept from one LLM linking reply (the rest are dropped)."""
MAX_NOTES = 64
"""Notes one split reply may propose; more is a failure (nothing is changed)."""
MAX_TEXT_CHARS = 2000
"""Longest text field of a proposed note; longer is a failure."""
MINIMAL_LINK_TARGETS = 3
"""The minimal rule links each new note to this many active notes (by retrieval count)."""
MINIMAL_LINK_VERB = "related"

_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.S)
_TYPES = ("semantic", "situation", "procedure")


def extract_json_array(reply: str, *, what: str = "reply") -> list[Any]:
    """The JSON array in an LLM reply: the whole reply, a fenced ```json block, or the text
    from the first ``[`` to the last ``]``.

    Raises:
        LLMError: no JSON array can be read.
    """
    if not isinstance(reply, str):
        raise LLMError(f"{what}: expected a str, found {type(reply).__name__}")
    candidates = [reply.strip()]
    candidates += [m.group(1).strip() for m in _FENCE.finditer(reply)]
    lo, hi = reply.find("["), reply.rfind("]")
    if 0 <= lo < hi:
        candidates.append(reply[lo : hi + 1])
    for text in candidates:
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            continue
        if isinstance(value, list):
            return value
        if isinstance(value, dict):
            for key in ("notes", "links", "items"):
                if isinstance(value.get(key), list):
                    return value[key]
    raise LLMError(f"{what}: expected a JSON array, found {reply[:80]!r}")


def _text(item: dict[str, Any], key: str, where: str, *, required: bool) -> str:
    value = item.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise LLMError(f"{where}.{key}: expected a non-empty string, found {value!r:.60}")
    if len(value) > MAX_TEXT_CHARS:
        raise LLMError(
            f"{where}.{key}: expected at most {MAX_TEXT_CHARS} characters, found {len(value)}"
        )
    return value.strip()


def _strings(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise LLMError(f"{where}: expected a list of strings, found {value!r:.60}")
    return [v.strip() for v in value if v.strip()]


def _context(value: Any, where: str) -> Context:
    if value is None:
        return Context.new()
    if isinstance(value, str):
        return Context.new(environment=Environment(atmosphere=value.strip(), tone=""))
    if not isinstance(value, dict):
        raise LLMError(f"{where}: expected an object or a string, found {value!r:.60}")
    location = value.get("location")
    if location is not None and not isinstance(location, str):
        raise LLMError(f"{where}.location: expected a string, found {location!r:.60}")
    participants = []
    for j, p in enumerate(value.get("participants") or []):
        if isinstance(p, str):
            participants.append(Participant(name=p, role=""))
        elif isinstance(p, dict) and isinstance(p.get("name"), str):
            role = p.get("role") or ""
            if not isinstance(role, str):
                raise LLMError(f"{where}.participants[{j}].role: expected a string")
            participants.append(Participant(name=p["name"], role=role))
        else:
            raise LLMError(f"{where}.participants[{j}]: expected a name or {{name, role}}")
    env = {}
    for key in ("atmosphere", "tone"):
        v = value.get(key) or ""
        if not isinstance(v, str):
            raise LLMError(f"{where}.{key}: expected a string, found {v!r:.60}")
        env[key] = v
    return Context.new(
        location=None if not location else Location(name=location, coordinates=""),
        participants=participants,
        environment=Environment(**env),
    )


@dataclass
class NoteProposal:
    """One note proposed by the LLM (``note``) and the index it had in the reply."""

    note: MemoryNote
    index: int


def parse_note_reply(reply: str, *, now: Timestamp | None = None) -> list[MemoryNote]:
    """The notes of a split reply: a JSON array of ``{type, content, description?,
    concept_type?, action_type?, context?, tags?, aliases?}``.

    ``type`` is ``semantic`` (a concept: ``content``, ``description``, ``concept_type`` Entity |
    Abstract, default Entity), ``situation`` (an episode: ``content`` is its narrative,
    ``context`` a string (atmosphere) or ``{location, participants, atmosphere, tone}``) or
    ``procedure`` (an action: ``content``, ``action_type`` Speak | Think | Skill, default Think).

    Raises:
        LLMError: the reply is not such an array, an element is malformed, or there are more
            than :data:`MAX_NOTES` (the reply is refused as a whole: nothing is half-read).
    """
    items = extract_json_array(reply, what="llm reply")
    if len(items) > MAX_NOTES:
        raise LLMError(f"llm reply: expected at most {MAX_NOTES} notes, found {len(items)}")
    now = Timestamp.now() if now is None else now
    out = []
    for i, item in enumerate(items):
        where = f"llm reply[{i}]"
        if not isinstance(item, dict):
            raise LLMError(f"{where}: expected an object, found {item!r:.60}")
        kind = item.get("type")
        kind = kind.strip().lower() if isinstance(kind, str) else kind
        if kind not in _TYPES:
            raise LLMError(f"{where}.type: expected one of {', '.join(_TYPES)}, found {kind!r:.40}")
        content = _text(item, "content", where, required=True)
        tags = _strings(item.get("tags"), f"{where}.tags")
        if kind == "semantic":
            ct = item.get("concept_type") or "Entity"
            if not isinstance(ct, str) or ct.strip().capitalize() not in ("Entity", "Abstract"):
                raise LLMError(
                    f"{where}.concept_type: expected Entity or Abstract, found {ct!r:.40}"
                )
            mem_type: Any = SemMemory(
                content=content,
                aliases=_strings(item.get("aliases"), f"{where}.aliases"),
                concept_type=ConceptType(ct.strip().capitalize()),
                description=_text(item, "description", where, required=False),
            )
        elif kind == "situation":
            mem_type = SpecificSituation(
                narrative=content,
                time_span=now,
                context=_context(item.get("context"), f"{where}.context"),
            )
        else:
            at = item.get("action_type") or "Think"
            if not isinstance(at, str) or at.strip().capitalize() not in (
                "Speak",
                "Think",
                "Skill",
            ):
                raise LLMError(
                    f"{where}.action_type: expected Speak, Think or Skill, found {at!r:.40}"
                )
            mem_type = ProcMemory(
                action=Action(content=content, action_type=ActionType(at.strip().capitalize()))
            )
        out.append(MemoryNote.build(mem_type, tags=tags, create_time=now))
    return out


def identity_key(note: MemoryNote) -> tuple[str, ...]:
    """What makes two notes the same memory: their kind and their normalized main text (a
    concept's content, an episode's narrative, an action's type and content, an abstract
    situation's leaf)."""
    mt = note.mem_type

    def norm(text: str) -> str:
        return " ".join(text.casefold().split())

    if isinstance(mt, SemMemory):
        return ("Semantic", norm(mt.content))
    if isinstance(mt, SpecificSituation):
        return ("SpecificSituation", norm(mt.narrative))
    if isinstance(mt, AbstractSituation):
        return ("AbstractSituation", mt.kind, norm(json.dumps(mt.leaf.model_dump(mode="json"))))
    return ("Procedure", mt.action.action_type.value, norm(mt.action.content))


def merge_into(target: MemoryNote, other: MemoryNote) -> MemoryNote:
    """A copy of ``target`` with ``other``'s new tags, aliases (concepts) and links added."""
    tags = list(dict.fromkeys([*target.tags, *other.tags]))
    update: dict[str, Any] = {"tags": tags}
    if isinstance(target.mem_type, SemMemory) and isinstance(other.mem_type, SemMemory):
        aliases = list(dict.fromkeys([*target.mem_type.aliases, *other.mem_type.aliases]))
        update["mem_type"] = target.mem_type.model_copy(update={"aliases": aliases})
    known = {link_identity(lk) for lk in target.mem_links}
    links = [lk.model_copy() for lk in target.mem_links]
    for lk in other.mem_links:
        ident = (target.id, *link_identity(lk)[1:])
        if ident in known:
            continue
        known.add(ident)
        links.append(lk.model_copy(update={"from_": target.id}))
    update["mem_links"] = links
    return target.model_copy(update=update)


def link_identity(link: MemoryLink) -> tuple[Any, ...]:
    """``(from, to, kind, verb)``: links with the same identity are the same relation."""
    lt = link.link_type
    return (link.from_, link.to, type(lt).__name__, getattr(lt, "verb", None))


def deduplicate(notes: Sequence[MemoryNote]) -> tuple[list[MemoryNote], dict[MemoryId, MemoryId]]:
    """Merges identical notes (same :func:`identity_key`): the first one stays, the others'
    tags, aliases and links are merged into it. Returns the kept notes and ``{dropped id:
    kept id}``."""
    kept: list[MemoryNote] = []
    by_key: dict[tuple[str, ...], int] = {}
    remap: dict[MemoryId, MemoryId] = {}
    for note in notes:
        key = identity_key(note)
        j = by_key.get(key)
        if j is None:
            by_key[key] = len(kept)
            kept.append(note)
        else:
            remap[note.id] = kept[j].id
            kept[j] = merge_into(kept[j], note)
    return kept, remap


def _level(note: MemoryNote) -> str:
    mt = note.mem_type
    if isinstance(mt, SemMemory):
        return "sem"
    if isinstance(mt, SpecificSituation):
        return "specific"
    if isinstance(mt, AbstractSituation):
        return "abstract"
    return "proc"


def legal_link_type(
    source: MemoryNote,
    target: MemoryNote,
    *,
    verb: str = MINIMAL_LINK_VERB,
    confidence: float = 1.0,
    prob: float = BASE_INTENSITY,
) -> Any:
    """The link type the original's legality matrix allows from ``source`` to ``target``, or
    ``None`` when it forbids the pair.

    Sem → any: ``Sem``; Situation → Sem: ``Sem``; Situation → Situation: the variant fixed by
    the two levels (abstract → specific: ``AbstractToSpecific``, specific → abstract:
    ``SpecificToAbstract``; same level: forbidden); Situation → Procedure:
    ``TrigToAction{prob}``; Procedure → Sem: ``Sem``; Procedure → Situation and Procedure →
    Procedure: forbidden.
    """
    s, t = _level(source), _level(target)
    if s == "sem" or t == "sem":  # Sem -> any, Situation -> Sem, Procedure -> Sem
        return SemMemLink(verb=verb, confidence=confidence)
    if s == "proc":  # Procedure -> Situation / Procedure
        return None
    if t == "proc":
        return TrigToAction(prob=prob)
    if (s, t) == ("abstract", "specific"):
        return AbstractToSpecific()
    if (s, t) == ("specific", "abstract"):
        return SpecificToAbstract()
    return None  # two situations of the same level


@dataclass
class LinkProposal:
    """A link the LLM proposed, by the names it was shown (``n3`` / ``a1``)."""

    source: str
    target: str
    verb: str = MINIMAL_LINK_VERB
    confidence: float = 1.0
    prob: float = BASE_INTENSITY
    extra: dict[str, Any] = field(default_factory=dict)


def _unit(value: Any, default: float) -> float | None:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    if not (0.0 <= value <= 1.0):
        return None
    return value


def parse_link_reply(reply: str) -> list[LinkProposal]:
    """The links of a linking reply: a JSON array of ``{from, to, verb?, confidence?,
    prob?}``. Malformed elements are dropped (a link is optional, a note is not).

    Raises:
        LLMError: the reply holds no JSON array.
    """
    items = extract_json_array(reply, what="llm link reply")
    out = []
    for item in items:
        if not isinstance(item, dict):
            continue
        src, dst = item.get("from"), item.get("to")
        verb = item.get("verb", MINIMAL_LINK_VERB)
        conf, prob = _unit(item.get("confidence"), 1.0), _unit(item.get("prob"), BASE_INTENSITY)
        if not isinstance(src, str) or not isinstance(dst, str) or not isinstance(verb, str):
            continue
        if conf is None or prob is None or not verb.strip() or len(verb) > 200:
            continue
        out.append(LinkProposal(src.strip(), dst.strip(), verb.strip(), conf, prob))
    return out


def resolve_links(
    proposals: Sequence[LinkProposal],
    names: dict[str, MemoryNote],
    *,
    max_links: int = MAX_LINKS,
) -> list[MemoryLink]:
    """Legal links from proposals: unknown ends, self loops, forbidden pairs and repeats are
    dropped; at most ``max_links``; every link at :data:`BASE_INTENSITY`."""
    out: list[MemoryLink] = []
    seen: set[tuple[Any, ...]] = set()
    for prop in proposals:
        source, target = names.get(prop.source), names.get(prop.target)
        if source is None or target is None or source.id == target.id:
            continue
        lt = legal_link_type(
            source, target, verb=prop.verb, confidence=prop.confidence, prob=prop.prob
        )
        if lt is None:
            continue
        link = MemoryLink.new(source.id, target.id, lt, intensity=BASE_INTENSITY)
        ident = link_identity(link)
        if ident in seen:
            continue
        seen.add(ident)
        out.append(link)
        if len(out) >= max_links:
            break
    return out


def minimal_links(
    new_notes: Sequence[MemoryNote], active: Sequence[MemoryNote], records: Any
) -> list[MemoryLink]:
    """The original's minimal rule: each new note → the :data:`MINIMAL_LINK_TARGETS` active
    notes with the most retrievals (ties: id ascending), a Sem link ``"related"`` of
    confidence 1.0 at :data:`BASE_INTENSITY` (whatever the kinds, as in the original: the
    legality matrix governs the LLM linking step)."""

    def count(note: MemoryNote) -> int:
        r = records.get(note.id)
        return 0 if r is None else int(r.retrieval_count)

    targets = sorted(active, key=lambda n: (-count(n), n.id.int))[:MINIMAL_LINK_TARGETS]
    out = []
    for note in new_notes:
        for target in targets:
            if target.id == note.id:
                continue
            lt = SemMemLink(verb=MINIMAL_LINK_VERB, confidence=1.0)
            out.append(MemoryLink.new(note.id, target.id, lt, intensity=BASE_INTENSITY))
    return out
