"""Note embedding (docs/spec.md §3): every note → ``MemoryEmbedding { tag, fields }``, in batched calls.

``embed_notes`` walks all notes once, collecting every string they hold; the distinct strings
are embedded in a few batched embedder calls and every field is assembled with one
``index_add_`` (means, intensity-weighted pools and blends are weights). The embedder is never
called per note.

Field rules (exactly the original's ``Embeddable`` impls):

* ``tag`` = mean of the tag embeddings; no tags → zero vector.
* Semantic: ``content`` and ``description`` embedded in ≤ ``chunk_chars``-character chunks and
  mean-pooled; ``aliases`` = mean of the alias embeddings, no aliases → a copy of ``content``.
* SpecificSituation: ``narrative`` (chunked); ``location_name`` / ``location_coordinates`` when
  it has a location; participants: per participant ``fused = 0.7·name + 0.3·role``, field-wise
  mean of ``name`` / ``role`` / ``fused`` over participants; ``environment_atmosphere`` /
  ``environment_tone`` (always); events: ``action`` / ``initiator`` / ``target`` pooled with
  weights ``action_intensity / Σ action_intensity``.
  **DECISION:** when ``Σ action_intensity == 0`` (the original divides by zero and produces
  NaN), the events are pooled with equal weights.
* AbstractSituation: the fields of its leaf (a lone participant's ``participant_fused`` too),
  plus ``fused_self``: Location mean(name, coordinates); Participant its fused; Environment
  mean(atmosphere, tone); Event mean(action, initiator, target).
* Procedure: tag only.

Vectors with the same recipe (the same texts and weights) are computed once and handed out as
views of one row (a speaker in every turn, an empty environment): the values are those of a
separate computation, and a snapshot's compact layout stores them once.

Text embedded whole (tags, aliases, leaf fields) is passed to the embedder as is, ``""``
included; chunked text that is empty or whitespace has no chunk and gives the zero vector
(**DECISION:** the original fails with ``InvalidInput`` there).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from soulmem_torch._gcpause import gc_paused
from soulmem_torch.embedding._plan import EmbeddingPlan
from soulmem_torch.embedding.compact import pack_rows
from soulmem_torch.embedding.embedder import DEFAULT_CHUNK_CHARS
from soulmem_torch.embedding.fields import EmbeddedMemoryNote, MemoryEmbedding
from soulmem_torch.errors import ValidationError
from soulmem_torch.model import (
    AbstractSituation,
    Environment,
    Event,
    Location,
    MemoryNote,
    Participant,
    ProcMemory,
    SemMemory,
    SpecificSituation,
)

__all__ = [
    "embed_note_groups",
    "embed_notes",
    "embed_notes_plain",
    "embed_texts",
    "note_plain_text",
]

_PARTICIPANT_NAME_WEIGHT = 0.7
"""``raw_linear_blend(name, role, 0.7)``: fused = 0.7·name + 0.3·role."""


def _unwrap(note: Any, i: int) -> MemoryNote:
    if isinstance(note, EmbeddedMemoryNote):
        note = note.note
    if not isinstance(note, MemoryNote):
        raise ValidationError(
            f"notes[{i}]: expected a MemoryNote or EmbeddedMemoryNote, found {type(note).__name__}"
        )
    return note


def _event_weights(events: Sequence[Event], where: str) -> list[float]:
    """``intensity / Σ intensity`` in float32 as the original; equal weights when Σ = 0."""
    intensity = np.array([ev.action_intensity for ev in events], dtype=np.float32)
    if not np.isfinite(intensity).all():
        raise ValidationError(f"{where}.event: expected finite action_intensity values")
    total = np.float32(0.0)
    for value in intensity:  # sequential f32 sum, as Rust's iterator sum
        total = np.float32(total + value)
    if total == 0:
        return [1.0 / len(events)] * len(events)
    return [float(np.float32(v / total)) for v in intensity]


class _NotePlanner:
    def __init__(self, plan: EmbeddingPlan) -> None:
        self.plan = plan

    def field(self, fields: dict[str, int], name: str) -> int:
        slot = self.plan.new_slot()
        fields[name] = slot
        return slot

    def location(self, fields: dict[str, int], loc: Location, where: str) -> None:
        self.plan.add(self.field(fields, "location_name"), loc.name, 1.0, f"{where}.name")
        self.plan.add(
            self.field(fields, "location_coordinates"),
            loc.coordinates,
            1.0,
            f"{where}.coordinates",
        )

    def participants(
        self, fields: dict[str, int], people: Sequence[Participant], where: str
    ) -> None:
        name = self.field(fields, "participant_name")
        role = self.field(fields, "participant_role")
        fused = self.field(fields, "participant_fused")
        w = 1.0 / len(people)
        wn = _PARTICIPANT_NAME_WEIGHT
        for k, p in enumerate(people):
            origin = f"{where}[{k}]"
            self.plan.add(name, p.name, w, f"{origin}.name")
            self.plan.add(role, p.role, w, f"{origin}.role")
            self.plan.add(fused, p.name, wn * w, f"{origin}.name")
            self.plan.add(fused, p.role, (1.0 - wn) * w, f"{origin}.role")

    def environment(self, fields: dict[str, int], env: Environment, where: str) -> None:
        self.plan.add(
            self.field(fields, "environment_atmosphere"), env.atmosphere, 1.0, f"{where}.atmosphere"
        )
        self.plan.add(self.field(fields, "environment_tone"), env.tone, 1.0, f"{where}.tone")

    def events(self, fields: dict[str, int], events: Sequence[Event], where: str) -> None:
        weights = _event_weights(events, where)
        action = self.field(fields, "event_action")
        initiator = self.field(fields, "event_initiator")
        target = self.field(fields, "event_target")
        for k, (ev, w) in enumerate(zip(events, weights)):
            origin = f"{where}[{k}]"
            self.plan.add(action, ev.action, w, f"{origin}.action")
            self.plan.add(initiator, ev.initiator, w, f"{origin}.initiator")
            self.plan.add(target, ev.target, w, f"{origin}.target")

    def note(self, note: MemoryNote, i: int) -> tuple[int, dict[str, int]]:
        plan = self.plan
        where = f"notes[{i}] ({note.id})"
        tag = plan.new_slot()
        for k, t in enumerate(note.tags):
            plan.add(tag, t, 1.0 / len(note.tags), f"{where}.tags[{k}]")
        fields: dict[str, int] = {}
        mt = note.mem_type
        if isinstance(mt, SemMemory):
            content = self.field(fields, "content")
            plan.add_chunked(content, mt.content, 1.0, f"{where}.content")
            aliases = self.field(fields, "aliases")
            if mt.aliases:
                for k, alias in enumerate(mt.aliases):
                    plan.add(aliases, alias, 1.0 / len(mt.aliases), f"{where}.aliases[{k}]")
            else:
                plan.add_chunked(aliases, mt.content, 1.0, f"{where}.content")
            plan.add_chunked(
                self.field(fields, "description"), mt.description, 1.0, f"{where}.description"
            )
        elif isinstance(mt, SpecificSituation):
            plan.add_chunked(
                self.field(fields, "narrative"), mt.narrative, 1.0, f"{where}.narrative"
            )
            ctx = mt.context
            if ctx.location is not None:
                self.location(fields, ctx.location, f"{where}.context.location")
            if ctx.participants:
                self.participants(fields, ctx.participants, f"{where}.context.participants")
            self.environment(fields, ctx.environment, f"{where}.context.environment")
            if ctx.event:
                self.events(fields, ctx.event, f"{where}.context.event")
        elif isinstance(mt, AbstractSituation):
            leaf = mt.leaf
            lw = f"{where}.{type(leaf).__name__}"
            fused_self = None
            if isinstance(leaf, Location):
                self.location(fields, leaf, lw)
                fused_self = self.field(fields, "fused_self")
                plan.add(fused_self, leaf.name, 0.5, f"{lw}.name")
                plan.add(fused_self, leaf.coordinates, 0.5, f"{lw}.coordinates")
            elif isinstance(leaf, Participant):
                self.participants(fields, [leaf], lw)
                fused_self = self.field(fields, "fused_self")
                plan.add(fused_self, leaf.name, _PARTICIPANT_NAME_WEIGHT, f"{lw}.name")
                plan.add(fused_self, leaf.role, 1.0 - _PARTICIPANT_NAME_WEIGHT, f"{lw}.role")
            elif isinstance(leaf, Environment):
                self.environment(fields, leaf, lw)
                fused_self = self.field(fields, "fused_self")
                plan.add(fused_self, leaf.atmosphere, 0.5, f"{lw}.atmosphere")
                plan.add(fused_self, leaf.tone, 0.5, f"{lw}.tone")
            elif isinstance(leaf, Event):
                action = self.field(fields, "event_action")
                initiator = self.field(fields, "event_initiator")
                target = self.field(fields, "event_target")
                plan.add(action, leaf.action, 1.0, f"{lw}.action")
                plan.add(initiator, leaf.initiator, 1.0, f"{lw}.initiator")
                plan.add(target, leaf.target, 1.0, f"{lw}.target")
                fused_self = self.field(fields, "fused_self")
                for part in ("action", "initiator", "target"):
                    plan.add(fused_self, getattr(leaf, part), 1.0 / 3.0, f"{lw}.{part}")
            else:  # pragma: no cover - the model admits no other leaf
                raise ValidationError(f"{where}: unknown abstract leaf {type(leaf).__name__}")
        elif not isinstance(mt, ProcMemory):  # pragma: no cover - the model admits no other kind
            raise ValidationError(f"{where}.mem_type: unknown kind {type(mt).__name__}")
        return tag, fields


@gc_paused()  # a plan holds a few small acyclic objects per field (see soulmem_torch._gcpause)
def embed_notes(
    notes: Sequence[MemoryNote | EmbeddedMemoryNote],
    embedder: Any,
    *,
    batch_size: int = 256,
    chunk_chars: int | None = DEFAULT_CHUNK_CHARS,
    device: torch.device | str | None = None,
) -> list[MemoryEmbedding]:
    """Embeds every note into its fields (see the module docstring) in batched embedder calls.

    Args:
        notes: ``MemoryNote`` (or ``EmbeddedMemoryNote``, whose note is used).
        embedder: an :class:`~soulmem_torch.embedding.embedder.Embedder`.
        batch_size: > 0. Distinct strings per embedder call.
        chunk_chars: > 0 or ``None`` (no chunking). Chunk length for content, description and
            narrative.
        device: where the vectors go; ``None`` → CPU.

    Returns:
        One ``MemoryEmbedding`` per note, float32, in input order.

    Raises:
        ValidationError: a non-note input, or an embedder output of the wrong shape or with NaN
            / inf — the message names the note and field the bad string came from.

    Example:
        >>> from soulmem_torch.embedding import HashingEmbedder
        >>> from soulmem_torch.model import MemoryNote, SemMemory
        >>> note = MemoryNote.build(SemMemory(content="丛雨丸", aliases=[],
        ...     concept_type="Entity", description="神刀"), tags=["物体"])
        >>> (emb,) = embed_notes([note], HashingEmbedder(dim=32))
        >>> sorted(emb.fields), bool((emb.fields["aliases"] == emb.fields["content"]).all())
        (['aliases', 'content', 'description'], True)
    """
    rows, tag_row, fields = _distinct_rows(notes, embedder, batch_size, chunk_chars, device)
    return _views(rows, tag_row, fields)


def _distinct_rows(
    notes: Sequence[MemoryNote | EmbeddedMemoryNote],
    embedder: Any,
    batch_size: int,
    chunk_chars: int | None,
    device: torch.device | str | None,
) -> tuple[torch.Tensor, list[int], list[dict[str, int]]]:
    """``(rows (K, D), row of each note's tag, each note's fields as name → row)``: fields
    built from the same texts with the same weights share one row (views of the same memory:
    the snapshot's compact layout then stores that vector once)."""
    resolved = [_unwrap(n, i) for i, n in enumerate(notes)]
    plan = EmbeddingPlan(chunk_chars=chunk_chars)
    planner = _NotePlanner(plan)
    layout = [planner.note(note, i) for i, note in enumerate(resolved)]
    rows, row_of = plan.assemble_distinct(
        embedder, query=False, batch_size=batch_size, device=device
    )
    tag_row = [row_of[tag] for tag, _ in layout]
    fields = [{name: row_of[s] for name, s in fs.items()} for _, fs in layout]
    return rows, tag_row, fields


def _views(
    rows: torch.Tensor, tag_row: Sequence[int], fields: Sequence[dict[str, int]]
) -> list[MemoryEmbedding]:
    return [
        MemoryEmbedding(tag=rows[t], fields={name: rows[r] for name, r in fs.items()})
        for t, fs in zip(tag_row, fields)
    ]


@gc_paused()
def embed_note_groups(
    groups: Sequence[Sequence[MemoryNote | EmbeddedMemoryNote]],
    embedder: Any,
    *,
    batch_size: int = 256,
    chunk_chars: int | None = DEFAULT_CHUNK_CHARS,
) -> list[list[MemoryEmbedding]]:
    """:func:`embed_notes` of several groups of notes (a bank's agents) in one plan — a
    string several groups hold is embedded once — each group's vectors packed, when they
    qualify, as :meth:`MemoryCluster.add_notes
    <soulmem_torch.runtime.cluster.MemoryCluster.add_notes>` would pack that group
    (:func:`~soulmem_torch.embedding.compact.pack_rows`: the group's own compact table, the
    same tensors, built without a pass over every note's vectors); else (dense, narrow or
    non-finite vectors) :func:`embed_notes`' dense views. CPU: where the cluster keeps them."""
    flat = [note for group in groups for note in group]
    rows, tag_row, fields = _distinct_rows(flat, embedder, batch_size, chunk_chars, None)
    sizes = [len(group) for group in groups]
    packed = pack_rows(rows, tag_row, fields, sizes)
    if packed is not None:
        return packed
    views = _views(rows, tag_row, fields)
    starts = np.cumsum([0, *sizes]).tolist()
    return [views[a:b] for a, b in itertools.pairwise(starts)]


# -------------------------------------------------------------------------------------------
# plain mode
# -------------------------------------------------------------------------------------------
def note_plain_text(note: MemoryNote) -> str:
    """The one text that stands for a note in plain mode.

    Semantic: content, then description; SpecificSituation: narrative; AbstractSituation: its
    leaf's strings; Procedure: the action's content. Parts are joined by newlines.
    """
    mt = note.mem_type
    if isinstance(mt, SemMemory):
        parts = [mt.content, mt.description]
    elif isinstance(mt, SpecificSituation):
        parts = [mt.narrative]
    elif isinstance(mt, AbstractSituation):
        leaf = mt.leaf
        parts = [v for v in leaf.model_dump().values() if isinstance(v, str)]
    elif isinstance(mt, ProcMemory):
        parts = [mt.action.content]
    else:  # pragma: no cover
        parts = []
    return "\n".join(p for p in parts if p)


@gc_paused()
def embed_texts(
    texts: Sequence[str],
    embedder: Any,
    *,
    query: bool = False,
    batch_size: int = 256,
    chunk_chars: int | None = DEFAULT_CHUNK_CHARS,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Plain mode: one vector per text (chunked and mean-pooled), shape ``(len(texts), D)`` f32.

    ``query=True`` uses the embedder's query side (``embed_query``) when it has one. Empty text
    gives the zero vector.
    """
    plan = EmbeddingPlan(chunk_chars=chunk_chars)
    for i, text in enumerate(texts):
        plan.add_chunked(plan.new_slot(), text, 1.0, f"texts[{i}]")
    return plan.assemble(embedder, query=query, batch_size=batch_size, device=device)


def embed_notes_plain(
    notes: Sequence[MemoryNote | EmbeddedMemoryNote],
    embedder: Any,
    *,
    batch_size: int = 256,
    chunk_chars: int | None = DEFAULT_CHUNK_CHARS,
    device: torch.device | str | None = None,
) -> list[MemoryEmbedding]:
    """Plain mode: one vector per note (:func:`note_plain_text`), as ``MemoryEmbedding.tag``."""
    resolved = [_unwrap(n, i) for i, n in enumerate(notes)]
    x = embed_texts(
        [note_plain_text(n) for n in resolved],
        embedder,
        batch_size=batch_size,
        chunk_chars=chunk_chars,
        device=device,
    )
    return [MemoryEmbedding(tag=row, fields={}) for row in x]
