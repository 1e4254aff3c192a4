"""Small note / link / embedding factories shared by the runtime and graph tests."""

from __future__ import annotations

import torch

from soulmem_torch.embedding.fields import MemoryEmbedding
from soulmem_torch.model import (
    AbstractSituation,
    AbstractToSpecific,
    Action,
    ActionType,
    Context,
    Location,
    MemoryId,
    MemoryLink,
    MemoryNote,
    ProcMemory,
    SemMemLink,
    SemMemory,
    SpecificSituation,
    SpecificToAbstract,
    Timestamp,
    TrigToAction,
)

T0 = Timestamp.from_ns(1_700_000_000_123_456_789)


def sem(content: str = "node", *, id: MemoryId | None = None, links=()) -> MemoryNote:
    return MemoryNote.build(
        SemMemory(content=content, aliases=[], concept_type="Entity", description=""),
        id=id, create_time=T0, mem_links=list(links),
    )  # fmt: skip


def specific(narrative: str = "an episode", *, id: MemoryId | None = None, links=()) -> MemoryNote:
    return MemoryNote.build(
        SpecificSituation(narrative=narrative, time_span=T0, context=Context.new()),
        id=id, create_time=T0, mem_links=list(links),
    )  # fmt: skip


def abstract(name: str = "a place", *, id: MemoryId | None = None, links=()) -> MemoryNote:
    return MemoryNote.build(
        AbstractSituation(Location(name=name, coordinates="")),
        id=id, create_time=T0, mem_links=list(links),
    )  # fmt: skip


def proc(content: str = "say hi", *, id: MemoryId | None = None, links=()) -> MemoryNote:
    return MemoryNote.build(
        ProcMemory(action=Action(content=content, action_type=ActionType.SPEAK)),
        id=id, create_time=T0, mem_links=list(links),
    )  # fmt: skip


def sem_link(a: MemoryId, b: MemoryId, *, confidence=0.9, intensity=0.9) -> MemoryLink:
    return MemoryLink.new(
        a, b, SemMemLink(verb="related", confidence=confidence), intensity=intensity
    )


def proc_link(a: MemoryId, b: MemoryId, *, prob=0.5, intensity=1.0) -> MemoryLink:
    return MemoryLink.new(a, b, TrigToAction(prob=prob), intensity=intensity)


def a2s_link(a: MemoryId, b: MemoryId, *, intensity=1.0) -> MemoryLink:
    return MemoryLink.new(a, b, AbstractToSpecific(), intensity=intensity)


def s2a_link(a: MemoryId, b: MemoryId, *, intensity=1.0) -> MemoryLink:
    return MemoryLink.new(a, b, SpecificToAbstract(), intensity=intensity)


def embedding(dim: int = 4, *, fields=("content", "aliases", "description"), seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return MemoryEmbedding(
        tag=torch.randn(dim, generator=g),
        fields={name: torch.randn(dim, generator=g) for name in fields},
    )
