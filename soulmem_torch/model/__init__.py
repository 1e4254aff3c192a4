"""The SoulMem data model (docs/spec.md §1): pydantic v2, Rust serde JSON shape, no torch."""

from __future__ import annotations

from soulmem_torch.model.ids import LinkId, MemoryId
from soulmem_torch.model.links import (
    AbstractToSpecific,
    MemoryLink,
    MemoryLinkType,
    ProcMemLink,
    SemMemLink,
    SituationMemLink,
    SpecificToAbstract,
    TrigToAction,
)
from soulmem_torch.model.notes import (
    AbstractSituation,
    Action,
    ActionType,
    ConceptType,
    Context,
    Emotion,
    Environment,
    Event,
    Location,
    MemoryNote,
    MemoryNoteBuilder,
    MemoryType,
    Participant,
    ProcMemory,
    SemMemory,
    SensoryData,
    SituationType,
    SkillRecord,
    SpecificSituation,
)
from soulmem_torch.model.serde_io import (
    dump_notes_json,
    load_notes_json,
    memory_note_json_schema,
)
from soulmem_torch.model.timestamp import Timestamp

__all__ = [
    "AbstractSituation",
    "AbstractToSpecific",
    "Action",
    "ActionType",
    "ConceptType",
    "Context",
    "Emotion",
    "Environment",
    "Event",
    "LinkId",
    "Location",
    "MemoryId",
    "MemoryLink",
    "MemoryLinkType",
    "MemoryNote",
    "MemoryNoteBuilder",
    "MemoryType",
    "Participant",
    "ProcMemLink",
    "ProcMemory",
    "SemMemLink",
    "SemMemory",
    "SensoryData",
    "SituationMemLink",
    "SituationType",
    "SkillRecord",
    "SpecificSituation",
    "SpecificToAbstract",
    "Timestamp",
    "TrigToAction",
    "dump_notes_json",
    "load_notes_json",
    "memory_note_json_schema",
]
