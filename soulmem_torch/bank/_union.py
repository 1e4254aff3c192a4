"""The disjoint union of many agents' snapshots, and the candidate rows' similarity over it.

A :class:`UnionSnapshot` is PyG ``Batch``-style: ``ptr`` (A + 1,) delimits each agent's notes,
``agent`` (N,) names the owner of every note, ``edge_index`` is block-diagonal (each agent's
edges shifted by its offset), and the node / edge tensors of the agents' ``MemoryGraph``
snapshots are concatenated. Node ``ptr[a] + i`` is node ``i`` of agent ``a``.

Queries never see a dense ``B × N`` matrix: query ``b`` of agent ``a_b`` works on its agent's
notes gathered as one padded row of ``M = max size of the batch's agents`` candidates
(``idx = ptr[a_b] + arange(M)``, ``valid = arange(M) < size[a_b]``), in chunks so that
``chunk × M × fields × D`` stays bounded. Association on the union (its operators, the
segment-wise PPR) is :mod:`~soulmem_torch.bank._operators`, the small agents' exact PPR
:mod:`~soulmem_torch.bank._dense`, BayesAction on rows :mod:`~soulmem_torch.bank._bayes`.
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
    NODE_ABSTRACT,
    NODE_SEMANTIC,
    NODE_SPECIFIC,
)
from soulmem_torch.functional.similarity import (
    BlendWeights,
    QueryFields,
    normalize_rows,
    row_dots,
)

__all__ = [
    "UnionSnapshot",
    "agent_graph",
    "build_union",
    "candidates",
    "grouped_is_cheaper",
    "grouped_structured_similarity",
    "note_ids",
    "plain_similarity",
    "splice_union",
    "structured_similarity",
]

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
            [t if t is not None else torch.zeros(int(g.num_nodes), d)
             for g, t in ((g, g.tag_emb) for g in self.graphs)] or [torch.zeros(0, d)]
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
    if g.tag_table is not None and g.field_table is not None:
        notes = cached_note_side(g, cache=False)
        return notes.to(device)
    tag = g.tag_table if g.tag_table is not None else torch.zeros(n, d)
    mask = g.tag_mask if g.tag_table is not None else torch.zeros(n, dtype=torch.bool)
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
    field_tables = [g.field_table for g in graphs]
    counts = torch.tensor(
        [int(t.shape[0]) if t is not None else 0 for t in field_tables], dtype=_I64
    )
    row_ptr = torch.zeros(len(graphs) + 1, dtype=_I64)
    torch.cumsum(counts, 0, out=row_ptr[1:])
    rows = _raw_cat([t for t in field_tables if t is not None], d)
    pos = torch.cat(
        [g.field_pos.to(_I64) if g.field_pos is not None
         else torch.full((int(g.num_nodes), f), -1, dtype=_I64) for g in graphs]
    )  # fmt: skip
    shift = torch.repeat_interleave(row_ptr[:-1], sizes).unsqueeze(1)
    pos = torch.where(pos >= 0, pos + shift, -1)
    tag_tables = [g.tag_table for g in graphs]
    tag = _raw_cat(
        [t if t is not None else torch.zeros(int(g.num_nodes), d)
         for g, t in zip(graphs, tag_tables)], d
    )  # fmt: skip
    mask = torch.cat(
        [g.tag_mask if t is not None
         else torch.zeros(int(g.num_nodes), dtype=torch.bool) for g, t in zip(graphs, tag_tables)]
    )  # fmt: skip
    notes = note_side_compact(tag, mask, rows, pos, device=device)
    return notes, row_ptr.to(device)


def _raw_cat(parts: Sequence[Any], d: int) -> Any:
    """The raw tables ``parts`` (dense and / or sparse) one after another: sparse when any
    part is (dense parts converted), else one ``torch.cat``."""
    from soulmem_torch.functional.sparse_rows import SparseRows

    if any(isinstance(t, SparseRows) for t in parts):
        return SparseRows.cat(
            [t if isinstance(t, SparseRows) else SparseRows.from_dense(t.to(torch.float32))
             for t in parts]
        )  # fmt: skip
    return torch.cat(parts) if parts else torch.zeros(0, d)


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
    rows = _cat_tables([x.rows for x in parts], counts, d, device, zero_row=True)
    f = len(FIELD_NAMES)
    if parts:
        sizes = torch.tensor([int(x.index.shape[0]) for x in parts], dtype=_I64, device=device)
        shift = torch.repeat_interleave(torch.tensor(starts[:-1], dtype=_I64, device=device), sizes)
        mask = torch.cat([x.mask for x in parts])
        index = torch.where(mask, torch.cat([x.index for x in parts]) + shift.unsqueeze(1), p)
        tag = _cat_tables([x.tag for x in parts], None, d, device, zero_row=False)
        no_tag = torch.cat([x.no_tag for x in parts])
        has_emb = torch.cat([x.has_emb for x in parts])
    else:
        mask = torch.zeros(0, f, dtype=torch.bool, device=device)
        index = torch.zeros(0, f, dtype=_I64, device=device)
        tag = torch.zeros(0, d, device=device)
        no_tag = has_emb = torch.zeros(0, dtype=torch.bool, device=device)
    notes = NoteSide(rows, index, mask, tag, no_tag, has_emb)
    return notes, torch.tensor(starts, dtype=_I64, device=device)


def _cat_tables(
    parts: list[Any], counts: list[int] | None, d: int, device: torch.device, *, zero_row: bool
) -> Any:
    """The tables ``parts`` (dense tensors or ``SparseRows``; with ``counts``, only the first
    ``counts[i]`` rows of each: their trailing zero rows dropped) one after another, plus one
    zero row when ``zero_row``, in the layout the whole asks for
    (:func:`~soulmem_torch.functional.sparse_rows.join_tables`)."""
    from soulmem_torch.functional.sparse_rows import SparseRows, join_tables

    if counts is not None:
        parts = [x.narrow(0, c) if isinstance(x, SparseRows) else x[:c]
                 for x, c in zip(parts, counts)]  # fmt: skip
    table = join_tables([x.to(device) for x in parts], d)
    if isinstance(table, SparseRows):
        return table.with_zero_row() if zero_row else table
    table = table.to(device, torch.float32)
    if zero_row:
        return torch.cat([table, table.new_zeros(1, d)])
    return table


def _slice_note_side(notes: Any, n0: int, n1: int, r0: int, r1: int) -> Any:
    """Notes ``n0:n1`` of a union note side whose rows are ``r0:r1``, as a note side of their
    own (index local to the slice, a zero row appended): views, except the appended row."""
    from soulmem_torch.functional.similarity import NoteSide
    from soulmem_torch.functional.sparse_rows import SparseRows

    if isinstance(notes.rows, SparseRows):
        rows = notes.rows.narrow(r0, r1).with_zero_row()
    else:
        rows = torch.cat([notes.rows[r0:r1], notes.rows.new_zeros(1, notes.rows.shape[1])])
    mask = notes.mask[n0:n1]
    index = torch.where(mask, notes.index[n0:n1] - r0, r1 - r0)
    return NoteSide(rows, index, mask, _table_rows(notes.tag, n0, n1), notes.no_tag[n0:n1],
                    notes.has_emb[n0:n1])  # fmt: skip


def _table_rows(table: Any, lo: int, hi: int) -> Any:
    """Rows ``lo:hi`` of a dense or sparse table (views)."""
    from soulmem_torch.functional.sparse_rows import SparseRows

    return table.narrow(lo, hi) if isinstance(table, SparseRows) else table[lo:hi]


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

    dims = {int(t.shape[1]) for t in (g.tag_table for g in graphs) if t is not None}
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
        if any(g.field_table is not None for g in graphs):
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
        if int(g.num_nodes) == 0 and g.tag_table is None and g.field_table is None:
            continue  # an empty segment (an agent not yet asked) fits any layout
        tag_table = g.tag_table
        if (tag_table is None) != (old.tag_dim is None):
            return None
        if tag_table is not None and int(tag_table.shape[-1]) != old.tag_dim:
            return None
        if (g.field_table is None) != (old.notes is None):
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
            [int(t.shape[0]) if t is not None else 0 for t in (g.field_table for g in graphs)],
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


def _candidate_cos(notes: Any, qs: Any, ix: Tensor) -> Any:
    """``cos(query field, note field) -> (s, U, M)`` for ``s`` queries against their candidate
    rows: the candidates' rows of that note field (``ix``: (s, M) union nodes; the field's
    row of each read off ``notes.index`` — one field at a time, only the fields the rules read,
    the zero row where absent) matched by one sampled product with the queries' normalized
    unit field (``qs``: a :class:`~soulmem_torch.functional.similarity.QueryFields`, which
    normalizes only the fields some unit has: the others' cosines are zeros, as a zero row's
    are)."""
    from soulmem_torch.embedding.fields import FIELD_INDEX, QUERY_FIELD_INDEX

    s, u = qs.shape
    m = int(ix.shape[1])

    def cos(q_name: str, f_name: str) -> Tensor:
        qf = qs.slice(QUERY_FIELD_INDEX[q_name])
        if qf is None:
            return ix.new_zeros((s, u, m), dtype=torch.float32)
        rows = _take(notes.index[:, FIELD_INDEX[f_name]], ix)  # (s, M): that field's rows only
        cols = rows.unsqueeze(1).expand(s, u, m).reshape(s * u, m)
        return row_dots(qf.reshape(s * u, -1), notes.rows, cols).view(s, u, m)

    return cos


def _take(x: Tensor, ix: Tensor) -> Tensor:
    """``x[ix]`` for a 1-D ``x`` (one ``index_select``: less fixed cost than indexing)."""
    return x.index_select(0, ix.reshape(-1)).view(ix.shape)


def _has_field(mask: Tensor, ix: Tensor, name: str) -> Tensor:
    """``(s, 1, M)``: which candidates ``ix`` (s, M) have note field ``name`` (``mask``: the
    note side's (N, F) presence)."""
    from soulmem_torch.embedding.fields import FIELD_INDEX

    return _take(mask[:, FIELD_INDEX[name]], ix).unsqueeze(1)


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
    matrix: for each note field the rules read, one sampled product of the queries' field
    with the candidates' rows of that field (:func:`~soulmem_torch.functional.similarity.row_dots`:
    read in place, never gathered as ``(c, M, D)``), the same for the tags.
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
    kind = q.kind.to(device)
    q_zero = ~(q.tag != 0).any(dim=-1)
    # per query: its candidates' (M, F) row numbers and masks, and ~16 (U, M) cosine planes
    u = q.num_units
    for sl in _chunks(b, m * (2 * int(notes.index.shape[1]) + 16 * max(u, 1))):
        ix = idx[sl]
        ntype = _take(union.node_type, ix)
        c = ix.shape[0]
        variant = torch.zeros(c, m, dtype=torch.float32, device=device)
        k = kind[sl]
        sem = (k == QUERY_SEMANTIC).nonzero().squeeze(1)
        sit = (k == QUERY_SITUATION).nonzero().squeeze(1)
        rows = torch.arange(sl.start, sl.stop, device=device)
        if sem.numel():
            at = rows.index_select(0, sem)
            qs = QueryFields(q, at, qm.index_select(0, at))
            cos = _candidate_cos(notes, qs, ix.index_select(0, sem))
            v = fsim.semantic_variant(cos, qm.index_select(0, at), um.index_select(0, at), w)
            variant[sem] = torch.where(ntype.index_select(0, sem) == NODE_SEMANTIC, v, 0.0)
        if sit.numel():
            at = rows.index_select(0, sit)
            qs = QueryFields(q, at, qm.index_select(0, at))
            ix_sit, nt_sit = ix.index_select(0, sit), ntype.index_select(0, sit)
            cos = _candidate_cos(notes, qs, ix_sit)
            v = fsim.situation_variant(
                cos, functools.partial(_has_field, notes.mask, ix_sit), nt_sit.unsqueeze(1),
                qm.index_select(0, at), um.index_select(0, at), w,
            )  # fmt: skip
            is_sit = (nt_sit == NODE_SPECIFIC) | (nt_sit == NODE_ABSTRACT)
            variant[sit] = torch.where(is_sit, v, 0.0)
        # a query without tags scores its variant alone: its tag cosines are never read
        tagged = (~q_zero[sl]).nonzero().squeeze(1)
        if int(tagged.numel()) == c:
            tag_cos = row_dots(normalize_rows(q.tag[sl]), notes.tag, ix)
        else:
            tag_cos = torch.zeros(c, m, dtype=torch.float32, device=device)
            if tagged.numel():
                qtag = normalize_rows(q.tag[sl][tagged])  # (row by row: the same values)
                tag_cos[tagged] = row_dots(qtag, notes.tag, ix[tagged])
        no_tag = q_zero[sl].unsqueeze(1) | _take(notes.no_tag, ix)
        score = torch.where(no_tag, variant, w.tag * tag_cos + w.variant * variant)
        has_emb = _take(notes.has_emb, ix)
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
    from soulmem_torch.functional.sparse_rows import SparseRows

    rows = union.notes.rows
    d = int(rows.shape[1])
    if isinstance(rows, SparseRows):  # a gathered row costs its cells (~25 ns each)
        d = 50 * max(rows.nnz, 1) // max(len(rows), 1)
    return num_agents * _GROUP_SECONDS < num_queries * m * 2 * d * _GATHER_SECONDS_PER_FLOAT


