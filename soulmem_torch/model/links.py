"""Memory links (docs/spec.md §1): stored on the source note, typed and weighted."""

from __future__ import annotations

from typing import Annotated, Any, TypeAlias

from pydantic import BaseModel, ConfigDict, Field

from soulmem_torch.model._tagged import ExternallyTagged
from soulmem_torch.model._types import Intensity, Probability, UnitF32
from soulmem_torch.model.ids import LinkId, MemoryId

__all__ = [
    "AbstractToSpecific",
    "MemoryLink",
    "MemoryLinkType",
    "ProcMemLink",
    "SemMemLink",
    "SituationMemLink",
    "SpecificToAbstract",
    "TrigToAction",
]

_CONFIG = ConfigDict(extra="ignore", validate_assignment=True)


class TrigToAction(BaseModel):
    """``Proc(TrigToAction{prob})``: a trigger → action link with probability ``prob``."""

    model_config = _CONFIG
    prob: Probability


class SemMemLink(BaseModel):
    """``Sem(SemMemLink{verb, confidence})``: a semantic relation (confidence is an f32)."""

    model_config = _CONFIG
    verb: str
    confidence: UnitF32


class AbstractToSpecific(BaseModel):
    """``Situation(AbstractToSpecific{})``: an abstract pattern → one concrete episode."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class SpecificToAbstract(BaseModel):
    """``Situation(SpecificToAbstract{})``: an episode → its abstract pattern (PPR walks it)."""

    model_config = ConfigDict(extra="ignore", frozen=True)


ProcMemLink: TypeAlias = TrigToAction
SituationMemLink: TypeAlias = AbstractToSpecific | SpecificToAbstract

LINK_TYPE_TAGS = ExternallyTagged(
    {
        ("Proc", "TrigToAction"): TrigToAction,
        ("Sem",): SemMemLink,
        ("Situation", "AbstractToSpecific"): AbstractToSpecific,
        ("Situation", "SpecificToAbstract"): SpecificToAbstract,
    }
)
MemoryLinkType = Annotated[
    TrigToAction | SemMemLink | AbstractToSpecific | SpecificToAbstract, LINK_TYPE_TAGS
]
"""``Proc(TrigToAction) | Sem(SemMemLink) | Situation(AbstractToSpecific | SpecificToAbstract)``."""


class MemoryLink(BaseModel):
    """A directed, typed, weighted link ``from_ → to`` (JSON keys ``from`` / ``to``)."""

    model_config = ConfigDict(
        extra="ignore",
        validate_assignment=True,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )

    id: LinkId = Field(default_factory=LinkId.new, description="Link id (UUID v4).")
    from_: MemoryId = Field(alias="from", description="Source note id.")
    to: MemoryId = Field(description="Target note id.")
    intensity: Intensity = 1.0
    link_type: MemoryLinkType

    @classmethod
    def new(
        cls, from_: MemoryId, to: MemoryId, link_type: Any, *, intensity: float = 1.0
    ) -> MemoryLink:
        """A link with a fresh id (``MemoryLink::new`` / ``from_tuple``)."""
        return cls(from_=from_, to=to, link_type=link_type, intensity=intensity)
