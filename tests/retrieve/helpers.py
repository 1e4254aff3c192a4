"""Small hand-made memories for strategy tests."""

from __future__ import annotations

from datetime import datetime, timezone

from soulmem_torch.model import (
    AbstractSituation,
    Action,
    Context,
    Environment,
    Location,
    MemoryId,
    MemoryLink,
    MemoryNote,
    ProcMemory,
    SemMemLink,
    SemMemory,
    SpecificSituation,
    SpecificToAbstract,
    TrigToAction,
)
from soulmem_torch.runtime import WorkingMemory

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


def sem(name: str) -> MemoryNote:
    return MemoryNote.build(
        SemMemory(content=name, aliases=[], concept_type="Entity", description=name),
        tags=[name],
        create_time=T0,
    )


def specific(name: str) -> MemoryNote:
    return MemoryNote.build(
        SpecificSituation(
            narrative=name,
            time_span=T0,
            context=Context.new(environment=Environment(atmosphere="calm", tone="warm")),
        ),
        create_time=T0,
    )


def abstract(name: str) -> MemoryNote:
    return MemoryNote.build(AbstractSituation(Location(name=name, coordinates="")), create_time=T0)


def action(name: str) -> MemoryNote:
    return MemoryNote.build(
        ProcMemory(action=Action(content=name, action_type="Speak")), create_time=T0
    )


def link(
    a: MemoryNote, b: MemoryNote, kind: str, value: float = 0.8, intensity: float = 1.0
) -> None:
    if kind == "sem":
        lt = SemMemLink(verb="rel", confidence=value)
    elif kind == "proc":
        lt = TrigToAction(prob=value)
    else:
        lt = SpecificToAbstract()
    a.mem_links.append(MemoryLink.new(a.id, b.id, lt, intensity=intensity))


def small_world() -> tuple[WorkingMemory, dict[str, MemoryId]]:
    """cafe(sem) <-> rainy_day(specific) -> rain(abstract); rainy_day/rain trigger actions."""
    cafe, coffee, rainy, rain = sem("cafe"), sem("coffee"), specific("rainy day"), abstract("rain")
    greet, umbrella, think = action("greet"), action("lend umbrella"), action("think")
    link(cafe, coffee, "sem", 0.9)
    link(cafe, rainy, "sem", 0.6)
    link(rainy, cafe, "sem", 0.7)
    link(rainy, rain, "s2a")
    link(rainy, greet, "proc", 0.5)
    link(rainy, umbrella, "proc", 0.3)
    link(rain, umbrella, "proc", 0.9)
    link(coffee, think, "proc", 0.4)
    wm = WorkingMemory()
    names = {}
    for name, note in [("cafe", cafe), ("coffee", coffee), ("rainy", rainy), ("rain", rain),
                       ("greet", greet), ("umbrella", umbrella), ("think", think)]:  # fmt: skip
        wm.add_node(note)
        names[name] = note.id
    return wm, names
