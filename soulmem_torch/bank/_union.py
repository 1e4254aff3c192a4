"""The disjoint union of many agents' snapshots, and the segment-wise kernels over it.

A :class:`UnionSnapshot` is PyG ``Batch``-style: ``ptr`` (A + 1,) delimits each agent's notes,
``agent`` (N,) names the owner of every note, ``edge_index`` is block-diagonal (each agent's
edges shifted by its offset), and the node / edge tensors of the agents' ``MemoryGraph``
snapshots are concatenated. Node ``ptr[a] + i`` is node ``i`` of agent ``a``.

Queries never see a dense ``B × N`` matrix: query ``b`` of agent ``a_b`` works on its agent's
notes gathered as one padded row of ``M = max size of the batch's agents`` candidates
(``idx = ptr[a_b] + arange(M)``, ``valid = arange(M) < size[a_b]``), in chunks so that
``chunk × M × fields × D`` stays bounded. PPR runs on the union operator restricted to the
agents of the batch: blocks never mix, so the queries of different agents share columns (``k``
queries of one agent take ``k`` columns); dangling mass, key counts and the final
normalization are per (agent, column) segment.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from soulmem_torch.errors import ValidationError
from soulmem_torch.functional.codes import (
    LINK_PROC,
    NODE_ABSTRACT,
    NODE_PROCEDURE,
    NODE_SEMANTIC,
    NODE_SPECIFIC,
)
from soulmem_torch.functional.fusion import undirected_edges
from soulmem_torch.functional.ppr import build_transition, power_iteration_steps
from soulmem_torch.functional.similarity import BlendWeights, normalize_rows
from soulmem_torch.retrieve._engine import _weight_key, dynamic_weights

__all__ = ["UnionSnapshot", "build_union"]

_F64 = torch.float64
_I64 = torch.int64
# Upper bound on the floats of one gathered candidate block (chunk × M × fields × D).
CHUNK_FLOATS = 1 << 24


@dataclass(eq=False)
class UnionSnapshot:
    """Many agents' snapshots as one disjoint union (see the module docstring).

    Attributes:
        ptr: shape (A + 1,), int64. Note offsets per agent.
        eptr: shape (A + 1,), int64. Edge offsets per agent.
        sizes: shape (A,), int64. Notes per agent.
        agent: shape (N,), int64. Owner of every note.
        node_type: shape (N,), int64.
        edge_index: shape (2, E), int64. Block-diagonal, CSR order within each block.
        edge_kind / intensity / confidence / prob: shape (E,).
        tag_mask: (N,) bool, or None when no agent has embeddings.
        tag_dim: the embedding width ``D``, or None when no agent has embeddings.
        notes: the structured note side of every agent in the compact layout
            (:class:`~soulmem_torch.functional.similarity.NoteSide`: the agents' normalized
            field rows one after the other, then one zero row; ``index`` holds union rows;
            normalized tags), or None when no agent has field vectors. Built once from the
            agents' compact layouts and carried across splices.
        row_ptr: shape (A + 1,), int64. Each agent's rows of ``notes.rows``.
        graphs: the agents' own snapshots (CPU), for the per-agent fallbacks and the ids.

    ``tag_emb`` / ``field_emb`` / ``field_mask`` are compatibility views, concatenated from the
    agents' snapshots on each read (not kept: no kernel reads them).
    """

    ptr: Tensor
    eptr: Tensor
    sizes: Tensor
    agent: Tensor
    node_type: Tensor
    edge_index: Tensor
    edge_kind: Tensor
    intensity: Tensor
    confidence: Tensor
    prob: Tensor
    tag_mask: Tensor | None
    tag_dim: int | None
    notes: Any
    row_ptr: Tensor | None
    graphs: list[Any]
    cache: dict[Any, Any] = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        return self.node_type.device

    @property
    def num_nodes(self) -> int:
        return int(self.node_type.shape[0])

    @property
    def num_agents(self) -> int:
        return len(self.graphs)

    @property
    def sizes_list(self) -> list[int]:
        if "sizes_list" not in self.cache:
            self.cache["sizes_list"] = self.sizes.tolist()
        return self.cache["sizes_list"]

    @property
    def tag_emb(self) -> Tensor | None:
        """``(N, D)`` raw tag vectors of every agent (zeros for agents without): a fresh
        concatenation of the snapshots' ``tag_emb`` (compatibility view, not kept)."""
        if self.tag_dim is None:
            return None
        d = self.tag_dim
        return torch.cat(
            [g.tag_emb if g.tag_emb is not None else torch.zeros(int(g.num_nodes), d)
             for g in self.graphs] or [torch.zeros(0, d)]
        ).to(self.device)  # fmt: skip

    @property
    def field_emb(self) -> Tensor | None:
        """``(N, F, D)`` dense raw fields (compatibility view, materialized on each read)."""
        return self._dense_fields()[0]

    @property
    def field_mask(self) -> Tensor | None:
        """``(N, F)`` bool field presence (compatibility view)."""
        if self.notes is None:
            return None
        return self.notes.mask

    def _dense_fields(self) -> tuple[Tensor | None, Tensor | None]:
        if self.notes is None or self.tag_dim is None:
            return None, None
        from soulmem_torch.embedding.fields import FIELD_NAMES

        f, d = len(FIELD_NAMES), self.tag_dim
        parts = [
            g.field_emb if g.field_rows is not None else torch.zeros(int(g.num_nodes), f, d)
            for g in self.graphs
        ]
        dense = torch.cat(parts) if parts else torch.zeros(0, f, d)
        return dense.to(self.device), self.notes.mask


def _agent_note_side(g: Any, d: int, device: torch.device) -> Any:
    """One agent's normalized compact note side on ``device`` (its snapshot's cached one when
    it has it there; otherwise computed and not cached on the snapshot: the union keeps it)."""
    from soulmem_torch.embedding.fields import FIELD_NAMES
    from soulmem_torch.embedding.query_embedding import cached_note_side
    from soulmem_torch.functional.similarity import note_side_compact

    n = int(g.num_nodes)
    if g.tag_emb is not None and g.field_rows is not None:
        notes = cached_note_side(g, cache=False)
        return notes.to(device)
    tag = g.tag_emb if g.tag_emb is not None else torch.zeros(n, d)
    mask = g.tag_mask if g.tag_emb is not None else torch.zeros(n, dtype=torch.bool)
    pos = torch.full((n, len(FIELD_NAMES)), -1, dtype=torch.int32)
    return note_side_compact(tag, mask, torch.zeros(0, d), pos, device=device)


