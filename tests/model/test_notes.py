"""The data model: builder, validation errors, externally tagged enums, JSON Schema."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pydantic
import pytest

from soulmem_torch.errors import TimeConflictError, ValidationError
from soulmem_torch.model import (
    AbstractSituation,
    AbstractToSpecific,
    Action,
    ActionType,
    ConceptType,
    Context,
    Environment,
    Event,
    LinkId,
    Location,
    MemoryId,
    MemoryLink,
    MemoryNote,
    MemoryNoteBuilder,
    Participant,
    ProcMemory,
    SemMemLink,
    SemMemory,
    SpecificSituation,
    SpecificToAbstract,
    Timestamp,
    TrigToAction,
    memory_note_json_schema,
)

UTC = timezone.utc


def sem(content: str = "Rust") -> SemMemory:
    return SemMemory(content=content, aliases=["rs"], concept_type="Entity", description="lang")


def test_builder_defaults() -> None:
    note = MemoryNoteBuilder(sem()).tags(["t"]).build()
    assert note.tags == ["t"]
    assert note.retrieval_count == 0
    assert note.last_accessed_time == note.create_time
    assert note.mem_links == []


def test_builder_only_create_time_is_not_a_conflict() -> None:
    # DECISION (SPEC §1): the original reports a conflict here; we do not.
    t = datetime(2024, 1, 1, tzinfo=UTC)
    note = MemoryNote.build(sem(), create_time=t)
    assert note.create_time == t
    assert note.last_accessed_time == t


def test_builder_time_conflict() -> None:
    with pytest.raises(TimeConflictError, match="last_accessed_time"):
        MemoryNote.build(
            sem(),
            create_time=datetime(2024, 1, 2, tzinfo=UTC),
            last_accessed_time=datetime(2024, 1, 1, tzinfo=UTC),
        )


def test_naive_datetime_is_an_error() -> None:
    with pytest.raises(ValidationError, match=r"create_time.*naive"):
        MemoryNote.build(sem(), create_time=datetime(2024, 1, 1))
    note = MemoryNote.build(sem())
    with pytest.raises(pydantic.ValidationError, match="naive"):
        note.last_accessed_time = datetime(2024, 1, 1)


def test_non_utc_converted() -> None:
    t = datetime(2024, 1, 1, 10, tzinfo=timezone(timedelta(hours=2)))
    note = MemoryNote.build(sem(), create_time=t)
    assert note.create_time.to_rfc3339() == "2024-01-01T08:00:00Z"


def test_retrieval_increment() -> None:
    note = MemoryNote.build(sem(), create_time=datetime(2024, 1, 1, tzinfo=UTC))
    note.retrieval_increment()
    note.retrieval_increment()
    assert note.retrieval_count == 2
    assert note.last_accessed_time > note.create_time


def _note_json(mem_type: object, links: object = ()) -> dict:
    return {
        "id": str(MemoryId()),
        "tags": [],
        "retrieval_count": 0,
        "create_time": "2024-01-01T00:00:00Z",
        "last_accessed_time": "2024-01-01T00:00:00Z",
        "mem_type": mem_type,
        "mem_links": list(links),
    }


@pytest.mark.parametrize(
    ("mem_type", "match"),
    [
        ({"Foo": {}}, "exactly one key"),
        (
            {
                "Semantic": {
                    "content": "x",
                    "aliases": [],
                    "concept_type": "Thing",
                    "description": "",
                }
            },
            "concept_type",
        ),
        ({"Procedure": {"action": {"content": "x", "action_type": {"Speak": ""}}}}, "action_type"),
        ({"Procedure": {"action": {"content": "x", "action_type": "Dance"}}}, "action_type"),
    ],
)
def test_unknown_enum_tags_rejected(mem_type: object, match: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=match):
        MemoryNote.model_validate(_note_json(mem_type))


def _link(link_type: object, intensity: object = 1.0) -> dict:
    return {"id": str(LinkId()), "from": str(MemoryId()), "to": str(MemoryId()),
            "intensity": intensity, "link_type": link_type}  # fmt: skip


@pytest.mark.parametrize(
    ("link", "match"),
    [
        (_link({"Sem": {"verb": "v", "confidence": 1.5}}), "confidence"),
        (_link({"Sem": {"verb": "v", "confidence": -0.1}}), "confidence"),
        (_link({"Proc": {"TrigToAction": {"prob": 2.0}}}), "prob"),
        (_link({"Proc": {"TrigToAction": {"prob": 0.5}}}, intensity=-1.0), "intensity"),
        (_link({"Proc": {"TrigToAction": {"prob": 0.5}}}, intensity=float("nan")), "intensity"),
        (_link({"Situation": {"Sideways": {}}}), "link_type"),
    ],
)
def test_bad_links_name_the_field(link: dict, match: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=match):
        MemoryNote.model_validate(
            _note_json({"Procedure": {"action": {"content": "x", "action_type": "Think"}}}, [link])
        )


def test_every_kind_round_trips_through_serde_json() -> None:
    a = MemoryNote.build(sem(), tags=["x"])
    proc = MemoryNote.build(
        ProcMemory(action=Action(content="skill", action_type=ActionType.SKILL))
    )
    abstract = MemoryNote.build(AbstractSituation(Participant(name="n", role="r")))
    specific = MemoryNote.build(
        SpecificSituation(
            narrative="n",
            time_span=datetime(2020, 1, 1, tzinfo=UTC),
            context=Context.new(
                location=Location(name="l", coordinates="c"),
                environment=Environment(atmosphere="a", tone="t"),
                event=[Event(action="a", action_intensity=0.3, initiator="i", target="t")],
            ),
        )
    )
    a.mem_links = [
        MemoryLink.new(a.id, proc.id, TrigToAction(prob=0.25)),
        MemoryLink.new(a.id, abstract.id, SemMemLink(verb="v", confidence=0.7), intensity=0.5),
        MemoryLink.new(a.id, specific.id, AbstractToSpecific()),
        MemoryLink.new(a.id, specific.id, SpecificToAbstract()),
    ]
    for note in (a, proc, abstract, specific):
        text = note.to_json()
        back = MemoryNote.from_json(text)
        assert back == note
        assert back.to_json() == text
        # pydantic's own JSON is the same serde shape
        assert json.loads(note.model_dump_json()) == json.loads(text)
    assert '"action_type":{"Skill":{}}' in proc.to_json()
    assert '{"Situation":{"SpecificToAbstract":{}}}' in a.to_json()
    assert abstract.kind == "AbstractSituation"
    assert specific.mem_type.context.event[0].action_intensity == pytest.approx(0.3)


def test_f32_fields_keep_float32_value() -> None:
    link = SemMemLink(verb="v", confidence=0.123456789)
    assert link.confidence == 0.12345679


def test_ids() -> None:
    a = MemoryId()
    assert MemoryId(str(a)) == a
    assert hash(MemoryId(str(a))) == hash(a)
    assert MemoryId(str(a)) != LinkId(str(a))
    with pytest.raises(ValueError):
        MemoryId("not-a-uuid")


def test_json_schema_describes_serde_shape() -> None:
    schema = memory_note_json_schema()
    text = json.dumps(schema)
    assert "Semantic" in text and "SpecificSituation" in text and "TrigToAction" in text
    assert schema["properties"]["create_time"]["format"] == "date-time"


def test_timestamp_rfc3339_digits() -> None:
    for text in ["2026-07-17T13:59:33.699407100Z", "2026-06-01T08:00:00Z",
                 "2026-06-01T08:00:00.120Z", "2026-06-01T08:00:00.123456Z"]:  # fmt: skip
        assert Timestamp.parse(text).to_rfc3339() == text
    with pytest.raises(ValueError, match="RFC 3339"):
        Timestamp.parse("yesterday")
    assert ConceptType("Entity") is ConceptType.ENTITY
