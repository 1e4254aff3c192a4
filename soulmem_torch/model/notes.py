"""Memory notes (docs/spec.md §1): semantic concepts, specific / abstract situations, procedures."""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Annotated, Any, TypeAlias

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    RootModel,
)
from pydantic_core import core_schema

from soulmem_torch.errors import TimeConflictError, ValidationError
from soulmem_torch.model._tagged import ExternallyTagged
from soulmem_torch.model._types import F32
from soulmem_torch.model.ids import MemoryId
from soulmem_torch.model.links import MemoryLink
from soulmem_torch.model.serde import dumps_serde
from soulmem_torch.model.timestamp import Timestamp

__all__ = [
    "AbstractSituation",
    "Action",
    "ActionType",
    "ConceptType",
    "Context",
    "Emotion",
    "Environment",
    "Event",
    "Location",
    "MemoryNote",
    "MemoryNoteBuilder",
    "MemoryType",
    "Participant",
    "ProcMemory",
    "SemMemory",
    "SensoryData",
    "SituationType",
    "SkillRecord",
    "SpecificSituation",
]

_CONFIG = ConfigDict(extra="ignore", validate_assignment=True)
_U64_MAX = 2**64 - 1  # the original's usize (u64 on 64-bit)


# ---- Semantic ------------------------------------------------------------------------------
class ConceptType(str, Enum):
    """``Entity`` (a concrete thing) or ``Abstract`` (an idea). JSON: the bare name."""

    ENTITY = "Entity"
    ABSTRACT = "Abstract"


class SemMemory(BaseModel):
    """A semantic concept: ``content`` (its name), ``aliases``, type and description."""

    model_config = _CONFIG
    content: str
    aliases: list[str]
    concept_type: ConceptType
    description: str


# ---- Situation leaves ----------------------------------------------------------------------
class Location(BaseModel):
    """A place: ``name`` and free-text ``coordinates``."""

    model_config = _CONFIG
    name: str
    coordinates: str


class Participant(BaseModel):
    """Someone taking part: ``name`` and ``role``."""

    model_config = _CONFIG
    name: str
    role: str


class Emotion(BaseModel):
    """An emotion of the agent with an f32 ``intensity``."""

    model_config = _CONFIG
    name: str
    intensity: F32


class SensoryData(BaseModel):
    """A sensation with an f32 ``intensity``."""

    model_config = _CONFIG
    name: str
    intensity: F32


class Environment(BaseModel):
    """The ``atmosphere`` and ``tone`` of a situation."""

    model_config = _CONFIG
    atmosphere: str
    tone: str


class Event(BaseModel):
    """``initiator`` does ``action`` (f32 ``action_intensity``) to ``target``."""

    model_config = _CONFIG
    action: str
    action_intensity: F32
    initiator: str
    target: str


class Context(BaseModel):
    """The context of a specific situation. Every field but ``location`` is required in JSON."""

    model_config = _CONFIG
    location: Location | None = None
    participants: list[Participant]
    emotions: list[Emotion]
    sensory_data: list[SensoryData]
    environment: Environment
    event: list[Event]

    @classmethod
    def new(
        cls,
        *,
        environment: Environment | None = None,
        location: Location | None = None,
        participants: list[Participant] | None = None,
        emotions: list[Emotion] | None = None,
        sensory_data: list[SensoryData] | None = None,
        event: list[Event] | None = None,
    ) -> Context:
        """Convenience constructor with empty defaults (JSON input stays strict)."""
        return cls(
            location=location,
            participants=participants or [],
            emotions=emotions or [],
            sensory_data=sensory_data or [],
            environment=environment or Environment(atmosphere="", tone=""),
            event=event or [],
        )


class SpecificSituation(BaseModel):
    """A concrete episode: ``narrative``, one instant ``time_span`` and its ``context``."""

    model_config = _CONFIG
    narrative: str
    time_span: Timestamp
    context: Context


_LEAF_TAGS = ExternallyTagged(
    {
        ("Location",): Location,
        ("Participant",): Participant,
        ("Environment",): Environment,
        ("Event",): Event,
    }
)


class AbstractSituation(
    RootModel[Annotated[Location | Participant | Environment | Event, _LEAF_TAGS]]
):
    """An abstract situation: exactly one leaf (Location | Participant | Environment | Event).

    JSON: ``{"Location": {...}}`` etc. ``AbstractSituation(Location(name=..., coordinates=...))``.
    """

    model_config = ConfigDict(validate_assignment=True)

    @property
    def leaf(self) -> Location | Participant | Environment | Event:
        """The one leaf."""
        return self.root

    @property
    def kind(self) -> str:
        """``"Location"``, ``"Participant"``, ``"Environment"`` or ``"Event"``."""
        return type(self.root).__name__