def _union_note_side(
    graphs: Sequence[Any], sizes: Tensor, d: int, device: torch.device
) -> tuple[Any, Tensor]:
    """Every agent's note side in one pass: the agents' compact layouts concatenated (rows
    shifted by each agent's row offset) and normalized once — the same row-wise values as each
    agent's own :func:`~soulmem_torch.functional.similarity.note_side_compact`. Returns
    ``(notes, row_ptr (A + 1,))``."""
    from soulmem_torch.embedding.fields import FIELD_NAMES
    from soulmem_torch.functional.similarity import note_side_compact

    f = len(FIELD_NAMES)
    counts = torch.tensor(
        [int(g.field_rows.shape[0]) if g.field_rows is not None else 0 for g in graphs],
        dtype=_I64,
    )
    row_ptr = torch.zeros(len(graphs) + 1, dtype=_I64)
    torch.cumsum(counts, 0, out=row_ptr[1:])
    rows = torch.cat([g.field_rows for g in graphs if g.field_rows is not None])
    pos = torch.cat(
        [g.field_pos.to(_I64) if g.field_pos is not None
         else torch.full((int(g.num_nodes), f), -1, dtype=_I64) for g in graphs]
    )  # fmt: skip
    shift = torch.repeat_interleave(row_ptr[:-1], sizes).unsqueeze(1)
    pos = torch.where(pos >= 0, pos + shift, -1)
    tag = torch.cat(
        [g.tag_emb if g.tag_emb is not None else torch.zeros(int(g.num_nodes), d)
         for g in graphs]
    )  # fmt: skip
    mask = torch.cat(
        [g.tag_mask if g.tag_emb is not None
         else torch.zeros(int(g.num_nodes), dtype=torch.bool) for g in graphs]
    )  # fmt: skip
    notes = note_side_compact(tag, mask, rows, pos, device=device)
    return notes, row_ptr.to(device)


def _join_note_sides(parts: list[Any], d: int, device: torch.device) -> tuple[Any, Tensor]:
    """The union's note side from per-agent (or per-run) note sides ``parts`` whose ``index``
    are local to their own ``rows`` (each with its trailing zero row): one concatenation.
    Returns ``(notes, row_ptr of the parts)``."""
    from soulmem_torch.embedding.fields import FIELD_NAMES
    from soulmem_torch.functional.similarity import NoteSide

    counts = [int(x.rows.shape[0]) - 1 for x in parts]
    starts = [0]
    for c in counts:
        starts.append(starts[-1] + c)
    p = starts[-1]
    rows = torch.zeros(p + 1, d, dtype=torch.float32, device=device)
    if p:
        torch.cat([x.rows[:-1] for x in parts], out=rows[:p])
    f = len(FIELD_NAMES)
    if parts:
        sizes = torch.tensor([int(x.index.shape[0]) for x in parts], dtype=_I64, device=device)
        shift = torch.repeat_interleave(torch.tensor(starts[:-1], dtype=_I64, device=device), sizes)
        mask = torch.cat([x.mask for x in parts])
        index = torch.where(mask, torch.cat([x.index for x in parts]) + shift.unsqueeze(1), p)
        tag = torch.cat([x.tag for x in parts])
        no_tag = torch.cat([x.no_tag for x in parts])
        has_emb = torch.cat([x.has_emb for x in parts])
    else:
        mask = torch.zeros(0, f, dtype=torch.bool, device=device)
        index = torch.zeros(0, f, dtype=_I64, device=device)
        tag = torch.zeros(0, d, device=device)
        no_tag = has_emb = torch.zeros(0, dtype=torch.bool, device=device)
    notes = NoteSide(rows, index, mask, tag, no_tag, has_emb)
    return notes, torch.tensor(starts, dtype=_I64, device=device)


def _slice_note_side(notes: Any, n0: int, n1: int, r0: int, r1: int) -> Any:
    """Notes ``n0:n1`` of a union note side whose rows are ``r0:r1``, as a note side of their
    own (index local to the slice, a zero row appended): views, except the appended row."""
    from soulmem_torch.functional.similarity import NoteSide

    rows = torch.cat([notes.rows[r0:r1], notes.rows.new_zeros(1, notes.rows.shape[1])])
    mask = notes.mask[n0:n1]
    index = torch.where(mask, notes.index[n0:n1] - r0, r1 - r0)
    return NoteSide(rows, index, mask, notes.tag[n0:n1], notes.no_tag[n0:n1],
                    notes.has_emb[n0:n1])  # fmt: skip


def _cat(parts: list[Tensor], empty: Tensor) -> Tensor:
    return torch.cat(parts) if parts else empty


def build_union(graphs: Sequence[Any], device: torch.device) -> UnionSnapshot:
    """Concatenates the agents' ``MemoryGraph`` snapshots (CPU) into one union on ``device``.

    Cost: one ``torch.cat`` per field over the agents (``O(total notes + total edges)`` memory
    traffic); no agent is re-snapshotted.
    """
    graphs = list(graphs)
    sizes = torch.tensor([int(g.num_nodes) for g in graphs], dtype=_I64)
    esizes = torch.tensor([int(g.edge_index.shape[1]) for g in graphs], dtype=_I64)
    ptr = torch.zeros(len(graphs) + 1, dtype=_I64)
    torch.cumsum(sizes, 0, out=ptr[1:])
    eptr = torch.zeros(len(graphs) + 1, dtype=_I64)
    torch.cumsum(esizes, 0, out=eptr[1:])
    agent = torch.repeat_interleave(torch.arange(len(graphs)), sizes)
    edge_offset = torch.repeat_interleave(ptr[:-1], esizes)
    edge_index = (
        torch.cat([g.edge_index for g in graphs], dim=1)
        if graphs
        else torch.zeros(2, 0, dtype=_I64)
    )
    edge_index = edge_index + edge_offset.unsqueeze(0)
    node_type = _cat([g.node_type for g in graphs], torch.zeros(0, dtype=_I64))

    def edge_attr(name: str, dtype: torch.dtype) -> Tensor:
        return _cat([getattr(g, name) for g in graphs], torch.zeros(0, dtype=dtype))

    dims = {int(g.tag_emb.shape[1]) for g in graphs if g.tag_emb is not None}
    if len(dims) > 1:
        raise ValidationError(
            f"agents: expected one embedding width across the bank, found widths {sorted(dims)}"
        )
    tag_mask = notes = row_ptr = None
    d: int | None = None
    if dims:
        (d,) = dims
        tag_mask = torch.cat(
            [g.tag_mask if g.tag_mask is not None
             else torch.zeros(int(g.num_nodes), dtype=torch.bool) for g in graphs]
        ).to(device)  # fmt: skip
        if any(g.field_rows is not None for g in graphs):
            notes, row_ptr = _union_note_side(graphs, sizes, d, device)
    agent = agent.to(device)

    return UnionSnapshot(
        ptr=ptr.to(device),
        eptr=eptr.to(device),
        sizes=sizes.to(device),
        agent=agent,
        node_type=node_type.to(device),
        edge_index=edge_index.to(device),
        edge_kind=edge_attr("edge_kind", _I64).to(device),
        intensity=edge_attr("intensity", _F64).to(device),
        confidence=edge_attr("confidence", torch.float32).to(device),
        prob=edge_attr("prob", _F64).to(device),
        tag_mask=tag_mask,
        tag_dim=d,
        notes=notes,
        row_ptr=row_ptr,
        graphs=graphs,
    )


