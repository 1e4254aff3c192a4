"""Query embedding (docs/spec.md §3): a batch of queries → padded tensors with presence masks.

Every string of every query is collected first and embedded once (query side: the embedder's
``embed_query`` when it has one), then scattered into

=================  ==================  =====================================================
attribute          shape / dtype       meaning
=================  ==================  =====================================================
``tag``            (B, D) f32          mean of the query's tag embeddings (zero: no tags)
``kind``           (B,) i64            ``QUERY_SEMANTIC`` (0) or ``QUERY_SITUATION`` (1)
``field``          (B, U, Q, D) f32    unit fields in ``QUERY_FIELD_NAMES`` order
``field_mask``     (B, U, Q) bool      the unit has that field
``unit_mask``      (B, U) bool         the unit exists (``U`` = most units in the batch)
=================  ==================  =====================================================

Field rules (the original's query embeddings): ``concept`` and ``description`` embedded whole;
``narrative`` in ≤ ``chunk_chars`` chunks, mean-pooled; several locations / participants /
events in one unit are mean-pooled per field over the entries that have it (``location_name``
and ``event_action`` over all entries; coordinates, participant name / role, initiator and
target over those given); an empty list is the same as no list. ``time_span`` is not embedded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from soulmem_torch.embedding._plan import EmbeddingPlan
from soulmem_torch.embedding.embedder import DEFAULT_CHUNK_CHARS
from soulmem_torch.embedding.fields import (
    QUERY_FIELD_INDEX,
    QUERY_FIELD_NAMES,
    QUERY_SEMANTIC,
    QUERY_SITUATION,
)
from soulmem_torch.errors import ValidationError
from soulmem_torch.model.query import (
    MemoryRetrieveQuery,
    PrioritizedMemoryRetrieveQuery,
    SemanticQuery,
    SemanticQueryUnit,
    SituationQueryUnit,
)

__all__ = ["QueryEmbeddingBatch", "as_query", "cached_note_side", "embed_queries"]


class QueryEmbeddingBatch:
    """Embedded queries, padded to ``U`` units (see the module docstring for the shapes).

    ``field`` is the padded ``(B, U, Q, D)`` block. :func:`embed_queries` keeps it compact
    instead — the distinct slot vectors and each cell's slot (``-1``: absent) — and makes the
    dense block only when something reads ``field`` (:meth:`field_slice` reads one field of
    some queries without it: a batch of free-text questions fills 1–2 of the ``Q`` fields, so
    the padded block is mostly zeros that would be written and never read).
    """

    __slots__ = ("_field", "_slot_of", "_slots", "field_mask", "kind", "tag", "unit_mask")

    def __init__(
        self,
        tag: Tensor,
        kind: Tensor,
        field: Tensor | None,
        field_mask: Tensor,
        unit_mask: Tensor,
        *,
        slots: Tensor | None = None,
        slot_of: Tensor | None = None,
    ) -> None:
        if field is None and (slots is None or slot_of is None):
            raise ValidationError("field: expected a (B, U, Q, D) tensor, or slots and slot_of")
        self.tag, self.kind, self.field_mask, self.unit_mask = tag, kind, field_mask, unit_mask
        self._field, self._slots, self._slot_of = field, slots, slot_of

    def __repr__(self) -> str:
        b, u, q = (int(s) for s in self.field_mask.shape)
        return f"QueryEmbeddingBatch(B={b}, U={u}, Q={q}, D={self.dim}, device={self.device})"

    @property
    def field(self) -> Tensor:
        """(B, U, Q, D) float32: the unit fields, zeros where absent (made on first read when
        the batch is compact)."""
        if self._field is None:
            assert self._slots is not None and self._slot_of is not None
            slot_of, slots = self._slot_of, self._slots
            field = slots.new_zeros((*slot_of.shape, int(slots.shape[1])))
            flat = (slot_of.reshape(-1) >= 0).nonzero().squeeze(1)
            field.view(-1, int(slots.shape[1]))[flat] = slots[slot_of.reshape(-1)[flat]]
            self._field = field
        return self._field

    def field_slice(self, rows: Tensor, i: int, *, absent_zero: bool = True) -> Tensor:
        """``field[rows, :, i]``: (b, U, D), the same values, without the dense block.

        ``absent_zero=False``: the units without field ``i`` hold some other finite row
        instead of zeros (for a caller that masks them out itself)."""
        if self._field is not None:
            return self._field[rows, :, i]
        assert self._slots is not None and self._slot_of is not None
        at = self._slot_of[rows, :, i]
        out = self._slots.index_select(0, at.clamp(min=0).reshape(-1))
        out = out.view(*at.shape, int(self._slots.shape[1]))
        return out.masked_fill_((at < 0).unsqueeze(-1), 0.0) if absent_zero else out

    @property
    def num_queries(self) -> int:
        return int(self.tag.shape[0])

    @property
    def num_units(self) -> int:
        return int(self.unit_mask.shape[1])

    @property
    def dim(self) -> int:
        return int(self.tag.shape[1])

    @property
    def device(self) -> torch.device:
        return self.tag.device

    def _with(self, f: Any, field_mask: Tensor, unit_mask: Tensor) -> QueryEmbeddingBatch:
        if self._field is not None:
            return QueryEmbeddingBatch(
                f(self.tag), f(self.kind), f(self._field), field_mask, unit_mask
            )
        assert self._slots is not None and self._slot_of is not None
        return QueryEmbeddingBatch(
            f(self.tag), f(self.kind), None, field_mask, unit_mask,
            slots=self._slots, slot_of=f(self._slot_of),
        )  # fmt: skip

    def to(self, device: torch.device | str) -> QueryEmbeddingBatch:
        """A copy on ``device``."""
        out = self._with(
            lambda t: t.to(device), self.field_mask.to(device), self.unit_mask.to(device)
        )
        if out._slots is not None:
            out._slots = out._slots.to(device)
        return out

    def select(self, index: Tensor | Sequence[int]) -> QueryEmbeddingBatch:
        """The queries at ``index`` (a sub-batch)."""
        idx = torch.as_tensor(index, dtype=torch.long, device=self.tag.device)
        return self._with(lambda t: t[idx], self.field_mask[idx], self.unit_mask[idx])

    def score(
        self,
        graph: Any,
        *,
        weights: Any = None,
        string_scores: Tensor | None = None,
    ) -> Tensor:
        """Fused similarity of these queries against every note of ``graph`` (docs/spec.md §4).

        Args:
            graph: a ``MemoryGraph`` (or anything with ``node_type`` and, when the notes are
                embedded, ``tag_emb`` / ``tag_mask`` / ``field_emb`` / ``field_mask``).
            weights: ``BlendWeights``; ``None`` → defaults.
            string_scores: shape (B, N); the string channel
                (:func:`~soulmem_torch.embedding.identifiers.string_channel_scores`); ``None``
                → no string channel.

        Returns:
            shape (B, N), float32, on the graph's device.
        """
        from soulmem_torch.functional.similarity import fused_similarity_compact

        node_type = graph.node_type
        notes = cached_note_side(graph)
        if notes is None:  # nothing embedded: every note scores 0
            b, n = self.num_queries, int(node_type.shape[0])
            return torch.zeros(b, n, dtype=torch.float32, device=node_type.device)
        q = self.to(node_type.device)
        return fused_similarity_compact(
            q.tag,
            q.kind,
            q.field,
            q.field_mask,
            q.unit_mask,
            notes,
            node_type,
            string_scores=string_scores,
            weights=weights,
        )


def cached_note_side(graph: Any, *, cache: bool = True) -> Any:
    """The normalized compact note side of ``graph``'s similarity
    (:func:`~soulmem_torch.functional.similarity.note_side_compact`), once per snapshot: kept
    in ``graph.cache["similarity_note_side"]`` when the graph has a cache and ``cache`` is
    True (a ``MemoryBank`` asks with ``cache=False`` and keeps the one copy in its union).
    ``None`` when the notes have no tag or field vectors.

    Accepts a ``MemoryGraph`` (``field_rows`` / ``field_pos``) or anything with dense
    ``field_emb`` / ``field_mask`` (compacted first)."""
    from soulmem_torch.functional.similarity import note_side, note_side_compact

    store = getattr(graph, "cache", None)
    # the tables as held (a snapshot's sparse raw tables are not made dense)
    tag_emb = getattr(graph, "tag_table", None)
    if tag_emb is None:
        tag_emb = getattr(graph, "tag_emb", None)
    rows = getattr(graph, "field_table", None)
    if rows is None:
        rows = getattr(graph, "field_rows", None)
    sources = (tag_emb, getattr(graph, "tag_mask", None), rows, getattr(graph, "field_pos", None))
    hit = store.get("similarity_note_side") if isinstance(store, dict) else None
    if hit is not None and all(a is b for a, b in zip(hit[0], sources)):
        return hit[1]
    if tag_emb is None:
        return None
    if rows is not None:
        notes = note_side_compact(tag_emb, graph.tag_mask, rows, graph.field_pos)
    else:
        field_emb = getattr(graph, "field_emb", None)
        if field_emb is None:
            return None
        notes = note_side(tag_emb, graph.tag_mask, field_emb, graph.field_mask)
    if cache and isinstance(store, dict):
        store["similarity_note_side"] = (sources, notes)
    return notes


def as_query(query: Any, i: int = 0) -> MemoryRetrieveQuery:
    """A ``MemoryRetrieveQuery`` from a query, a prioritized query or its JSON-shaped dict."""
    if isinstance(query, MemoryRetrieveQuery):
        return query
    if isinstance(query, PrioritizedMemoryRetrieveQuery):
        return query.query
    if isinstance(query, dict):
        try:
            return MemoryRetrieveQuery.model_validate(query)
        except Exception as exc:  # pydantic's ValidationError → ours, naming the query
            raise ValidationError(f"queries[{i}]: not a MemoryRetrieveQuery: {exc}") from None
    raise ValidationError(
        f"queries[{i}]: expected a MemoryRetrieveQuery, found {type(query).__name__}"
    )


class _QueryPlanner:
    def __init__(self, plan: EmbeddingPlan) -> None:
        self.plan = plan
        self.cells: list[tuple[int, int, int, int]] = []  # (query, unit, field, slot)

    def pooled(self, b: int, u: int, name: str, items: Sequence[tuple[str, str]]) -> None:
        """``field = mean(embed(text) for text in items)`` (items: (text, origin)); none → absent."""
        if not items:
            return
        slot = self.plan.new_slot()
        for text, origin in items:
            self.plan.add(slot, text, 1.0 / len(items), origin)
        self.cells.append((b, u, QUERY_FIELD_INDEX[name], slot))

    def semantic(self, b: int, u: int, unit: SemanticQueryUnit, where: str) -> None:
        if unit.concept_identifier is not None:
            self.pooled(b, u, "concept", [(unit.concept_identifier, f"{where}.concept_identifier")])
        if unit.description is not None:
            self.pooled(b, u, "description", [(unit.description, f"{where}.description")])

    def situation(self, b: int, u: int, unit: SituationQueryUnit, where: str) -> None:
        if unit.narrative is not None:
            slot = self.plan.new_slot()
            self.plan.add_chunked(slot, unit.narrative, 1.0, f"{where}.narrative")
            self.cells.append((b, u, QUERY_FIELD_INDEX["narrative"], slot))
        locs = unit.location or []
        if locs:  # (an empty list is no list: nothing to pool)
            self.pooled(
                b,
                u,
                "location_name",
                [(x.name, f"{where}.location[{k}].name") for k, x in enumerate(locs)],
            )
            self.pooled(
                b,
                u,
                "location_coordinates",
                [
                    (x.coordinates, f"{where}.location[{k}].coordinates")
                    for k, x in enumerate(locs)
                    if x.coordinates is not None
                ],
            )
        people = unit.participants or []
        if people:
            self.pooled(
                b,
                u,
                "participant_name",
                [
                    (p.name, f"{where}.participants[{k}].name")
                    for k, p in enumerate(people)
                    if p.name is not None
                ],
            )
            self.pooled(
                b,
                u,
                "participant_role",
                [
                    (p.role, f"{where}.participants[{k}].role")
                    for k, p in enumerate(people)
                    if p.role is not None
                ],
            )
        env = unit.environment
        if env is not None:
            if env.atmosphere is not None:
                self.pooled(
                    b,
                    u,
                    "environment_atmosphere",
                    [(env.atmosphere, f"{where}.environment.atmosphere")],
                )
            if env.tone is not None:
                self.pooled(b, u, "environment_tone", [(env.tone, f"{where}.environment.tone")])
        events = unit.event or []
        if events:
            self.pooled(
                b,
                u,
                "event_action",
                [(e.action, f"{where}.event[{k}].action") for k, e in enumerate(events)],
            )
            self.pooled(
                b,
                u,
                "event_initiator",
                [
                    (e.initiator, f"{where}.event[{k}].initiator")
                    for k, e in enumerate(events)
                    if e.initiator is not None
                ],
            )
            self.pooled(
                b,
                u,
                "event_target",
                [
                    (e.target, f"{where}.event[{k}].target")
                    for k, e in enumerate(events)
                    if e.target is not None
                ],
            )


def embed_queries(
    queries: Sequence[MemoryRetrieveQuery | PrioritizedMemoryRetrieveQuery | dict[str, Any]],
    embedder: Any,
    *,
    batch_size: int = 256,
    chunk_chars: int | None = DEFAULT_CHUNK_CHARS,
    device: torch.device | str | None = None,
) -> QueryEmbeddingBatch:
    """Embeds a batch of queries into padded tensors (see the module docstring).

    Args:
        queries: ``MemoryRetrieveQuery`` (or prioritized queries, or their JSON dicts).
        embedder: an :class:`~soulmem_torch.embedding.embedder.Embedder`; its ``embed_query``
            is used when present.
        batch_size: > 0. Distinct strings per embedder call.
        chunk_chars: > 0 or ``None``. Chunk length for narratives.
        device: where the tensors go; ``None`` → CPU.

    Raises:
        ValidationError: a malformed query, or a bad embedder output (naming the query field).
    """
    resolved = [as_query(q, i) for i, q in enumerate(queries)]
    plan = EmbeddingPlan(chunk_chars=chunk_chars)
    planner = _QueryPlanner(plan)
    tag_slots: list[int] = []
    kinds: list[int] = []
    units_per_query: list[int] = []
    for b, q in enumerate(resolved):
        where = f"queries[{b}]"
        slot = plan.new_slot()
        for k, t in enumerate(q.tag):
            plan.add(slot, t, 1.0 / len(q.tag), f"{where}.tag[{k}]")
        tag_slots.append(slot)
        units = q.units
        units_per_query.append(len(units))
        if isinstance(q.variant, SemanticQuery):
            kinds.append(QUERY_SEMANTIC)
            for u, unit in enumerate(units):
                planner.semantic(b, u, unit, f"{where}.variant.Semantic[{u}]")  # type: ignore[arg-type]
        else:
            kinds.append(QUERY_SITUATION)
            for u, unit in enumerate(units):
                planner.situation(b, u, unit, f"{where}.variant.Situation[{u}]")  # type: ignore[arg-type]
    slots = plan.assemble(embedder, query=True, batch_size=batch_size, device=device)
    dev = slots.device
    bsz, dim = len(resolved), int(slots.shape[1])
    num_units = max([1, *units_per_query])
    nq = len(QUERY_FIELD_NAMES)
    tag = (
        slots[torch.tensor(tag_slots, dtype=torch.long, device=dev)]
        if bsz
        else slots.new_zeros(0, dim)
    )
    # the cells' slots, -1 where absent: the padded (B, U, Q, D) block is made only if read
    slot_of = torch.full((bsz * num_units * nq,), -1, dtype=torch.long, device=dev)
    field_mask = torch.zeros(bsz, num_units, nq, dtype=torch.bool, device=dev)
    if planner.cells:
        cells = torch.tensor(planner.cells, dtype=torch.long, device=dev)
        flat = (cells[:, 0] * num_units + cells[:, 1]) * nq + cells[:, 2]
        slot_of[flat] = cells[:, 3]
        field_mask.view(-1)[flat] = True
    counts = torch.tensor(units_per_query, dtype=torch.long, device=dev)
    unit_mask = torch.arange(num_units, device=dev).unsqueeze(0) < counts.unsqueeze(1)
    return QueryEmbeddingBatch(
        tag=tag,
        kind=torch.tensor(kinds, dtype=torch.long, device=dev),
        field=None,
        field_mask=field_mask,
        unit_mask=unit_mask,
        slots=slots,
        slot_of=slot_of.view(bsz, num_units, nq),
    )
