"""Exact identifiers of notes and queries for the string channel (docs/spec.md §4).

:func:`build_identifier_index` walks the notes once (only Semantic notes and AbstractSituation
leaves have identifiers); :func:`query_identifiers` does the same for a query;
:func:`string_scores` runs the batched channel of
:mod:`soulmem_torch.functional.string_sim` and returns ``(B, N)`` float32 scores for
``fused_similarity(..., string_scores=...)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from soulmem_torch.embedding.fields import EmbeddedMemoryNote
from soulmem_torch.embedding.query_embedding import as_query
from soulmem_torch.errors import ValidationError
from soulmem_torch.functional.similarity import BlendWeights
from soulmem_torch.functional.string_sim import (
    IdentifierColumns,
    IdentifierIndex,
    QueryIdentifiers,
    string_channel_scores,
    string_channel_scores_segments,
)
from soulmem_torch.model import (
    AbstractSituation,
    Environment,
    Event,
    Location,
    MemoryNote,
    Participant,
    SemMemory,
)
from soulmem_torch.model.query import MemoryRetrieveQuery, SemanticQuery

__all__ = [
    "build_identifier_index",
    "query_identifiers",
    "string_scores",
    "string_scores_segments",
]


def build_identifier_index(notes: Sequence[MemoryNote | EmbeddedMemoryNote]) -> IdentifierIndex:
    """The exact identifiers of ``notes`` (node ``i`` = ``notes[i]``)."""
    index = IdentifierIndex(num_nodes=len(notes))
    for i, note in enumerate(notes):
        if isinstance(note, EmbeddedMemoryNote):
            note = note.note
        if not isinstance(note, MemoryNote):
            raise ValidationError(
                f"notes[{i}]: expected a MemoryNote or EmbeddedMemoryNote, "
                f"found {type(note).__name__}"
            )
        mt = note.mem_type
        if isinstance(mt, SemMemory):
            index.add_semantic(i, mt.content, mt.aliases)
        elif isinstance(mt, AbstractSituation):
            leaf = mt.leaf
            if isinstance(leaf, Location):
                index.add_location(i, leaf.name)
            elif isinstance(leaf, Participant):
                index.add_participant(i, leaf.name)
            elif isinstance(leaf, Environment):
                index.add_environment(i, leaf.atmosphere)
            elif isinstance(leaf, Event):
                index.add_event(i, leaf.action, leaf.initiator, leaf.target)
    return index


def query_identifiers(query: MemoryRetrieveQuery) -> QueryIdentifiers:
    """The exact identifiers of one query."""
    if isinstance(query.variant, SemanticQuery):
        return QueryIdentifiers(
            semantic=True,
            concepts=[
                u.concept_identifier for u in query.variant.root if u.concept_identifier is not None
            ],
        )
    out = QueryIdentifiers(semantic=False)
    for unit in query.variant.root:
        out.locations.extend(loc.name for loc in unit.location or [])
        out.participants.extend(p.name for p in unit.participants or [] if p.name is not None)
        if unit.environment is not None and unit.environment.atmosphere is not None:
            out.atmospheres.append(unit.environment.atmosphere)
        out.events.extend((e.action, e.initiator, e.target) for e in unit.event or [])
    return out


def string_scores(
    queries: Sequence[Any],
    notes: IdentifierIndex | Sequence[MemoryNote | EmbeddedMemoryNote],
    *,
    weights: BlendWeights | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """String-channel scores of B queries against N notes: (B, N) float32.

    Args:
        queries: ``MemoryRetrieveQuery`` (or prioritized queries / JSON dicts).
        notes: the notes in node order, or their prebuilt :class:`IdentifierIndex` (build it
            once per cluster version and reuse it).
        weights: ``BlendWeights`` (its ``sit_event_*`` weights); ``None`` → defaults.
        device: ``None`` → CPU.
    """
    w = weights if weights is not None else BlendWeights()
    index = notes if isinstance(notes, IdentifierIndex) else build_identifier_index(notes)
    idents = [query_identifiers(as_query(q, i)) for i, q in enumerate(queries)]
    return string_channel_scores(
        index,
        idents,
        event_weights=(
            w.sit_event_initiator,
            w.sit_event_target,
            w.sit_event_action,
            w.sit_event_initiator_only_action,
            w.sit_event_target_only_action,
        ),
        device=device,
    )


def string_scores_segments(
    queries: Sequence[Any],
    columns: Sequence[IdentifierColumns | None],
    owners: Sequence[int],
    num_notes: int,
    *,
    weights: BlendWeights | None = None,
    device: torch.device | str | None = None,
    cache: dict[Any, Any] | None = None,
) -> Tensor:
    """:func:`string_scores` of each query against its own notes' index, all in one pass:
    (B, num_notes) float32, query ``b`` against ``columns[owners[b]]`` (an
    :class:`~soulmem_torch.functional.string_sim.IdentifierColumns`; ``owners[b] < 0``: a
    zero row). The bank's exact-identifier channel (one index per agent); ``cache``: where
    the joined indexes of the latest batch are kept (a union snapshot's cache)."""
    w = weights if weights is not None else BlendWeights()
    idents = [
        query_identifiers(as_query(q, i)) if o >= 0 else None
        for i, (q, o) in enumerate(zip(queries, owners))
    ]
    return string_channel_scores_segments(
        columns, owners, idents, num_notes,
        event_weights=(
            w.sit_event_initiator, w.sit_event_target, w.sit_event_action,
            w.sit_event_initiator_only_action, w.sit_event_target_only_action,
        ),
        device=device,
        cache=cache,
    )  # fmt: skip
