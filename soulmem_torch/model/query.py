"""Retrieval queries (docs/spec.md §3): ``MemoryRetrieveQuery { tag, variant }`` in the serde JSON shape.

``variant`` is externally tagged like every Rust enum: ``{"Semantic": [unit, ...]}`` or
``{"Situation": [unit, ...]}``. Every ``Option`` field is optional (missing or ``null`` reads as
``None`` and writes as ``null``), unknown keys are ignored, as serde does. ``time_span`` entries
are accepted and kept but not scored (the original does not score them either).

Example:
    >>> q = MemoryRetrieveQuery.model_validate_json(
    ...     '{"tag": ["人物"], "variant": {"Situation": [{"narrative": "夜袭告白",'
    ...     ' "location": [{"name": "神社"}]}]}}'
    ... )
    >>> q.kind, q.units[0].location[0].name
    ('Situation', '神社')
    >>> q.to_json().startswith('{"tag":["人物"],"variant":{"Situation":[{"narrative":"夜袭告白",')
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel

from soulmem_torch.model._tagged import ExternallyTagged
from soulmem_torch.model.serde import dumps_serde
from soulmem_torch.model.timestamp import Timestamp

__all__ = [
    "EnvironmentQueryUnit",
    "EventQueryUnit",
    "LocationQueryUnit",
    "MemoryRetrieveQuery",
    "MemoryRetrieveQueryVariant",
    "ParticipantQueryUnit",
    "PrioritizedMemoryRetrieveQuery",
    "SemanticQuery",
    "SemanticQueryUnit",
    "SituationQuery",
    "SituationQueryUnit",
    "TimeSpanQueryUnit",
]

_CONFIG = ConfigDict(extra="ignore", frozen=True)


class SemanticQueryUnit(BaseModel):
    """One concept asked about: an exact ``concept_identifier`` and / or a ``description``."""

    model_config = _CONFIG
    concept_identifier: str | None = Field(
        default=None, description="The concept's name (also matched as a string)."
    )
    description: str | None = Field(default=None, description="What the concept is like.")


class LocationQueryUnit(BaseModel):
    """A place: ``name`` (required) and optional ``coordinates``."""

    model_config = _CONFIG
    name: str
    coordinates: str | None = None


class ParticipantQueryUnit(BaseModel):
    """Someone involved: optional ``name`` and ``role``."""

    model_config = _CONFIG
    name: str | None = None
    role: str | None = None


class EnvironmentQueryUnit(BaseModel):
    """Optional ``atmosphere`` and ``tone``."""

    model_config = _CONFIG
    atmosphere: str | None = None
    tone: str | None = None


class EventQueryUnit(BaseModel):
    """``action`` (required), optional ``initiator`` and ``target``."""

    model_config = _CONFIG
    action: str
    initiator: str | None = None
    target: str | None = None


class TimeSpanQueryUnit(BaseModel):
    """Optional ``start`` / ``end`` (aware UTC). Accepted, not scored."""

    model_config = _CONFIG
    start: Timestamp | None = None
    end: Timestamp | None = None


class SituationQueryUnit(BaseModel):
    """One situation asked about; its parts are "and"-ed. Lists are mean-pooled per field."""

    model_config = _CONFIG
    narrative: str | None = None
    location: list[LocationQueryUnit] | None = None
    participants: list[ParticipantQueryUnit] | None = None
    time_span: list[TimeSpanQueryUnit] | None = None
    environment: EnvironmentQueryUnit | None = None
    event: list[EventQueryUnit] | None = None


class SemanticQuery(RootModel[list[SemanticQueryUnit]]):
    """``MemoryRetrieveQueryVariant::Semantic(Vec<SemanticQueryUnit>)``."""

    model_config = ConfigDict(frozen=True)

    @property
    def units(self) -> list[SemanticQueryUnit]:
        return self.root


class SituationQuery(RootModel[list[SituationQueryUnit]]):
    """``MemoryRetrieveQueryVariant::Situation(Vec<SituationQueryUnit>)``."""

    model_config = ConfigDict(frozen=True)

    @property
    def units(self) -> list[SituationQueryUnit]:
        return self.root


MemoryRetrieveQueryVariant = Annotated[
    SemanticQuery | SituationQuery,
    ExternallyTagged({("Semantic",): SemanticQuery, ("Situation",): SituationQuery}),
]
"""``{"Semantic": [...]}`` | ``{"Situation": [...]}``."""


class MemoryRetrieveQuery(BaseModel):
    """A retrieval query: ``tag`` strings (mean-pooled) and a Semantic or Situation variant."""

    model_config = _CONFIG
    tag: list[str] = Field(description="Tags; an empty list gives the zero tag vector.")
    variant: MemoryRetrieveQueryVariant

    @classmethod
    def semantic(
        cls, units: Sequence[SemanticQueryUnit | dict[str, Any]], *, tag: Sequence[str] = ()
    ) -> MemoryRetrieveQuery:
        """A Semantic query from units (models or dicts)."""
        return cls(tag=list(tag), variant=SemanticQuery.model_validate(list(units)))

    @classmethod
    def situation(
        cls, units: Sequence[SituationQueryUnit | dict[str, Any]], *, tag: Sequence[str] = ()
    ) -> MemoryRetrieveQuery:
        """A Situation query from units (models or dicts)."""
        return cls(tag=list(tag), variant=SituationQuery.model_validate(list(units)))

    @property
    def kind(self) -> Literal["Semantic", "Situation"]:
        """``"Semantic"`` or ``"Situation"``."""
        return "Semantic" if isinstance(self.variant, SemanticQuery) else "Situation"

    @property
    def units(self) -> list[SemanticQueryUnit] | list[SituationQueryUnit]:
        """The variant's units."""
        return self.variant.root

    def to_json(self) -> str:
        """Compact JSON in the serde shape (``None`` written as ``null``)."""
        return dumps_serde(self.model_dump(mode="python"))

    @classmethod
    def from_json(cls, text: str | bytes) -> MemoryRetrieveQuery:
        """Parses one query from serde JSON."""
        return cls.model_validate_json(text)


class PrioritizedMemoryRetrieveQuery(BaseModel):
    """``{priority: u32, query}``: a query with the weight used when mixing several."""

    model_config = _CONFIG
    priority: int = Field(ge=0, le=2**32 - 1, description="u32 priority.")
    query: MemoryRetrieveQuery