_NODE_FIELDS = ("node_type", "tag_mask")
_EDGE_FIELDS = ("edge_kind", "intensity", "confidence", "prob")


def splice_union(
    old: UnionSnapshot, graphs: Sequence[Any], changed: Sequence[int]
) -> UnionSnapshot | None:
    """The union after some agents changed (``changed``) or were appended, from ``old``: the
    unchanged agents' notes and links are slices of ``old`` (their link ends shifted by the
    change of offset), the changed ones come from their new snapshots. ``O(total)`` copying in a
    few slices, no per-agent work for the others. ``None`` when a full build is needed (more
    than a quarter of the agents changed, or a changed agent's embedding layout differs)."""
    graphs = list(graphs)
    a = len(graphs)
    fresh = sorted(set(changed) | set(range(old.num_agents, a)))
    if not fresh or len(fresh) * 4 > a or any(p >= a for p in fresh):
        return None
    for p in fresh:
        g = graphs[p]
        if (g.tag_emb is None) != (old.tag_dim is None):
            return None
        if g.tag_emb is not None and int(g.tag_emb.shape[-1]) != old.tag_dim:
            return None
        if (g.field_rows is None) != (old.notes is None):
            return None
    device = old.device
    sizes_l = [int(g.num_nodes) for g in graphs]
    esizes_l = [int(g.edge_index.shape[1]) for g in graphs]
    sizes = torch.tensor(sizes_l, dtype=_I64)
    esizes = torch.tensor(esizes_l, dtype=_I64)
    ptr = torch.zeros(a + 1, dtype=_I64)
    torch.cumsum(sizes, 0, out=ptr[1:])
    eptr = torch.zeros(a + 1, dtype=_I64)
    torch.cumsum(esizes, 0, out=eptr[1:])
    ptr_l, old_ptr, old_eptr = ptr.tolist(), old.ptr.tolist(), old.eptr.tolist()
    parts: dict[str, list[Tensor]] = {k: [] for k in (*_NODE_FIELDS, *_EDGE_FIELDS, "edge_index")}
    note_parts: list[Any] = []
    old_rptr = old.row_ptr.tolist() if old.notes is not None else None
    p = 0
    fresh_set = set(fresh)
    while p < a:
        if p in fresh_set:
            g = graphs[p]
            for name in (*_NODE_FIELDS, *_EDGE_FIELDS):
                value = getattr(g, name)
                if value is not None:
                    parts[name].append(value.to(device))
            if old.tag_dim is not None and g.tag_mask is None:
                parts["tag_mask"].append(
                    torch.zeros(int(g.num_nodes), dtype=torch.bool, device=device)
                )
            if old.notes is not None:
                note_parts.append(_agent_note_side(g, old.tag_dim, device))
            parts["edge_index"].append(g.edge_index.to(device) + ptr_l[p])
            p += 1
            continue
        q = p
        while q < a and q not in fresh_set:
            q += 1
        n0, n1, e0, e1 = old_ptr[p], old_ptr[q], old_eptr[p], old_eptr[q]
        for name in _NODE_FIELDS:
            value = getattr(old, name)
            if value is not None:
                parts[name].append(value[n0:n1])
        for name in _EDGE_FIELDS:
            parts[name].append(getattr(old, name)[e0:e1])
        if old_rptr is not None:  # the run's normalized rows, carried (not recomputed)
            note_parts.append(_slice_note_side(old.notes, n0, n1, old_rptr[p], old_rptr[q]))
        parts["edge_index"].append(old.edge_index[:, e0:e1] + (ptr_l[p] - old_ptr[p]))
        p = q

    def cat(name: str, empty: Tensor) -> Tensor | None:
        if getattr(old, name, empty) is None:
            return None
        return torch.cat(parts[name]) if parts[name] else empty.to(device)

    agent = torch.repeat_interleave(torch.arange(a, device=device), sizes.to(device))
    notes = row_ptr = None
    if old.notes is not None:
        notes, run_ptr = _join_note_sides(note_parts, old.tag_dim, device)
        # agent row offsets: the first row of each agent's extent, in agent order
        counts = torch.tensor(
            [int(g.field_rows.shape[0]) if g.field_rows is not None else 0 for g in graphs],
            dtype=_I64,
        )
        row_ptr = torch.zeros(a + 1, dtype=_I64)
        torch.cumsum(counts, 0, out=row_ptr[1:])
        row_ptr = row_ptr.to(device)
        if int(row_ptr[-1]) != int(run_ptr[-1]):  # pragma: no cover - a layout mismatch
            return None

    return UnionSnapshot(
        ptr=ptr.to(device),
        eptr=eptr.to(device),
        sizes=sizes.to(device),
        agent=agent,
        node_type=cat("node_type", torch.zeros(0, dtype=_I64)),
        edge_index=torch.cat(parts["edge_index"], dim=1),
        edge_kind=cat("edge_kind", torch.zeros(0, dtype=_I64)),
        intensity=cat("intensity", torch.zeros(0, dtype=_F64)),
        confidence=cat("confidence", torch.zeros(0)),
        prob=cat("prob", torch.zeros(0, dtype=_F64)),
        tag_mask=cat("tag_mask", torch.zeros(0, dtype=torch.bool)),
        tag_dim=old.tag_dim,
        notes=notes,
        row_ptr=row_ptr,
        graphs=graphs,
    )


# ------------------------------------------------------------------------------------------
# candidates
# ------------------------------------------------------------------------------------------


