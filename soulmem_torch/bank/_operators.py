"""Association on the union: the union's transition operators (block-diagonal, cached per
association settings, spliced from the previous union's when only some agents changed) and
the segment-wise power iteration of every asked query on its agent's block (docs/spec.md §6).

What a union carries across a change lives here too: :func:`carry_operators` (the operators and
the dense stores of :mod:`~soulmem_torch.bank._dense` of the agents that did not change) and
:func:`with_edge_values` (the union after a plasticity update).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from soulmem_torch.bank._dense import carry_dense
from soulmem_torch.bank._union import UnionSnapshot
from soulmem_torch.errors import ValidationError
from soulmem_torch.functional.fusion import undirected_edges
from soulmem_torch.functional.ppr import build_transition, power_iteration_steps
from soulmem_torch.retrieve.operators import (
    dynamic_weights,
    transition,
    undirected_transition,
    weight_key,
)

__all__ = [
    "USE_SCIPY",
    "UnionOperator",
    "carry_operators",
    "segment_power_ppr",
    "segment_power_ppr_channels",
    "union_transition",
    "with_edge_values",
]

_F64 = torch.float64
_I64 = torch.int64


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
    each changed or new agent's own operator (:func:`~soulmem_torch.retrieve.operators.transition`, cached on
    its snapshot): ``O(total entries)`` copying, no sort, nothing recomputed for the others."""
    previous = union.cache.get("previous")
    if previous is None or key not in previous[0]:
        return None
    own_transition = undirected_transition if key[0] == "transition_undirected" else transition
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
            own = own_transition(union.graphs[p], config)
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
    :func:`~soulmem_torch.retrieve.operators.undirected_transition`)."""
    name = "transition_undirected" if undirected else "transition"
    key = (name, *weight_key(config))
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
