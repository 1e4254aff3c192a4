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
from soulmem_torch.functional.similarity import BlendWeights, normalize_rows

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
        tag_emb / tag_mask: (N, D) float32 / (N,) bool, or None when no agent has embeddings.
        field_emb / field_mask: (N, F, D) / (N, F), or None when no agent has field vectors.
        graphs: the agents' own snapshots (CPU), for the per-agent fallbacks and the ids.
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
    tag_emb: Tensor | None
    tag_mask: Tensor | None
    field_emb: Tensor | None
    field_mask: Tensor | None
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
    tag_emb = tag_mask = field_emb = field_mask = None
    if dims:
        (d,) = dims
        tag_emb = torch.cat(
            [g.tag_emb if g.tag_emb is not None else torch.zeros(int(g.num_nodes), d)
             for g in graphs]
        )  # fmt: skip
        tag_mask = torch.cat(
            [g.tag_mask if g.tag_mask is not None
             else torch.zeros(int(g.num_nodes), dtype=torch.bool) for g in graphs]
        )  # fmt: skip
        if any(g.field_emb is not None for g in graphs):
            from soulmem_torch.embedding.fields import FIELD_NAMES

            f = len(FIELD_NAMES)
            field_emb = torch.cat(
                [g.field_emb if g.field_emb is not None
                 else torch.zeros(int(g.num_nodes), f, d) for g in graphs]
            )  # fmt: skip
            field_mask = torch.cat(
                [g.field_mask if g.field_mask is not None
                 else torch.zeros(int(g.num_nodes), f, dtype=torch.bool) for g in graphs]
            )  # fmt: skip

    def dev(t: Tensor | None) -> Tensor | None:
        return None if t is None else t.to(device)

    return UnionSnapshot(
        ptr=ptr.to(device),
        eptr=eptr.to(device),
        sizes=sizes.to(device),
        agent=agent.to(device),
        node_type=node_type.to(device),
        edge_index=edge_index.to(device),
        edge_kind=edge_attr("edge_kind", _I64).to(device),
        intensity=edge_attr("intensity", _F64).to(device),
        confidence=edge_attr("confidence", torch.float32).to(device),
        prob=edge_attr("prob", _F64).to(device),
        tag_emb=dev(tag_emb),
        tag_mask=dev(tag_mask),
        field_emb=dev(field_emb),
        field_mask=dev(field_mask),
        graphs=graphs,
    )


