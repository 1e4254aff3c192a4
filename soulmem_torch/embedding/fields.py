"""Field layout of a note's embedding (SPEC §3), shared by the embedder, the graph and the kernels.

Every note kind stores a tag vector plus a fixed set of named field vectors. ``FIELD_NAMES`` is
the column order of ``MemoryGraph.field_emb`` ``(N, F, D)`` / ``field_mask`` ``(N, F)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from soulmem_torch.model import MemoryNote

__all__ = ["FIELD_INDEX", "FIELD_NAMES", "EmbeddedMemoryNote", "MemoryEmbedding"]

FIELD_NAMES: tuple[str, ...] = (
    # Semantic
    "content",
    "aliases",
    "description",
    # SpecificSituation (and, for the leaf fields, AbstractSituation)
    "narrative",
    "location_name",
    "location_coordinates",
    "participant_name",
    "participant_role",
    "participant_fused",
    "environment_atmosphere",
    "environment_tone",
    "event_action",
    "event_initiator",
    "event_target",
    # AbstractSituation only
    "fused_self",
)
FIELD_INDEX: dict[str, int] = {name: i for i, name in enumerate(FIELD_NAMES)}


@dataclass
class MemoryEmbedding:
    """A note's embedding: ``tag`` (D,) plus named field vectors (each (D,)).

    Absent fields are simply missing from ``fields`` (a Procedure has none).
    """

    tag: torch.Tensor
    fields: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def dim(self) -> int:
        return int(self.tag.shape[-1])


@dataclass
class EmbeddedMemoryNote:
    """A note with its (optional) embedding, as stored in a ``MemoryCluster``.

    Graph algorithms (PPR, Bayes) do not need an embedding; similarity scores a note without one
    as 0.
    """

    note: MemoryNote
    embedding: MemoryEmbedding | None = None
