"""Note builders shared by the forgetting tests."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from soulmem_torch.model import (
    AbstractSituation,
    Action,
    ActionType,
    ConceptType,
    Context,
    Environment,
    Location,
    MemoryLink,
    MemoryNote,
    ProcMemory,
    SemMemLink,
    SemMemory,
    SpecificSituation,
)

UTC = timezone.utc
T0 = datetime(2024, 1, 1, tzinfo=UTC)


def hours(h: float) -> timedelta:
    return timedelta(hours=h)


def make_sem(
    content: str,
    created: datetime = T0,
    *,
    aliases: list[str] | None = None,
    description: str = "测试描述",
    concept_type: ConceptType = ConceptType.ENTITY,
    retrieval_count: int = 0,
) -> MemoryNote:
    sem = SemMemory(
        content=content,
        aliases=list(aliases or []),
        concept_type=concept_type,
        description=description,
    )
    return MemoryNote.build(sem, create_time=created, retrieval_count=retrieval_count)


def make_sit(narrative: str, created: datetime = T0, *, retrieval_count: int = 0) -> MemoryNote:
    ctx = Context.new(environment=Environment(atmosphere="日常", tone="平静"))
    sit = SpecificSituation(narrative=narrative, time_span=created, context=ctx)
    return MemoryNote.build(sit, create_time=created, retrieval_count=retrieval_count)


def make_proc(content: str = "test", created: datetime = T0) -> MemoryNote:
    proc = ProcMemory(action=Action(content=content, action_type=ActionType.THINK))
    return MemoryNote.build(proc, create_time=created)


def make_abstract(name: str = "公园", created: datetime = T0) -> MemoryNote:
    leaf = AbstractSituation(Location(name=name, coordinates="north"))
    return MemoryNote.build(leaf, create_time=created)


def link(src: MemoryNote, dst: MemoryNote, intensity: float = 1.0) -> MemoryLink:
    lk = MemoryLink.new(
        src.id, dst.id, SemMemLink(verb="related", confidence=1.0), intensity=intensity
    )
    src.mem_links = [*src.mem_links, lk]
    return lk