def candidates(union: UnionSnapshot, agents: Tensor) -> tuple[Tensor, Tensor, int]:
    """Padded candidate rows: ``idx (B, M)`` union node indices, ``valid (B, M)``, ``M``."""
    sizes = union.sizes.index_select(0, agents)
    m = int(sizes.max()) if agents.numel() else 0
    ar = torch.arange(m, device=agents.device)
    valid = ar.unsqueeze(0) < sizes.unsqueeze(1)
    start = union.ptr.index_select(0, agents).unsqueeze(1)
    idx = torch.where(valid, start + ar.unsqueeze(0), start.clamp_max(max(union.num_nodes - 1, 0)))
    return idx, valid, m


def _chunks(b: int, per_row: int) -> list[slice]:
    step = max(1, CHUNK_FLOATS // max(per_row, 1))
    return [slice(i, min(i + step, b)) for i in range(0, b, step)]


def _safe_norm(x: Tensor) -> Tensor:
    """Row norms of ``x`` (float32), 1 where a row is all zeros (as ``normalize_rows``)."""
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return torch.where(norm > 0, norm, torch.ones_like(norm))


def plain_similarity(union: UnionSnapshot, q: Tensor, idx: Tensor, valid: Tensor) -> Tensor:
    """Plain-mode cosine of each query against its agent's notes: (B, M) float32.

    ``cosine_scores(q, x) * tag_mask`` of the retrieve layer, segment-wise.
    """
    if union.tag_dim is None:
        raise ValidationError("working_memory: plain queries need notes with embeddings")
    # the normalized note vectors, followed by zero rows (as many as the largest agent has
    # notes) so that every query's window of candidate rows stays inside the tensor
    padded = union.cache.get("tag_normalized_padded")
    if padded is None:
        tag_emb = union.tag_emb.to(torch.float32)  # materialized once, then dropped
        n, d = tag_emb.shape
        pad = int(union.sizes.max()) if union.num_agents else 0
        padded = torch.zeros(n + pad, d, dtype=torch.float32, device=tag_emb.device)
        torch.div(tag_emb, _safe_norm(tag_emb), out=padded[:n])
        del tag_emb
        union.cache["tag_normalized_padded"] = padded
    xn = padded[: union.num_nodes]
    if q.shape[1] != xn.shape[1]:
        raise ValidationError(
            f"query: expected vectors of width {xn.shape[1]}, found width {q.shape[1]}"
        )
    qn = normalize_rows(q)
    b, m = idx.shape
    d = int(xn.shape[1])
    flat = idx.reshape(-1)
    chunks = _chunks(b, m * d)
    # each query's candidates are ``m`` consecutive rows from its agent's first note: one
    # window copy per query (rows past the agent's notes are masked below; the padded copy
    # keeps the last window inside the tensor), then one ``bmm`` per chunk
    windows = padded.as_strided((padded.shape[0] - m + 1, m, d), (d, d, 1))
    first = idx[:, 0] if m else idx.new_zeros(b)
    if len(chunks) == 1:
        cand = windows.index_select(0, first)
        out = torch.bmm(cand, qn.unsqueeze(-1)).squeeze(-1)
    else:
        out = torch.zeros(b, m, dtype=torch.float32, device=q.device)
        for sl in chunks:
            cand = windows.index_select(0, first[sl])
            out[sl] = torch.bmm(cand, qn[sl].unsqueeze(-1)).squeeze(-1)
    every = union.cache.get("tag_mask_all")
    if every is None:
        every = union.cache["tag_mask_all"] = bool(union.tag_mask.all())
    mask = valid if every else union.tag_mask.index_select(0, flat).view(b, m) & valid
    return out * mask.to(out.dtype)


def note_ids(union: UnionSnapshot, positions: Sequence[int]) -> list[Any]:
    """Every note's id by union node index (agent ``p``'s ``graphs[p].ids`` at
    ``ptr[p]:ptr[p + 1]``), filled per agent on first use (a tensor-built agent's ids are made
    lazily by its snapshot: agents never asked about are left alone). Cached on the union, which
    is rebuilt on every change; entries of agents not yet filled are ``None``."""
    cached = union.cache.get("note_ids")
    if cached is None:
        cached = union.cache["note_ids"] = ([None] * union.num_nodes, set(), union.ptr.tolist())
    flat, filled, ptr = cached
    missing = set(positions) - filled
    for p in sorted(missing):
        ids = union.graphs[p].ids
        start, end = ptr[p], ptr[p + 1]
        if len(ids) != end - start:
            raise ValidationError(
                f"agents: snapshot {p} has {end - start} notes but {len(ids)} ids"
            )
        flat[start:end] = ids
        filled.add(p)
    return flat


def _candidate_cos(notes: Any, qn: Tensor, fidx: Tensor) -> Any:
    """``cos(query field, note field) -> (s, U, M)`` for ``s`` queries against their candidate
    rows: the candidates' rows of that note field (``fidx``: (s, M, F) union rows, the zero row
    where absent) gathered as ``(s, M, D)`` — one field at a time, only the fields the rules
    read — and matched by one ``bmm`` with the queries' normalized unit field (the shapes the
    dense layout had, so the same bits)."""
    from soulmem_torch.embedding.fields import FIELD_INDEX, QUERY_FIELD_INDEX

    s, u = int(qn.shape[0]), int(qn.shape[1])
    m = int(fidx.shape[1])
    q_present = (qn != 0).any(dim=-1).any(dim=1).any(dim=0).tolist()  # (Q,): one host sync

    def cos(q_name: str, f_name: str) -> Tensor:
        qi, j = QUERY_FIELD_INDEX[q_name], FIELD_INDEX[f_name]
        if not q_present[qi]:
            return qn.new_zeros(s, u, m)
        rows = notes.rows.index_select(0, fidx[:, :, j].reshape(-1)).view(s, m, -1)
        return torch.bmm(qn[:, :, qi], rows.transpose(1, 2))

    return cos


def _has_field(mask: Tensor, name: str) -> Tensor:
    """``(s, 1, M)``: which candidates have note field ``name`` (``mask``: (s, M, F))."""
    from soulmem_torch.embedding.fields import FIELD_INDEX

    return mask[:, :, FIELD_INDEX[name]].unsqueeze(1)


def structured_similarity(
    union: UnionSnapshot,
    batch: Any,
    idx: Tensor,
    valid: Tensor,
    *,
    string: Tensor | None,
    weights: BlendWeights | None,
) -> Tensor:
    """``fused_similarity`` of B embedded queries against their agents' notes: (B, M) float32.

    The rules of :func:`soulmem_torch.functional.similarity.embedding_scores` evaluated on
    padded candidate rows of the compact note side (``union.notes``), never on a ``B × N``
    matrix: for each note field the rules read, the candidates' rows of that field are
    gathered (``(c, M, D)``, never a dense ``(M, F, D)`` block) and matched by one ``bmm``.
    """
    from soulmem_torch.embedding.fields import QUERY_SEMANTIC, QUERY_SITUATION
    from soulmem_torch.functional import similarity as fsim

    w = weights if weights is not None else BlendWeights()
    device = idx.device
    b, m = idx.shape
    out = torch.zeros(b, m, dtype=torch.float32, device=device)
    notes = union.notes
    if b == 0 or m == 0 or notes is None:
        return out  # the retrieve layer scores notes without embeddings as 0
    q = batch.to(device)
    um = q.unit_mask
    qm = q.field_mask & um.unsqueeze(-1)
    qn = normalize_rows(q.field).masked_fill_(~qm.unsqueeze(-1), 0.0)
    kind = q.kind.to(device)
    qtag = normalize_rows(q.tag)
    q_zero = ~(q.tag != 0).any(dim=-1)
    d = int(notes.rows.shape[1])
    # gathered per query at a time: its candidates' tags and one field's rows (a few fields)
    for sl in _chunks(b, 4 * m * d):
        ix = idx[sl]
        ntype = union.node_type[ix]
        fidx = notes.index[ix]  # (c, M, F) union rows
        fm = notes.mask[ix]
        c = ix.shape[0]
        variant = torch.zeros(c, m, dtype=torch.float32, device=device)
        k = kind[sl]
        sem = (k == QUERY_SEMANTIC).nonzero().squeeze(1)
        sit = (k == QUERY_SITUATION).nonzero().squeeze(1)
        if sem.numel():
            cos = _candidate_cos(notes, qn[sl][sem], fidx[sem])
            v = fsim._semantic_variant(cos, qm[sl][sem], um[sl][sem], w)
            variant[sem] = torch.where(ntype[sem] == NODE_SEMANTIC, v, 0.0)
        if sit.numel():
            cos = _candidate_cos(notes, qn[sl][sit], fidx[sit])
            fm_sit, nt_sit = fm[sit], ntype[sit]
            v = fsim._situation_variant(
                cos, functools.partial(_has_field, fm_sit), nt_sit.unsqueeze(1),
                qm[sl][sit], um[sl][sit], w,
            )  # fmt: skip
            is_sit = (nt_sit == NODE_SPECIFIC) | (nt_sit == NODE_ABSTRACT)
            variant[sit] = torch.where(is_sit, v, 0.0)
        tag_cos = torch.bmm(notes.tag[ix], qtag[sl].unsqueeze(-1)).squeeze(-1)
        no_tag = q_zero[sl].unsqueeze(1) | notes.no_tag[ix]
        score = torch.where(no_tag, variant, w.tag * tag_cos + w.variant * variant)
        has_emb = notes.has_emb[ix]
        score = torch.where(has_emb, score, 0.0)
        if string is not None:
            fused = fsim.fuse_string_scores(score, string[sl], alpha=w.string_blend_alpha)
            score = torch.where(has_emb, fused, 0.0)
        out[sl] = score
    return torch.where(valid, out, 0.0)


# Cost model of the two structured paths (seconds): gathering candidate rows per query moves
# ~B·M·D floats of tags plus the distinct field rows; scoring per agent group costs a fixed
# overhead per distinct agent.
_GATHER_SECONDS_PER_FLOAT = 0.5e-9
_GROUP_SECONDS = 5e-4


def grouped_is_cheaper(union: UnionSnapshot, num_queries: int, num_agents: int, m: int) -> bool:
    """Whether scoring per agent group beats the gathered candidate rows for this batch."""
    if union.notes is None:
        return False
    d = int(union.notes.rows.shape[1])
    return num_agents * _GROUP_SECONDS < num_queries * m * 2 * d * _GATHER_SECONDS_PER_FLOAT


def _agent_notes(union: UnionSnapshot, lo: int, hi: int) -> Any:
    """Notes ``lo:hi`` (one agent) of the union note side, as a note side of their own: views
    of the union's tensors (``index`` still points at union rows), no copy."""
    from soulmem_torch.functional.similarity import NoteSide

    notes = union.notes
    return NoteSide(
        notes.rows, notes.index[lo:hi], notes.mask[lo:hi], notes.tag[lo:hi],
        notes.no_tag[lo:hi], notes.has_emb[lo:hi],
    )  # fmt: skip


def grouped_structured_similarity(
    union: UnionSnapshot,
    batch: Any,
    positions: Sequence[int],
    m: int,
    *,
    string: Tensor | None,
    weights: BlendWeights | None,
) -> Tensor:
    """``fused_similarity`` per agent of the batch: one batched call per distinct agent on its
    slice of the union's note side (its queries × its notes), written into ``(B, M)`` rows.
    Used when a batch holds many queries per agent, where gathering an agent's rows once per
    query would cost more than the per-agent calls."""
    from soulmem_torch.functional.similarity import fused_similarity_compact

    device = union.device
    out = torch.zeros(len(positions), m, dtype=torch.float32, device=device)
    if union.notes is None or not positions:
        return out
    q = batch.to(device)
    groups: dict[int, list[int]] = {}
    for b, p in enumerate(positions):
        groups.setdefault(p, []).append(b)
    ptr = union.ptr.tolist()
    for p, rows in groups.items():
        lo, hi = ptr[p], ptr[p + 1]
        if hi == lo:
            continue
        r = torch.tensor(rows, device=device)
        sub = q.select(r)
        out[r, : hi - lo] = fused_similarity_compact(
            sub.tag, sub.kind, sub.field, sub.field_mask, sub.unit_mask,
            _agent_notes(union, lo, hi), union.node_type[lo:hi],
            string_scores=None if string is None else string[r, : hi - lo],
            weights=weights,
        )  # fmt: skip
    return out


# ------------------------------------------------------------------------------------------
# association: PPR on the union operator
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class UnionOperator:
    """What the union's PPR reads of a transition operator: ``transpose`` (N, N) CSR ``P^T``
    (block-diagonal) and ``out_degree`` (N,) (a node without out-edges is dangling)."""

    transpose: Tensor
    out_degree: Tensor


def carry_operators(new: UnionSnapshot, old: UnionSnapshot | None, changed: Sequence[int]) -> None:
    """Lets ``new`` splice its operators from ``old``'s: the agents not in ``changed`` (and
    already in ``old``) keep their rows, only shifted; ``old`` itself is not kept alive."""
    if old is None:
        return
    from soulmem_torch.bank._dense import carry_dense

    carry_dense(new, old, list(changed))
    ops = {
        k: v
        for k, v in old.cache.items()
        if isinstance(k, tuple) and k[0] in ("transition", "transition_undirected")
    }
    if ops:
        new.cache["previous"] = (ops, old.ptr, old.num_agents, sorted(set(changed)))


def _splice(union: UnionSnapshot, key: tuple[Any, ...], config: Any) -> UnionOperator | None:
    """The union's operator from the previous union's (unchanged agents' rows, shifted) and
    each changed or new agent's own operator (``retrieve._engine.transition``, cached on its
    snapshot): ``O(total entries)`` copying, no sort, nothing recomputed for the others."""
    previous = union.cache.get("previous")
    if previous is None or key not in previous[0]:
        return None
    if key[0] == "transition_undirected":
        from soulmem_torch.retrieve.pipeline import undirected_transition as transition
    else:
        from soulmem_torch.retrieve._engine import transition

    ops, old_ptr, old_agents, changed = previous
    old = ops[key]
    device = union.device
    crow = old.transpose.crow_indices().to(_I64)
    col = old.transpose.col_indices().to(_I64)
    vals = old.transpose.values()
    old_ptr = old_ptr.tolist()
    ptr = union.ptr.tolist()
    fresh = set(changed) | set(range(old_agents, union.num_agents))
    row_len, cols, values, degree = [], [], [], []
    p = 0
    while p < union.num_agents:
        if p in fresh:
            own = transition(union.graphs[p], config)
            t = own.transpose
            c = t.crow_indices().to(_I64)
            row_len.append((c[1:] - c[:-1]).to(device))
            cols.append(t.col_indices().to(device=device, dtype=_I64) + ptr[p])
            values.append(t.values().to(device))
            degree.append(own.out_degree.to(device))
            p += 1
            continue
        q = p  # a run of unchanged agents: one slice of the old operator, shifted
        while q < union.num_agents and q not in fresh:
            q += 1
        n0, n1 = old_ptr[p], old_ptr[q]
        e0, e1 = int(crow[n0]), int(crow[n1])
        row_len.append(crow[n0 + 1 : n1 + 1] - crow[n0:n1])
        cols.append(col[e0:e1] + (ptr[p] - old_ptr[p]))
        values.append(vals[e0:e1])
        degree.append(old.out_degree[n0:n1])
        p = q
    n = union.num_nodes
    new_crow = torch.zeros(n + 1, dtype=_I64, device=device)
    if row_len:
        torch.cumsum(torch.cat(row_len), 0, out=new_crow[1:])
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Ss]parse CSR tensor support is in beta.*")
        transpose = torch.sparse_csr_tensor(
            new_crow,
            torch.cat(cols) if cols else torch.zeros(0, dtype=_I64, device=device),
            torch.cat(values) if values else torch.zeros(0, dtype=_F64, device=device),
            (n, n),
            check_invariants=False,
        )
    out_degree = torch.cat(degree) if degree else torch.zeros(0, dtype=_I64, device=device)
    return UnionOperator(transpose, out_degree)


