"""``note_from_text`` / ``SoulMem.remember`` / ``MemoryBank.remember``: notes from plain text."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from soulmem_torch import MemoryBank, SoulMem
from soulmem_torch.errors import NotFoundError, ValidationError
from soulmem_torch.model import (
    AbstractSituation,
    MemoryNote,
    ProcMemory,
    SemMemLink,
    SemMemory,
    SpecificSituation,
    TrigToAction,
)
from soulmem_torch.model.remember import KINDS, note_from_text


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_round_trips_through_serde(kind: str) -> None:
    note = note_from_text(
        "Grandma's kitchen", kind=kind, tags=["home"], time="2026-07-20T12:00:00Z"
    )
    again = MemoryNote.from_json(note.to_json())
    assert again == note and again.tags == ["home"]
    assert note.create_time == datetime(2026, 7, 20, 12, tzinfo=timezone.utc)
    expected = {
        "semantic": SemMemory, "situation": SpecificSituation, "action": ProcMemory,
    }.get(kind, AbstractSituation)  # fmt: skip
    assert isinstance(note.mem_type, expected)
    if expected is AbstractSituation:
        assert note.mem_type.kind.lower() == kind


def test_fields_of_each_kind() -> None:
    sem = note_from_text("osmanthus cake", aliases=["桂花糕"], description="Grandma's recipe")
    assert sem.mem_type.aliases == ["桂花糕"] and sem.mem_type.concept_type.value == "Entity"
    sit = note_from_text(
        "Baked the cake", kind="situation", location="kitchen", participants=["外婆:teacher", "me"]
    )
    ctx = sit.mem_type.context
    assert ctx.location.name == "kitchen"
    assert [(p.name, p.role) for p in ctx.participants] == [("外婆", "teacher"), ("me", "")]
    act = note_from_text("think it over", kind="action", action_type="think")
    assert act.mem_type.action.action_type.value == "Think"
    ev = note_from_text("gave", kind="event", initiator="Mei", target="me", intensity=0.5)
    assert ev.mem_type.leaf.initiator == "Mei" and ev.mem_type.leaf.action_intensity == 0.5


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"text": ""}, "text"),
        ({"text": "x", "kind": "idea"}, "kind"),
        ({"text": "x", "location": "here"}, "location"),
        ({"text": "x", "kind": "action", "action_type": "sing"}, "action_type"),
        ({"text": "x", "time": datetime(2026, 1, 1)}, "naive"),
        ({"text": "x", "time": "yesterday"}, "RFC 3339"),
        ({"text": "x", "tags": "food"}, "tags"),
        ({"text": "x", "kind": "situation", "participants": [3]}, "participants[0]"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict, needle: str) -> None:
    text = kwargs.pop("text")
    with pytest.raises(ValidationError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        note_from_text(text, **kwargs)


def test_soulmem_remember_names_links_and_retrieval() -> None:
    mem = SoulMem()
    cake = mem.remember("osmanthus cake", name="sem_osmanthus", tags=["food"])
    offer = mem.remember("Offer a slice of osmanthus cake", kind="action", name="act_offer")
    bake = mem.remember(
        "Baked osmanthus cake with Grandma", kind="situation", link_to="sem_osmanthus", verb="about"
    )
    mem.remember("Grandma's kitchen", kind="location", link_to=offer, trigger=0.8)
    assert len(mem) == 4 and mem.cluster.num_links == 2
    (link,) = mem.cluster.get(bake).note.mem_links
    assert link.to == cake and isinstance(link.link_type, SemMemLink)
    assert any(isinstance(lk.link_type, TrigToAction) for lk in mem.cluster.links())
    assert mem.id_of("sem_osmanthus") == cake and mem.id_of(str(cake)) == cake
    (result,) = mem.ask("osmanthus cake")
    assert mem.describe(result.association)[0][0] == "sem_osmanthus"
    # errors add nothing
    for kwargs, error in [
        ({"name": "sem_osmanthus"}, ValidationError),
        ({"link_to": "nope", "verb": "about"}, NotFoundError),
        ({"verb": "about"}, ValidationError),
        ({"link_to": cake}, ValidationError),  # no link kind
        ({"link_to": cake, "verb": "v", "trigger": 0.5}, ValidationError),
    ]:
        with pytest.raises(error):
            mem.remember("another", **kwargs)
    assert len(mem) == 4


def test_saved_and_loaded_names(tmp_path) -> None:
    mem = SoulMem()
    cake = mem.remember("osmanthus cake", name="sem_osmanthus")
    mem.save(tmp_path / "s")
    again = SoulMem.load(tmp_path / "s")
    assert again.id_of("sem_osmanthus") == cake


def test_bank_remember_creates_the_agent_and_describes_names() -> None:
    bank = MemoryBank()
    tea = bank.remember("npc-17", "I like tea", name="sem_tea")
    bank.remember(
        "npc-17", "Shared tea with Mei", kind="situation", link_to="sem_tea", verb="about"
    )
    assert bank.agents() == ["npc-17"] and len(bank.agent("npc-17")) == 2
    with pytest.raises(ValidationError):
        bank.remember("npc-18", "")  # an error creates no agent
    assert bank.agents() == ["npc-17"]
    (result,) = bank.ask(["npc-17"], ["tea"])
    names = [n for n, _ in bank.describe("npc-17", result.association)]
    mem_names = [n for n, _ in bank.agent("npc-17").describe(result.association)]
    assert names == mem_names and "sem_tea" in names
    assert bank.agent("npc-17").id_of("sem_tea") == tea
