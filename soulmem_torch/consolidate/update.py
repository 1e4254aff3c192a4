"""The plasticity update of ``SoulMem`` memories, one or many at once (docs/spec.md §10).

:func:`update_plasticity` gathers the records of the memories that retrieved something since
their last update, runs :func:`~soulmem_torch.consolidate.plasticity.plasticity_kernel` once over
all of them, and writes the changed links back: the changed source notes are copied with their
new link values, an optional ``persist`` callback gets those copies first (**persist first,
then apply**: if it raises, nothing changed), then one synchronous step puts the values on the
live notes, refreshes the clusters (their version moves on) and registers each changed memory's
next snapshot as a copy of the current one with the new edge values — the other memories'
snapshots, transitions and dense inverses are untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from soulmem_torch.consolidate.plasticity import (
    DEFAULT_TOP_K,
    LinkChange,
    PlasticityPlan,
    _check_top_k,
    plasticity_kernel,
)
from soulmem_torch.functional.codes import LINK_PROC, LINK_SEM
from soulmem_torch.model.serde import f32_round

__all__ = ["MemoryStats", "memory_stats", "update_plasticity"]

_I64 = torch.int64


@dataclass
class MemoryStats:
    """One memory's record statistics aligned with its snapshot's nodes (CPU tensors).

    Attributes:
        count: shape (N,), int64. Record ``retrieval_count`` (0 without a record).
        span: shape (N,), int64. Record ``access_time_span()`` in seconds (0 without one).
        has_record: shape (N,), bool.
        id_rank: shape (N,), int64. Rank of each note id among the memory's ids.
    """

    count: Tensor
    span: Tensor
    has_record: Tensor
    id_rank: Tensor


def _id_rank(graph: Any) -> Tensor:
    cached = graph.cache.get("consolidate.id_rank")
    if cached is None:
        ids = graph.ids
        order = sorted(range(len(ids)), key=lambda i: ids[i].int)
        cached = torch.empty(len(ids), dtype=_I64)
        cached[torch.tensor(order, dtype=_I64)] = torch.arange(len(ids), dtype=_I64)
        graph.cache["consolidate.id_rank"] = cached
    return cached


def memory_stats(working_memory: Any, graph: Any) -> MemoryStats:
    """The record statistics of ``working_memory`` on the nodes of ``graph`` (its snapshot)."""
    records = working_memory.records
    rows = [records.get(mid) for mid in graph.ids]
    count = [0 if r is None else r.retrieval_count for r in rows]
    # a record never retrieved has f = 0 whatever its span: its span is not needed
    span = [r.access_time_span() if c else 0 for r, c in zip(rows, count)]
    return MemoryStats(
        count=torch.tensor(count, dtype=_I64),
        span=torch.tensor(span, dtype=_I64),
        has_record=torch.tensor([r is not None for r in rows], dtype=torch.bool),
        id_rank=_id_rank(graph),
    )


def _union_rowptr(union: Any) -> Tensor:
    rowptr = union.cache.get("consolidate.rowptr")
    if rowptr is None:
        counts = torch.bincount(union.edge_index[0], minlength=union.num_nodes)
        rowptr = torch.zeros(union.num_nodes + 1, dtype=_I64, device=counts.device)
        torch.cumsum(counts, 0, out=rowptr[1:])
        union.cache["consolidate.rowptr"] = rowptr
    return rowptr


def _single_union(graph: Any) -> Any:
    """A one-agent view of a snapshot with the fields the kernel reads."""

    class _View:
        pass

    view = _View()
    view.ptr = torch.tensor([0, int(graph.num_nodes)], dtype=_I64)
    view.eptr = torch.tensor([0, int(graph.edge_index.shape[1])], dtype=_I64)
    view.edge_index = graph.edge_index
    view.rowptr = graph.rowptr
    view.edge_kind, view.intensity = graph.edge_kind, graph.intensity
    view.confidence, view.prob = graph.confidence, graph.prob
    view.graphs = [graph]
    return view


def _edge_union(graphs: Sequence[Any]) -> Any:
    """The disjoint union of the snapshots' nodes and edges only (what the kernel reads; no
    embeddings are concatenated)."""

    class _View:
        pass

    view = _View()
    sizes = torch.tensor([int(g.num_nodes) for g in graphs], dtype=_I64)
    esizes = torch.tensor([int(g.edge_index.shape[1]) for g in graphs], dtype=_I64)
    view.ptr = torch.zeros(len(graphs) + 1, dtype=_I64)
    torch.cumsum(sizes, 0, out=view.ptr[1:])
    view.eptr = torch.zeros(len(graphs) + 1, dtype=_I64)
    torch.cumsum(esizes, 0, out=view.eptr[1:])
    offset = torch.repeat_interleave(view.ptr[:-1], esizes)
    view.edge_index = torch.cat([g.edge_index for g in graphs], dim=1) + offset
    for name in ("edge_kind", "intensity", "confidence", "prob"):
        setattr(view, name, torch.cat([getattr(g, name) for g in graphs]))
    view.graphs = list(graphs)
    view.num_nodes = int(view.ptr[-1])
    view.cache = {}
    return view


def update_plasticity(
    memories: Sequence[Any],
    *,
    top_k: int = DEFAULT_TOP_K,
    agent_ids: Sequence[str | None] | None = None,
    union: Any = None,
    persist: Callable[[dict[int, list[Any]]], None] | None = None,
    on_applied: Callable[[PlasticityPlan, list[int]], None] | None = None,
) -> list[LinkChange]:
    """One plasticity update of every memory in ``memories`` (``SoulMem`` objects).

    Args:
        memories: the memories (a bank's agents, in union order when ``union`` is given).
        top_k: >= 0. Hot notes per memory.
        agent_ids: one id per memory for the reported changes (``None``: no agent ids).
        union: the memories' disjoint-union snapshot (``MemoryBank.union()``, on the CPU);
            ``None``: built here from their snapshots (one memory: its own snapshot).
        persist: called with ``{memory position: [changed source notes, as copies with the new
            link values]}`` before anything is applied; an exception leaves every memory as it
            was (and propagates).
        on_applied: called after the values are applied with the plan and the positions of
            the memories that changed (how a bank patches its union instead of rebuilding it).

    Returns:
        the changed links, in memory order and then union edge order.
    """
    top_k = _check_top_k(top_k)
    memories = list(memories)
    if not memories:
        return []
    wms = [m.working_memory for m in memories]
    active_list = [wm.retrieval_revision != wm.plasticity_revision for wm in wms]
    if not any(active_list):
        return []
    graphs = [wm.graph() for wm in wms]
    if union is None:
        union = _single_union(graphs[0]) if len(memories) == 1 else _edge_union(graphs)
    if getattr(union, "rowptr", None) is None or len(memories) > 1:
        rowptr = _union_rowptr(union)
    else:
        rowptr = union.rowptr
    ptr = union.ptr
    n = int(ptr[-1])
    count = torch.zeros(n, dtype=_I64)
    span = torch.zeros(n, dtype=_I64)
    has_record = torch.zeros(n, dtype=torch.bool)
    id_rank = torch.zeros(n, dtype=_I64)
    ptr_l = ptr.tolist()
    for p, is_active in enumerate(active_list):
        if is_active:
            stats = memory_stats(wms[p], graphs[p])
            sl = slice(ptr_l[p], ptr_l[p + 1])
            count[sl], span[sl], has_record[sl], id_rank[sl] = (
                stats.count, stats.span, stats.has_record, stats.id_rank,
            )  # fmt: skip
    plan = plasticity_kernel(
        ptr, rowptr, union.edge_index[1], union.edge_kind, union.intensity, union.confidence,
        union.prob, count, span, id_rank, has_record=has_record,
        active=torch.tensor(active_list, dtype=torch.bool), top_k=top_k,
    )  # fmt: skip
    changes = apply_plan(memories, graphs, union, plan, active_list, agent_ids, persist)
    if on_applied is not None and changes:
        owner = torch.searchsorted(union.eptr, plan.edges, right=True) - 1
        on_applied(plan, sorted(set(owner.tolist())))
    return changes


def apply_plan(
    memories: list[Any],
    graphs: list[Any],
    union: Any,
    plan: PlasticityPlan,
    active_list: list[bool],
    agent_ids: Sequence[str | None] | None,
    persist: Callable[[dict[int, list[Any]]], None] | None,
) -> list[LinkChange]:
    """Persist first, then apply the plan (see the module docstring)."""
    from soulmem_torch._signals import sigint_deferred

    eptr = union.eptr
    edges = plan.edges
    owner = torch.searchsorted(eptr, edges, right=True) - 1
    local = edges - eptr[owner]
    owner_l, local_l = owner.tolist(), local.tolist()
    src_l = (union.edge_index[0].index_select(0, edges) - union.ptr[owner]).tolist()
    new_i, new_p = plan.intensity.tolist(), plan.prob.tolist()
    new_c = [f32_round(c) for c in plan.confidence.tolist()]  # the model's float32 form
    kinds = union.edge_kind[edges].tolist()
    # per memory: {source note id: {link id: (intensity, confidence, prob, kind)}}
    wanted: dict[int, dict[Any, dict[Any, tuple[float, float, float, int]]]] = {}
    changes: list[LinkChange] = []
    for j, (p, e, u) in enumerate(zip(owner_l, local_l, src_l)):
        g = graphs[p]
        src = g.ids[u]
        lid = g.link_ids[e]
        wanted.setdefault(p, {}).setdefault(src, {})[lid] = (new_i[j], new_c[j], new_p[j], kinds[j])
    copies: dict[int, list[Any]] = {}
    for p, by_source in wanted.items():
        cluster = memories[p].working_memory.cluster
        out = []
        for src, links in by_source.items():
            note = cluster[src].note
            new_links = []
            for link in note.mem_links:
                values = links.get(link.id)
                if values is None:
                    new_links.append(link)  # unchanged: shared, never mutated
                    continue
                i_new, c_new, p_new, kind = values
                old_c = getattr(link.link_type, "confidence", None)
                old_p = getattr(link.link_type, "prob", None)
                changes.append(
                    LinkChange(
                        link_id=link.id, from_=src, to=link.to,
                        old_intensity=float(link.intensity), new_intensity=i_new,
                        old_confidence=old_c, new_confidence=c_new if kind == LINK_SEM else None,
                        old_prob=old_p, new_prob=p_new if kind == LINK_PROC else None,
                        agent=None if agent_ids is None else agent_ids[p],
                    )
                )  # fmt: skip
                # validated values (clamped to [0, 1], confidence in its float32 form):
                # copies without re-validation
                lt = link.link_type
                if kind == LINK_SEM:
                    lt = lt.model_copy(update={"confidence": c_new})
                elif kind == LINK_PROC:
                    lt = lt.model_copy(update={"prob": p_new})
                new_links.append(link.model_copy(update={"intensity": i_new, "link_type": lt}))
            out.append(note.model_copy(update={"mem_links": new_links}))
        copies[p] = out
    if persist is not None and copies:
        persist(copies)
    # the changed edges are sorted, so each memory's are one contiguous slice of the plan
    runs = torch.unique_consecutive(owner, return_counts=True)
    offsets: dict[int, tuple[int, int]] = {}
    at = 0
    for p, c in zip(*(t.tolist() for t in runs)):
        offsets[p] = (at, at + c)
        at += c
    with sigint_deferred():
        for p, twins in copies.items():
            wm = memories[p].working_memory
            cluster = wm.cluster
            old_graph = graphs[p]
            with cluster._lock:
                for twin in twins:
                    note = cluster[twin.id].note
                    note.mem_links = twin.mem_links
                    cluster.mark_changed(twin.id)
                lo, hi = offsets[p]
                pos = local[lo:hi]
                inten = old_graph.intensity.clone()
                conf = old_graph.confidence.clone()
                prob = old_graph.prob.clone()
                inten[pos] = plan.intensity[lo:hi]
                conf[pos] = plan.confidence[lo:hi]
                prob[pos] = plan.prob[lo:hi]
                patched = old_graph.with_edge_values(
                    intensity=inten, confidence=conf, prob=prob, version=cluster.version
                )
                cluster.derived(("graph", torch.device("cpu")), lambda g=patched: g)
        for p, is_active in enumerate(active_list):
            if is_active:
                wm = memories[p].working_memory
                wm.plasticity_revision = wm.retrieval_revision
    return changes