def union_transition(union: UnionSnapshot, config: Any, *, undirected: bool = False) -> Any:
    """The union's row-normalized transition (block-diagonal), cached per preference/factors:
    spliced from the previous union's when only some agents changed (see :func:`_splice`),
    else built in one vectorized pass over every link. ``undirected``: every link walkable both
    ways (:func:`~soulmem_torch.functional.fusion.undirected_edges`, the fused default's
    ``graph_undirected`` channel), spliced the same way (each changed agent's own
    ``retrieve.pipeline.undirected_transition``)."""
    name = "transition_undirected" if undirected else "transition"
    key = (name, *_weight_key(config))
    op = union.cache.get(key)
    if op is None:
        op = _splice(union, key, config)
    if op is None:
        w = dynamic_weights(union, config)
        edge_index = union.edge_index
        if undirected:
            edge_index, w = undirected_edges(edge_index, w)
        full = build_transition(edge_index, w, num_nodes=union.num_nodes)
        op = UnionOperator(full.transpose, full.out_degree)
    union.cache[key] = op
    return op


def _sub_operators(
    union: UnionSnapshot, ops: Sequence[Any], involved: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``P^T`` of every operator in ``ops`` restricted to the involved agents' blocks, stacked
    block-diagonally (operator ``c`` on rows and columns ``c·S … (c+1)·S - 1``).

    Each agent's rows and entries are contiguous in the union's CSR, so the restriction is a
    few per-agent range gathers (no per-entry search). Returns ``(transpose (C·S, C·S) CSR,
    dangling (stacked indices), offsets (len(involved),), node_segment (S,))``: the blocks are
    laid out one after the other in ``involved`` order, the same layout for every operator.
    """
    device = involved.device
    sizes = union.sizes.index_select(0, involved)
    starts = union.ptr.index_select(0, involved)
    offsets = torch.zeros_like(sizes)
    if sizes.numel() > 1:
        torch.cumsum(sizes[:-1], 0, out=offsets[1:])
    s = int(sizes.sum())
    node_seg = torch.repeat_interleave(torch.arange(sizes.numel(), device=device), sizes)
    nodes = torch.arange(s, device=device) + torch.repeat_interleave(starts - offsets, sizes)
    crows, cols, vals, dangling = [], [], [], []
    total = 0
    for c, op in enumerate(ops):
        t = op.transpose
        crow, col = t.crow_indices(), t.col_indices()
        estart = crow.index_select(0, starts).to(_I64)
        elen = crow.index_select(0, starts + sizes).to(_I64) - estart
        eoff = torch.zeros_like(elen)
        if elen.numel() > 1:
            torch.cumsum(elen[:-1], 0, out=eoff[1:])
        n_entries = int(elen.sum())
        # entry j of the sub-operator is union entry j + (estart - eoff) of its agent
        entries = torch.arange(n_entries, device=device) + torch.repeat_interleave(
            estart - eoff, elen
        )
        shift = torch.repeat_interleave(offsets - starts + c * s, elen)
        cols.append(col.index_select(0, entries).to(_I64) + shift)
        vals.append(t.values().index_select(0, entries))
        row_start = crow.index_select(0, nodes).to(_I64) - torch.repeat_interleave(
            estart - eoff - total, sizes
        )
        crows.append(row_start)
        total += n_entries
        dangling.append((op.out_degree.index_select(0, nodes) == 0).nonzero().reshape(-1) + c * s)
    sub_crow = torch.cat([*crows, torch.tensor([total], dtype=_I64, device=device)])
    size = len(ops) * s
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Ss]parse CSR tensor support is in beta.*")
        small = total < 2**31 - 1 and size < 2**31 - 1  # int32 indices: less traffic
        sub_col = torch.cat(cols)
        transpose = torch.sparse_csr_tensor(
            sub_crow.to(torch.int32) if small else sub_crow,
            sub_col.to(torch.int32) if small else sub_col,
            torch.cat(vals),
            (size, size),
            check_invariants=False,
        )
    return transpose, torch.cat(dangling), offsets, node_seg


USE_SCIPY = True
"""Run the CPU power iteration's matrix-vector products with scipy when it is installed
(the same per-row sums in CSR order; ~20% faster than ``torch.mv`` at one thread). ``False``:
always ``torch.mv`` (the tests compare the two)."""


def _host_csr(t: Tensor) -> Any:
    """``t`` (a CPU CSR tensor) as a scipy ``csr_matrix`` sharing its memory, or ``None`` (not
    on the CPU, scipy missing, or :data:`USE_SCIPY` off)."""
    if not USE_SCIPY or t.device.type != "cpu":
        return None
    try:
        from scipy.sparse import csr_matrix
    except ImportError:
        return None
    return csr_matrix(
        (t.values().numpy(), t.col_indices().numpy(), t.crow_indices().numpy()),
        shape=tuple(t.shape),
        copy=False,
    )


def segment_power_ppr(
    union: UnionSnapshot,
    config: Any,
    agents: Tensor,
    weights: Tensor,
    keys: Tensor,
    ok: Tensor,
    *,
    undirected: bool = False,
) -> Tensor:
    """Power-iteration PPR of every query on its agent's block: ``(B, M)`` float64
    (``undirected``: on :func:`union_transition`'s both-ways operator).

    Same iterate, step count, dangling rule and normalization as
    :func:`soulmem_torch.functional.ppr.ppr_power_iteration` on the agent's own graph; rows
    with ``ok`` False stay zero.

    Args:
        agents: shape (B,), int64. Agent of each query.
        weights: shape (B, M), float64. Personalization over the candidate rows.
        keys: shape (B, M), bool. Keys (entries of the personalization, even at weight 0).
        ok: shape (B,), bool. Queries that run.
    """
    (out,) = segment_power_ppr_channels(
        union, config, agents, weights, keys, [ok], undirected=[undirected]
    )
    return out


def segment_power_ppr_channels(
    union: UnionSnapshot,
    config: Any,
    agents: Tensor,
    weights: Tensor,
    keys: Tensor,
    oks: Sequence[Tensor],
    *,
    undirected: Sequence[bool],
) -> list[Tensor]:
    """:func:`segment_power_ppr` on several operators (``undirected[c]`` picks channel ``c``'s)
    with the same personalization, as ONE iteration: the channels' restricted operators are
    stacked block-diagonally, so each step is one sparse product and one dangling pass for
    all of them. Channel ``c`` answers the rows ``oks[c]`` (the others stay zero); every
    (channel, agent, column) is its own segment, so the results equal separate runs."""
    if len(oks) != len(undirected) or not oks:
        found = f"{len(oks)} / {len(undirected)}"
        raise ValidationError(f"oks / undirected: expected one flag per channel, found {found}")
    b, m = weights.shape
    device = weights.device
    outs = [torch.zeros(b, m, dtype=_F64, device=device) for _ in oks]
    any_ok = oks[0].clone()
    for o in oks[1:]:
        any_ok |= o
    rows = any_ok.nonzero().reshape(-1)
    if rows.numel() == 0 or m == 0:
        return outs
    nch = len(oks)
    d = float(config.damping_factor)
    steps = power_iteration_steps(d, config.power_tol)
    dtype = torch.float32 if config.power_dtype == "float32" else _F64
    a = agents.index_select(0, rows)
    # columns: the rank of each query among the batch's queries of the same agent
    order = torch.argsort(a, stable=True)
    sorted_a = a[order]
    involved, inverse, counts = torch.unique_consecutive(
        sorted_a, return_inverse=True, return_counts=True
    )
    first = torch.zeros_like(counts)
    if counts.numel() > 1:
        torch.cumsum(counts[:-1], 0, out=first[1:])
    rank_sorted = torch.arange(sorted_a.numel(), device=device) - first[inverse]
    col = torch.empty_like(rank_sorted)
    col[order] = rank_sorted
    seg = torch.empty_like(inverse)
    seg[order] = inverse  # position of each query's agent in ``involved``
    ncols = int(counts.max())
    ops = [union_transition(union, config, undirected=u) for u in undirected]
    transpose, dangling, offsets, node_seg = _sub_operators(union, ops, involved)
    s = int(node_seg.numel())
    na = int(involved.numel())
    # personalization (S, C): entry (offset[seg] + i, col) = weights[row, i]
    w = weights.index_select(0, rows)
    k = keys.index_select(0, rows)
    total = torch.zeros(rows.numel(), dtype=_F64, device=device).index_add_(
        0, torch.arange(rows.numel(), device=device).repeat_interleave(m), w.reshape(-1)
    )  # row sums in note order (as the kernel's column sums)
    safe = torch.where(total > 0, total, 1.0)
    restart_rows = (w / safe.unsqueeze(1)).mul_(1.0 - d)
    kr, ki = k.nonzero(as_tuple=True)
    node = offsets[seg[kr]] + ki
    restart = torch.zeros(s, ncols, dtype=_F64, device=device)
    restart[node, col[kr]] = restart_rows[kr, ki]
    key_segcol = seg[kr] * ncols + col[kr]  # (agent, column) segment of each key
    n_src = torch.bincount(key_segcol, minlength=na * ncols).to(_F64)
    x = restart.to(dtype).repeat(nch, 1) if nch > 1 else restart.to(dtype)
    restart_t = x
    if steps > 0 and d > 0.0:
        t = transpose if transpose.dtype == dtype else transpose.to(dtype)
        has_dangling = dangling.numel() > 0
        if has_dangling:
            # channel c's keys and segments: shifted by c·S nodes / c·len(involved) agents
            key_flat = torch.cat([(node + c * s) * ncols + col[kr] for c in range(nch)])
            key_all = torch.cat([key_segcol + c * na * ncols for c in range(nch)])
            key_share = (d / n_src[key_segcol]).to(dtype).repeat(nch)
            dseg = (dangling // s) * na + node_seg.index_select(0, dangling % s)
            # only the keys of (channel, agent) blocks with a dangling note get a share (the
            # others would add an exact 0): the undirected channel has almost none
            gets = torch.bincount(dseg, minlength=nch * na).index_select(0, key_all // ncols) > 0
            key_flat, key_all, key_share = key_flat[gets], key_all[gets], key_share[gets]
            lost = torch.zeros(nch * na, ncols, dtype=dtype, device=device)
        buffers = [torch.empty_like(x), torch.empty_like(x)]
        host = _host_csr(t) if ncols == 1 else None
        for step in range(steps):
            nxt = buffers[step % 2]
            if host is not None:  # scipy's CSR product: ~20% faster than torch.mv on CPU
                y = torch.from_numpy(host @ x.view(-1).numpy())
                torch.add(restart_t, y.unsqueeze(1), alpha=d, out=nxt)
            elif ncols == 1:  # a sparse matrix-vector product is ~20% faster than addmm on CPU
                torch.add(restart_t, torch.mv(t, x.view(-1)).unsqueeze(1), alpha=d, out=nxt)
            else:
                torch.addmm(restart_t, t, x, alpha=d, out=nxt)
            if has_dangling:
                lost.zero_().index_add_(0, dseg, x.index_select(0, dangling))
                share = lost.view(-1).index_select(0, key_all).mul_(key_share)
                nxt.view(-1).index_add_(0, key_flat, share)
            x = nxt
    x = x.to(_F64)
    # per (channel, agent, column) normalization, rows added in note order
    seg_all = torch.cat([node_seg + c * na for c in range(nch)]) if nch > 1 else node_seg
    sums = torch.zeros(nch * na, ncols, dtype=_F64, device=device).index_add_(0, seg_all, x)
    # gather each query's block back into its candidate row
    sizes = union.sizes.index_select(0, a)
    ar = torch.arange(m, device=device)
    valid = ar.unsqueeze(0) < sizes.unsqueeze(1)
    src = offsets[seg].unsqueeze(1) + ar.unsqueeze(0)
    src = torch.where(valid, src, 0)
    colx = col.unsqueeze(1).expand_as(src)
    for c, (out, ok) in enumerate(zip(outs, oks)):
        vals = x[src + c * s, colx]
        tot = sums[seg + c * na, col].unsqueeze(1)
        vals = torch.where(tot != 0, vals / torch.where(tot != 0, tot, 1.0), vals)
        out[rows] = torch.where(valid & ok.index_select(0, rows).unsqueeze(1), vals, 0.0)
    return outs


# ------------------------------------------------------------------------------------------
# BayesAction on candidate rows
# ------------------------------------------------------------------------------------------


def _proc_edges(union: UnionSnapshot) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Proc links into Procedure notes: ``(src, dst, prob, pptr)`` in agent order."""
    cached = union.cache.get("proc_edges")
    if cached is None:
        ei = union.edge_index
        sel = (union.edge_kind == LINK_PROC) & (union.node_type[ei[1]] == NODE_PROCEDURE)
        src, dst, prob = ei[0][sel], ei[1][sel], union.prob[sel]
        counts = torch.bincount(union.agent[src], minlength=union.num_agents)
        pptr = torch.zeros(union.num_agents + 1, dtype=_I64, device=src.device)
        torch.cumsum(counts, 0, out=pptr[1:])
        cached = union.cache["proc_edges"] = (src, dst, prob, pptr)
    return cached


def candidate_bayes(
    union: UnionSnapshot, agents: Tensor, weight: Tensor, keys: Tensor
) -> tuple[Tensor, Tensor]:
    """``score[a] += prob · weight[s]`` over each agent's Proc links, on candidate rows.

    Returns ``(scores (B, M) float64, candidates (B, M) bool)`` as
    ``bayes_action_scores`` / ``bayes_action_candidates`` on the agent's own graph.
    """
    b, m = weight.shape
    src, dst, prob, pptr = _proc_edges(union)
    scores = torch.zeros(b, m, dtype=_F64, device=weight.device)
    cand = torch.zeros(b, m, dtype=torch.bool, device=weight.device)
    if b == 0 or src.numel() == 0:
        return scores, cand
    start = pptr.index_select(0, agents)
    count = pptr.index_select(0, agents + 1) - start
    p = int(count.max())
    if p == 0:
        return scores, cand
    ar = torch.arange(p, device=weight.device)
    pvalid = ar.unsqueeze(0) < count.unsqueeze(1)
    e = torch.where(pvalid, start.unsqueeze(1) + ar.unsqueeze(0), 0)
    base = union.ptr.index_select(0, agents).unsqueeze(1)
    s_loc = torch.where(pvalid, src[e] - base, 0)
    d_loc = torch.where(pvalid, dst[e] - base, 0)
    pr = torch.where(pvalid, prob[e], 0.0)
    scores.scatter_add_(1, d_loc, pr * weight.gather(1, s_loc))
    hits = torch.zeros(b, m, dtype=_I64, device=weight.device)
    hits.scatter_add_(1, d_loc, (keys.gather(1, s_loc) & pvalid).to(_I64))
    return scores, hits > 0


_NODE_CACHE_KEYS = (
    "sizes_list", "tag_normalized_padded", "tag_mask_all", "note_ids", "consolidate.rowptr",
)  # fmt: skip


def with_edge_values(
    old: UnionSnapshot,
    graphs: Sequence[Any],
    changed: Sequence[int],
    edges: Tensor,
    intensity: Tensor,
    confidence: Tensor,
    prob: Tensor,
) -> UnionSnapshot:
    """The union after a plasticity update changed the values of some edges (``edges``, union
    indices) of the agents ``changed``, whose new snapshots are in ``graphs``: the same nodes
    and edges, new ``intensity`` / ``confidence`` / ``prob`` values. Node-level caches are kept,
    the operators of the unchanged agents are carried (:func:`carry_operators`), the changed
    agents' are rebuilt from their snapshots when next needed."""
    from dataclasses import replace

    device = old.device
    inten, conf, pr = old.intensity.clone(), old.confidence.clone(), old.prob.clone()
    e = edges.to(device)
    inten[e] = intensity.to(device)
    conf[e] = confidence.to(device)
    pr[e] = prob.to(device)
    new = replace(old, intensity=inten, confidence=conf, prob=pr, graphs=list(graphs), cache={})
    for key in _NODE_CACHE_KEYS:
        if key in old.cache:
            new.cache[key] = old.cache[key]
    carry_operators(new, old, changed)
    return new