SituationType: TypeAlias = SpecificSituation | AbstractSituation


# ---- Procedure -----------------------------------------------------------------------------
class SkillRecord(BaseModel):
    """Payload of ``ActionType::Skill`` (empty in the original)."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class _ActionTypeSchema:
    """serde shape of ``ActionType``: ``"Speak"``, ``"Think"`` or ``{"Skill": {}}``."""

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        def validate(value: Any) -> ActionType:
            if isinstance(value, ActionType):
                return value
            if value in ("Speak", "Think"):
                return ActionType(value)
            if (
                isinstance(value, dict)
                and list(value) == ["Skill"]
                and isinstance(value["Skill"], dict)
            ):
                return ActionType.SKILL
            raise ValueError(f'expected "Speak", "Think" or {{"Skill": {{}}}}, found {value!r}')

        def serialize(value: ActionType) -> Any:
            return {"Skill": {}} if value is ActionType.SKILL else value.value

        return core_schema.no_info_plain_validator_function(
            validate,
            serialization=core_schema.plain_serializer_function_ser_schema(serialize),
        )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        return {
            "oneOf": [
                {"enum": ["Speak", "Think"], "type": "string"},
                {
                    "type": "object",
                    "properties": {"Skill": {"type": "object"}},
                    "required": ["Skill"],
                    "additionalProperties": False,
                },
            ]
        }


class ActionType(str, Enum):
    """``Speak`` | ``Skill(SkillRecord{})`` | ``Think``."""

    SPEAK = "Speak"
    SKILL = "Skill"
    THINK = "Think"


class Action(BaseModel):
    """What the agent does: ``content`` and ``action_type``."""

    model_config = _CONFIG
    content: str
    action_type: Annotated[ActionType, _ActionTypeSchema]


class ProcMemory(BaseModel):
    """A procedural memory: one ``action``. Triggers are links (``TrigToAction``), not nodes."""

    model_config = _CONFIG
    action: Action


# ---- MemoryType and MemoryNote ------------------------------------------------------------
MEMORY_TYPE_TAGS = ExternallyTagged(
    {
        ("Semantic",): SemMemory,
        ("Situation", "AbstractSituation"): AbstractSituation,
        ("Situation", "SpecificSituation"): SpecificSituation,
        ("Procedure",): ProcMemory,
    }
)
MemoryType = Annotated[
    SemMemory | SpecificSituation | AbstractSituation | ProcMemory, MEMORY_TYPE_TAGS
]
"""``Semantic(SemMemory) | Situation(AbstractSituation | SpecificSituation) | Procedure``."""


class MemoryNote(BaseModel):
    """One memory. Outgoing links live on the source note (``mem_links``).

    JSON is the Rust serde shape; :meth:`to_json` / :meth:`from_json` round-trip notes written
    by the original byte for byte.
    """

    model_config = _CONFIG

    id: MemoryId = Field(default_factory=MemoryId.new, description="Note id (UUID v4).")
    tags: list[str] = Field(description="Tags (embedded and mean-pooled into the tag vector).")
    retrieval_count: int = Field(
        ge=0,
        le=_U64_MAX,
        description="How often the note was retrieved (the original's usize: u64 on 64-bit).",
    )
    create_time: Timestamp = Field(description="Creation time (aware UTC, RFC 3339 in JSON).")
    last_accessed_time: Timestamp = Field(description="Last access time (aware UTC).")
    mem_type: MemoryType
    mem_links: list[MemoryLink] = Field(description="Outgoing links (from this note).")

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        mem_type: Any,
        *,
        id: MemoryId | None = None,
        tags: list[str] | None = None,
        retrieval_count: int | None = None,
        create_time: datetime | None = None,
        last_accessed_time: datetime | None = None,
        mem_links: list[MemoryLink] | None = None,
    ) -> MemoryNote:
        """The builder in one call; see :class:`MemoryNoteBuilder`."""
        builder = MemoryNoteBuilder(mem_type)
        builder._id, builder._tags, builder._retrieval_count = id, tags, retrieval_count
        builder._create_time, builder._last_accessed_time = create_time, last_accessed_time
        builder._mem_links = mem_links
        return builder.build()

    # -- behaviour ------------------------------------------------------------------------
    def retrieval_increment(self, *, now: datetime | None = None) -> None:
        """Adds 1 to ``retrieval_count`` and sets ``last_accessed_time`` to ``now`` (an aware
        datetime; default: the current time).

        Both values are valid by construction (a count below the u64 bound, an aware UTC
        ``Timestamp``), so they are written without pydantic's assignment validation — the
        retrieval pipeline touches every returned note of a batch through here."""
        count = self.retrieval_count + 1
        if count > _U64_MAX:
            self.retrieval_count = count  # the field's own error
        when = Timestamp.now() if now is None else Timestamp.from_datetime(now)
        fields = self.__dict__
        fields["retrieval_count"] = count
        fields["last_accessed_time"] = when
        self.__pydantic_fields_set__.update(("retrieval_count", "last_accessed_time"))

    @property
    def kind(self) -> str:
        """``"Semantic"``, ``"SpecificSituation"``, ``"AbstractSituation"`` or ``"Procedure"``."""
        mt = self.mem_type
        if isinstance(mt, SemMemory):
            return "Semantic"
        if isinstance(mt, SpecificSituation):
            return "SpecificSituation"
        if isinstance(mt, AbstractSituation):
            return "AbstractSituation"
        return "Procedure"

    # -- serde JSON -----------------------------------------------------------------------
    def to_serde(self) -> dict[str, Any]:
        """The serde-shaped Python structure (f32 fields as ``F32Float``)."""
        return self.model_dump(mode="python")

    def to_json(self) -> str:
        """Compact JSON exactly as the Rust original's ``serde_json::to_string`` writes it."""
        return dumps_serde(self.to_serde())

    @classmethod
    def from_json(cls, text: str | bytes) -> MemoryNote:
        """Parses one note from serde JSON (unknown keys ignored, as serde does)."""
        return cls.model_validate_json(text)