def _agent_notes(union: UnionSnapshot, p: int, lo: int, hi: int) -> Any:
    """Notes ``lo:hi`` (agent ``p``) of the union note side, as a note side of their own:
    views of the union's dense tensors (``index`` still points at union rows), no copy; from
    a sparse note side, the agent's own rows and tags made dense (a few hundred rows: the
    dense kernels' fixed cost per call is lower than the sparse ones')."""
    from soulmem_torch.functional.similarity import NoteSide
    from soulmem_torch.functional.sparse_rows import SparseRows

    notes = union.notes
    if isinstance(notes.rows, SparseRows) or isinstance(notes.tag, SparseRows):
        r0, r1 = (int(x) for x in union.row_ptr[p : p + 2])
        own = _slice_note_side(notes, lo, hi, r0, r1)
        rows = own.rows.to_dense() if isinstance(own.rows, SparseRows) else own.rows
        tag = own.tag.to_dense() if isinstance(own.tag, SparseRows) else own.tag
        return own._replace(rows=rows, tag=tag)
    return NoteSide(
        notes.rows, notes.index[lo:hi], notes.mask[lo:hi], _table_rows(notes.tag, lo, hi),
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
            _agent_notes(union, p, lo, hi), union.node_type[lo:hi],
            string_scores=None if string is None else string[r, : hi - lo],
            weights=weights,
        )  # fmt: skip
    return out


def agent_graph(union: UnionSnapshot, p: int) -> Any:
    """Agent ``p``'s own snapshot on the union's device (moved copies cached on the union, so
    their derived caches — transition, text index — survive between calls)."""
    graph = union.graphs[p]
    if graph.device == union.device:
        return graph
    key = ("agent_graph", p)
    moved = union.cache.get(key)
    if moved is None:
        moved = union.cache[key] = graph.to(union.device)
    return moved
