"""Semantic field alignment (docs/spec.md §8 ``align_sem_fields``).

After a Semantic note's ``content`` changed (e.g. revised by :func:`~.lazy.lazy_forget`), the
LLM checks its ``aliases``, ``description`` and ``concept_type`` against the content and answers
three lines::

    Aliases: a, b
    Description: …
    ConceptType: Entity|Abstract

Parsing (per trimmed line; keys are case-sensitive as in the original; later lines win):

* ``Aliases:`` — empty or ``none`` (any ASCII case) → no aliases; else split on ``,``, each
  trimmed of whitespace and quote characters (``"'“”‘’``), empty items dropped;
* ``Description:`` — empty or ``none`` → no value;
* ``ConceptType:`` — lower-cased value containing ``entity`` → Entity, else containing
  ``abstract`` → Abstract, else no value.

Applying: while the note's missing degree is below :data:`ALIGN_LENGTH_CAP_THRESHOLD` (0.6,
float32 comparison) the alias list may not grow (a longer list is ignored); a non-empty alias
list replaces the old one; a description replaces; a recognised concept type replaces. If the LLM
fails (raises, times out, returns a non-string, or a reply longer than
``REPLY_LENGTH_FACTOR`` × the prompt's user message + ``REPLY_LENGTH_SLACK`` characters)
:class:`~soulmem_torch.errors.LLMError` is raised and the note is unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from soulmem_torch.forget.decay import (
    DEFAULT_ACTIVE_FACTOR,
    DEFAULT_BASE_HALF_LIFE_HOURS,
    DEFAULT_MAX_ACTIVATION_CAP,
)
from soulmem_torch.forget.lazy import (
    DEFAULT_LLM_TIMEOUT_S,
    _as_note,
    _check_timeout,
    _resolve_md,
    call_llm,
    max_reply_chars,
)
from soulmem_torch.model import ConceptType, SemMemory
from soulmem_torch.model.serde import to_float32

__all__ = [
    "ALIGN_LENGTH_CAP_THRESHOLD",
    "ALIGN_SYSTEM_PROMPT",
    "AlignReply",
    "AlignResult",
    "align_sem_fields",
    "build_align_prompt",
    "parse_align_response",
]

ALIGN_LENGTH_CAP_THRESHOLD: float = 0.6
"""Below this missing degree the alias list may not grow during alignment."""

ALIGN_SYSTEM_PROMPT: str = (
    "You are a memory consistency checker. You are given the content of a semantic memory and "
    "its current aliases, description and concept type. Check each field for consistency with "
    "the content: keep every value that is already consistent, and correct only what does not "
    "match the content.\n"
    "Answer with exactly these three lines and nothing else:\n"
    "Aliases: <comma-separated aliases, or none>\n"
    "Description: <short description>\n"
    "ConceptType: Entity|Abstract"
)
"""Default system message of the alignment call."""

_QUOTES = "\"'“”‘’"


@dataclass(frozen=True)
class AlignReply:
    """What the LLM's answer says; ``None`` = the answer gives no (usable) value.

    ``aliases == []`` means the answer said ``none`` or left the line empty.
    """

    aliases: list[str] | None = None
    description: str | None = None
    concept_type: ConceptType | None = None


@dataclass(frozen=True)
class AlignResult:
    """The outcome of :func:`align_sem_fields` on a Semantic note.

    Attributes:
        reply: the parsed answer.
        missing_degree: the degree that decided the alias cap.
        alias_growth_blocked: the answer had more aliases than the note while capped.
        aliases_before, aliases_after, description_before, description_after,
            concept_type_before, concept_type_after: the fields around the call.
    """

    reply: AlignReply
    missing_degree: float
    alias_growth_blocked: bool
    aliases_before: list[str]
    aliases_after: list[str]
    description_before: str
    description_after: str
    concept_type_before: ConceptType
    concept_type_after: ConceptType

    @property
    def changed(self) -> bool:
        """Whether any field changed."""
        return (
            self.aliases_before != self.aliases_after
            or self.description_before != self.description_after
            or self.concept_type_before != self.concept_type_after
        )


def _concept_name(value: Any) -> str:
    return value.value if isinstance(value, ConceptType) else str(value)


def build_align_prompt(
    content: str,
    aliases: list[str],
    description: str,
    concept_type: ConceptType | str,
    system_prompt: str | None = None,
) -> tuple[str, str]:
    """``(system, user)`` of the alignment call.

    The user message is ``"Content: {content}\\nCurrent aliases: {aliases}\\nCurrent
    description: {description}\\nCurrent concept type: {type}"`` with the aliases written as
    the original's debug list (``["a", "b"]``) and the type as its name (``Entity``).
    """
    system = ALIGN_SYSTEM_PROMPT if system_prompt is None else system_prompt
    alias_list = json.dumps(list(aliases), ensure_ascii=False)
    user = (
        f"Content: {content}\nCurrent aliases: {alias_list}\n"
        f"Current description: {description}\nCurrent concept type: {_concept_name(concept_type)}"
    )
    return system, user


def _is_none(value: str) -> bool:
    return not value or (value.isascii() and value.lower() == "none")


def parse_align_response(response: str) -> AlignReply:
    """Parses the three-line answer (see the module docs); never raises on junk.

    Example:
        >>> parse_align_response("Aliases: a, \\"b\\"\\nDescription: none\\nConceptType: entity")
        AlignReply(aliases=['a', 'b'], description=None, concept_type=<ConceptType.ENTITY: 'Entity'>)
    """
    aliases: list[str] | None = None
    description: str | None = None
    concept: ConceptType | None = None
    if not isinstance(response, str):
        return AlignReply()
    for raw in response.strip().split("\n"):
        line = raw.strip()
        if line.startswith("Aliases:"):
            value = line[len("Aliases:") :].strip()
            if _is_none(value):
                aliases = []
            else:
                items = (item.strip().strip(_QUOTES).strip() for item in value.split(","))
                aliases = [item for item in items if item]
        elif line.startswith("Description:"):
            value = line[len("Description:") :].strip()
            if not _is_none(value):
                description = value
        elif line.startswith("ConceptType:"):
            value = line[len("ConceptType:") :].strip().lower()
            if "entity" in value:
                concept = ConceptType.ENTITY
            elif "abstract" in value:
                concept = ConceptType.ABSTRACT
    return AlignReply(aliases, description, concept)


async def align_sem_fields(
    note: Any,
    llm: Callable[[str, str], Any],
    *,
    now: datetime | int | None = None,
    missing_degree: float | None = None,
    system_prompt: str | None = None,
    timeout: float | None = DEFAULT_LLM_TIMEOUT_S,
    base_half_life_hours: float = DEFAULT_BASE_HALF_LIFE_HOURS,
    active_factor: float = DEFAULT_ACTIVE_FACTOR,
    max_activation_cap: int = DEFAULT_MAX_ACTIVATION_CAP,
) -> AlignResult | None:
    """Lets the LLM realign a Semantic note's aliases, description and concept type.

    Args:
        note: a ``MemoryNote`` (or ``EmbeddedMemoryNote``). Other kinds are left alone.
        llm: ``async (system, user) -> str``.
        now: aware datetime (or int ns) for the missing degree; ``None`` = the current time.
        missing_degree: use this degree instead of computing it from the note's times.
        system_prompt: replaces :data:`ALIGN_SYSTEM_PROMPT`.
        timeout: seconds (> 0) the LLM may take (default
            :data:`~soulmem_torch.forget.lazy.DEFAULT_LLM_TIMEOUT_S`); ``None`` = no limit.
        base_half_life_hours, active_factor, max_activation_cap: decay parameters.

    Returns:
        :class:`AlignResult`, or ``None`` (without calling the LLM) for a non-Semantic note.

    Raises:
        LLMError: the LLM raised, timed out, returned a non-string or an over-long reply; the
            note is unchanged.
        ValidationError: bad ``now``, ``timeout`` or ``missing_degree``.
    """
    note = _as_note(note)
    sem = note.mem_type
    if not isinstance(sem, SemMemory):
        return None
    timeout = _check_timeout(timeout)
    md = _resolve_md(
        note, now, missing_degree, base_half_life_hours, active_factor, max_activation_cap
    )
    before = (list(sem.aliases), sem.description, sem.concept_type)
    system, user = build_align_prompt(sem.content, *before, system_prompt)
    reply_text = await call_llm(
        llm, system, user, timeout=timeout, require_text=False, max_chars=max_reply_chars(user)
    )
    reply = parse_align_response(reply_text)

    capped = to_float32(md) < to_float32(ALIGN_LENGTH_CAP_THRESHOLD)
    blocked = False
    if reply.aliases is not None:
        if capped and len(reply.aliases) > len(before[0]):
            blocked = True
        elif reply.aliases:
            sem.aliases = list(reply.aliases)
    if reply.description:
        sem.description = reply.description
    if reply.concept_type is not None:
        sem.concept_type = reply.concept_type
    return AlignResult(
        reply=reply,
        missing_degree=md,
        alias_growth_blocked=blocked,
        aliases_before=before[0],
        aliases_after=list(sem.aliases),
        description_before=before[1],
        description_after=sem.description,
        concept_type_before=before[2],
        concept_type_after=sem.concept_type,
    )