class MemoryNoteBuilder:
    """``MemoryNoteBuilder(mem_type).tags([...]).create_time(t).build()``.

    Missing ``create_time`` = now; missing ``last_accessed_time`` = ``create_time``.
    **DECISION** (docs/spec.md §1): a time conflict is reported only when both times are given and
    ``last_accessed_time < create_time`` (the original also fails when only ``create_time`` is
    given).
    """

    def __init__(self, mem_type: Any) -> None:
        self._mem_type = mem_type
        self._id: MemoryId | None = None
        self._tags: list[str] | None = None
        self._retrieval_count: int | None = None
        self._create_time: datetime | None = None
        self._last_accessed_time: datetime | None = None
        self._mem_links: list[MemoryLink] | None = None

    def id(self, id: MemoryId) -> MemoryNoteBuilder:
        self._id = id
        return self

    def tags(self, tags: list[str]) -> MemoryNoteBuilder:
        self._tags = list(tags)
        return self

    def retrieval_count(self, count: int) -> MemoryNoteBuilder:
        self._retrieval_count = count
        return self

    def create_time(self, time: datetime) -> MemoryNoteBuilder:
        self._create_time = time
        return self

    def last_accessed_time(self, time: datetime) -> MemoryNoteBuilder:
        self._last_accessed_time = time
        return self

    def mem_links(self, links: list[MemoryLink]) -> MemoryNoteBuilder:
        self._mem_links = list(links)
        return self

    def build(self) -> MemoryNote:
        """Validates and builds; raises ``TimeConflictError`` / ``ValidationError``."""
        create = self._create_time
        last = self._last_accessed_time
        try:
            create_ts = Timestamp.from_datetime(create) if create is not None else None
        except ValueError as exc:
            raise ValidationError(f"create_time: {exc}") from None
        try:
            last_ts = Timestamp.from_datetime(last) if last is not None else None
        except ValueError as exc:
            raise ValidationError(f"last_accessed_time: {exc}") from None
        if create_ts is not None and last_ts is not None and last_ts < create_ts:
            raise TimeConflictError(
                f"last_accessed_time ({last_ts}) is earlier than create_time ({create_ts})"
            )
        if create_ts is None:
            create_ts = Timestamp.now()
            if last_ts is not None and last_ts < create_ts:
                create_ts = last_ts
        if last_ts is None:
            last_ts = create_ts
        return MemoryNote(
            id=self._id if self._id is not None else MemoryId.new(),
            tags=self._tags or [],
            retrieval_count=self._retrieval_count or 0,
            create_time=create_ts,
            last_accessed_time=last_ts,
            mem_type=self._mem_type,
            mem_links=self._mem_links or [],
        )