_NODE_FIELDS = ("node_type", "tag_emb", "tag_mask", "field_emb", "field_mask")
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
        for name in ("tag_emb", "field_emb"):
            mine, theirs = getattr(g, name), getattr(old, name)
            if (mine is None) != (theirs is None):
                return None
            if mine is not None and mine.shape[-1] != theirs.shape[-1]:
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
    p = 0
    fresh_set = set(fresh)
    while p < a:
        if p in fresh_set:
            g = graphs[p]
            for name in (*_NODE_FIELDS, *_EDGE_FIELDS):
                value = getattr(g, name)
                if value is not None:
                    parts[name].append(value.to(device))
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
        parts["edge_index"].append(old.edge_index[:, e0:e1] + (ptr_l[p] - old_ptr[p]))
        p = q

    def cat(name: str, empty: Tensor) -> Tensor | None:
        if getattr(old, name, empty) is None:
            return None
        return torch.cat(parts[name]) if parts[name] else empty.to(device)

    return UnionSnapshot(
        ptr=ptr.to(device),
        eptr=eptr.to(device),
        sizes=sizes.to(device),
        agent=torch.repeat_interleave(torch.arange(a, device=device), sizes.to(device)),
        node_type=cat("node_type", torch.zeros(0, dtype=_I64)),
        edge_index=torch.cat(parts["edge_index"], dim=1),
        edge_kind=cat("edge_kind", torch.zeros(0, dtype=_I64)),
        intensity=cat("intensity", torch.zeros(0, dtype=_F64)),
        confidence=cat("confidence", torch.zeros(0)),
        prob=cat("prob", torch.zeros(0, dtype=_F64)),
        tag_emb=cat("tag_emb", torch.zeros(0)),
        tag_mask=cat("tag_mask", torch.zeros(0, dtype=torch.bool)),
        field_emb=cat("field_emb", torch.zeros(0)),
        field_mask=cat("field_mask", torch.zeros(0, dtype=torch.bool)),
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
    if union.tag_emb is None:
        raise ValidationError("working_memory: plain queries need notes with embeddings")
    # the normalized note vectors, followed by zero rows (as many as the largest agent has
    # notes) so that every query's window of candidate rows stays inside the tensor
    padded = union.cache.get("tag_normalized_padded")
    if padded is None:
        n, d = union.tag_emb.shape
        pad = int(union.sizes.max()) if union.num_agents else 0
        padded = torch.zeros(n + pad, d, dtype=torch.float32, device=union.tag_emb.device)
        torch.div(
            union.tag_emb.to(torch.float32),
            _safe_norm(union.tag_emb.to(torch.float32)),
            out=padded[:n],
        )
        union.cache["tag_normalized_padded"] = padded
    xn = padded[: union.tag_emb.shape[0]]
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
    padded candidate rows: its variant kernels run under ``torch.func.vmap`` over the queries
    (one ``bmm`` per field pair), never on a ``B × N`` matrix.
    """
    from soulmem_torch.functional import similarity as fsim

    w = weights if weights is not None else BlendWeights()
    device = idx.device
    b, m = idx.shape
    out = torch.zeros(b, m, dtype=torch.float32, device=device)
    if b == 0 or m == 0:
        return out
    if union.tag_emb is None or union.field_emb is None:
        return out  # the retrieve layer scores notes without embeddings as 0
    q = batch.to(device)
    fn_u = union.cache.get("field_normalized")
    if fn_u is None:
        fn_u = normalize_rows(union.field_emb).masked_fill_(~union.field_mask.unsqueeze(-1), 0.0)
        union.cache["field_normalized"] = fn_u
    tn_u = union.cache.get("tag_masked_normalized")
    if tn_u is None:
        tn_u = normalize_rows(union.tag_emb) * union.tag_mask.unsqueeze(-1)
        union.cache["tag_masked_normalized"] = tn_u
    n_zero_u = ~((union.tag_emb != 0).any(dim=-1) & union.tag_mask)
    um = q.unit_mask
    qm = q.field_mask & um.unsqueeze(-1)
    qn = normalize_rows(q.field).masked_fill_(~qm.unsqueeze(-1), 0.0)
    kind = q.kind.to(device)
    qtag = normalize_rows(q.tag)
    q_zero = ~(q.tag != 0).any(dim=-1)
    from soulmem_torch.embedding.fields import QUERY_SEMANTIC, QUERY_SITUATION

    sem_variant = torch.func.vmap(fsim._semantic_variant, in_dims=(0, 0, 0, 0, None))
    sit_variant = torch.func.vmap(fsim._situation_variant, in_dims=(0, 0, 0, 0, 0, 0, None))
    f, d = union.field_emb.shape[1], union.field_emb.shape[2]
    for sl in _chunks(b, m * f * d):
        ix = idx[sl]
        fn = fn_u[ix]  # (c, M, F, D)
        fm = union.field_mask[ix]
        ntype = union.node_type[ix]
        c = ix.shape[0]
        variant = torch.zeros(c, m, dtype=torch.float32, device=device)
        k = kind[sl]
        sem = (k == QUERY_SEMANTIC).nonzero().squeeze(1)
        sit = (k == QUERY_SITUATION).nonzero().squeeze(1)
        if sem.numel():
            v = sem_variant(
                qn[sl][sem].unsqueeze(1), qm[sl][sem].unsqueeze(1), um[sl][sem].unsqueeze(1),
                fn[sem], w,
            ).squeeze(1)  # fmt: skip
            variant[sem] = torch.where(ntype[sem] == NODE_SEMANTIC, v, 0.0)
        if sit.numel():
            v = sit_variant(
                qn[sl][sit].unsqueeze(1), qm[sl][sit].unsqueeze(1), um[sl][sit].unsqueeze(1),
                fn[sit], fm[sit], ntype[sit], w,
            ).squeeze(1)  # fmt: skip
            is_sit = (ntype[sit] == NODE_SPECIFIC) | (ntype[sit] == NODE_ABSTRACT)
            variant[sit] = torch.where(is_sit, v, 0.0)
        tag_cos = torch.bmm(tn_u[ix], qtag[sl].unsqueeze(-1)).squeeze(-1)
        no_tag = q_zero[sl].unsqueeze(1) | n_zero_u[ix]
        score = torch.where(no_tag, variant, w.tag * tag_cos + w.variant * variant)
        has_emb = union.tag_mask[ix]
        score = torch.where(has_emb, score, 0.0)
        if string is not None:
            fused = fsim.fuse_string_scores(score, string[sl], alpha=w.string_blend_alpha)
            score = torch.where(has_emb, fused, 0.0)
        out[sl] = score
    return torch.where(valid, out, 0.0)


# Cost model of the two structured paths (seconds): gathering candidate field tensors per query
# moves ~B·M·F·D floats; scoring per agent group costs a fixed overhead per distinct agent.
_GATHER_SECONDS_PER_FLOAT = 0.5e-9
_GROUP_SECONDS = 5e-4


def grouped_is_cheaper(union: UnionSnapshot, num_queries: int, num_agents: int, m: int) -> bool:
    """Whether scoring per agent group beats the gathered candidate rows for this batch."""
    if union.field_emb is None:
        return False
    f, d = union.field_emb.shape[1], union.field_emb.shape[2]
    return num_agents * _GROUP_SECONDS < num_queries * m * f * d * _GATHER_SECONDS_PER_FLOAT


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
    slice of the union (its queries × its notes), written into ``(B, M)`` rows. Used when a
    batch holds many queries per agent, where gathering an agent's field tensors once per
    query would cost more than the per-agent calls."""
    from soulmem_torch.functional.similarity import fused_similarity

    device = union.device
    out = torch.zeros(len(positions), m, dtype=torch.float32, device=device)
    if union.tag_emb is None or union.field_emb is None or not positions:
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
        out[r, : hi - lo] = fused_similarity(
            sub.tag, sub.kind, sub.field, sub.field_mask, sub.unit_mask,
            union.tag_emb[lo:hi], union.tag_mask[lo:hi], union.field_emb[lo:hi],
            union.field_mask[lo:hi], union.node_type[lo:hi],
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
