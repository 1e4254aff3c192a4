"""Long-term potentiation and depression of links from retrieval records (docs/spec.md §10).

The rules (the newest original's ``run_plasticity_update``):

* a record's **frequency** is ``f = retrieval_count / max(last − first access, 1 s)`` (whole
  seconds, truncated: :meth:`Record.access_time_span`);
* the **hot notes** are the records ranked by ``f`` (descending; ties: ``retrieval_count``
  descending, then note id ascending), the first ``top_k`` (default 8) — :func:`hot_notes`;
* every outgoing link between two hot notes gets ``delta = plasticity_delta(norm)`` with
  ``norm = min(f_from, f_to) / max f over the hot notes`` clamped to [0, 1], added to its
  ``intensity``, its Sem ``confidence`` and its Proc ``prob``, each clamped to [0, 1] (the
  confidence is rounded to float32, as the original's ``f32``);
* nothing happens when fewer than two notes are hot, when the largest ``f`` is ≤ ε (float64
  machine epsilon), or when no retrieval was recorded since the last update (the working
  memory's ``retrieval_revision`` did not move).

:func:`plasticity_kernel` evaluates all of it for many agents at once as tensor operations on a
disjoint union (``ptr``-delimited agents, block-diagonal CSR edges): the ranking either sorts
only the retrieved notes (three stable sorts of a few entries per agent, when every agent that
retrieved anything retrieved at least ``top_k`` notes) or works on padded ``(A, M)`` rows (one
``topk``, a threshold, and a second ``topk`` on a packed tie key only when ties straddle the
k-th place); then one gather of the hot notes' out-edges and one elementwise update — no Python
loop over agents, notes or links. :func:`update_plasticity` feeds it from ``SoulMem`` working
memories (one or a whole bank) and writes the changed links back; the
per-link Python loop :func:`plasticity_reference` is its oracle (tests, benchmark).

**DECISION:** records of ids that are not notes of the memory (only a direct
``record_retrieval`` call can open one) are not ranked: they have no links, and the original lets
them take a hot slot and raise the maximum frequency.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from soulmem_torch.errors import ValidationError
from soulmem_torch.functional.codes import LINK_PROC, LINK_SEM
from soulmem_torch.model.serde import f32_round, to_float32

__all__ = [
    "DEFAULT_TOP_K",
    "LINK_VALUE_MAX",
    "LINK_VALUE_MIN",
    "LTD_STEP_MAX",
    "LTP_NORM_THRESHOLD",
    "LTP_STEP_MAX",
    "LinkChange",
    "PlasticityPlan",
    "hot_notes",
    "plasticity_delta",
    "plasticity_kernel",
    "plasticity_reference",
    "retrieval_frequency",
]

DEFAULT_TOP_K = 8
"""Hot notes per memory (the original's ``DEFAULT_TOP_K``)."""
LTP_NORM_THRESHOLD = 0.5
"""``norm`` at and above which a link is strengthened (below: weakened)."""
LTP_STEP_MAX = 0.08
"""Largest strengthening step (at ``norm`` 1)."""
LTD_STEP_MAX = 0.05
"""Largest weakening step (at ``norm`` 0)."""
LINK_VALUE_MIN = 0.0
LINK_VALUE_MAX = 1.0
EPSILON = sys.float_info.epsilon
"""The largest frequency at or below which nothing is updated (``f64::EPSILON``)."""

_F64 = torch.float64
_I64 = torch.int64


def plasticity_delta(norm: float) -> float:
    """The change of a link between two hot notes whose normalized frequency is ``norm``.

    ``0.08·(norm − 0.5)/0.5`` when ``norm ≥ 0.5`` (LTP), else ``−0.05·(0.5 − norm)/0.5`` (LTD).

    Args:
        norm: in [0, 1] (other values are extrapolated by the same two lines).

    Example:
        >>> plasticity_delta(0.0), plasticity_delta(0.5), plasticity_delta(1.0)
        (-0.05, 0.0, 0.08)
    """
    t = LTP_NORM_THRESHOLD
    if norm >= t:
        return LTP_STEP_MAX * (norm - t) / (1.0 - t)
    return -LTD_STEP_MAX * (t - norm) / t


def _delta_tensor(norm: Tensor) -> Tensor:
    t = LTP_NORM_THRESHOLD
    return torch.where(
        norm >= t, LTP_STEP_MAX * (norm - t) / (1.0 - t), -LTD_STEP_MAX * (t - norm) / t
    )


def retrieval_frequency(record: Any) -> float:
    """``retrieval_count / max(access_time_span, 1)`` of a :class:`~soulmem_torch.runtime.Record`
    (retrievals per second)."""
    return record.retrieval_count / float(max(record.access_time_span(), 1))


def hot_notes(
    records: Mapping[Any, Any] | Sequence[Any],
    top_k: int = DEFAULT_TOP_K,
    *,
    among: Any = None,
) -> list[tuple[Any, int, float]]:
    """The hot notes: ``[(memory_id, retrieval_count, frequency)]``, hottest first.

    Ranked by frequency (descending), then ``retrieval_count`` (descending), then id
    (ascending); the first ``top_k``.

    Args:
        records: ``working_memory.records`` (id → ``Record``) or a sequence of records.
        top_k: >= 0. How many.
        among: a container of ids; only records whose id is in it are ranked (``None``: all).
    """
    top_k = _check_top_k(top_k)
    values = records.values() if isinstance(records, Mapping) else records
    rows = [
        (r.memory_id, r.retrieval_count, retrieval_frequency(r))
        for r in values
        if among is None or r.memory_id in among
    ]
    rows.sort(key=lambda row: (-row[2], -row[1], row[0].int))
    return rows[:top_k]


def _check_top_k(top_k: Any) -> int:
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
        raise ValidationError(f"top_k: expected an int >= 0, found {top_k!r}")
    return top_k


@dataclass(frozen=True)
class LinkChange:
    """One link changed by a plasticity update.

    Attributes:
        link_id: the link.
        from_: its source note; to: its target note.
        old_intensity / new_intensity: before and after.
        old_confidence / new_confidence: a Sem link's confidence (float32 values); ``None``
            for other kinds.
        old_prob / new_prob: a Proc link's probability; ``None`` for other kinds.
        agent: the agent id (``MemoryBank.update_plasticity``); ``None`` for a ``SoulMem``.
    """

    link_id: Any
    from_: Any
    to: Any
    old_intensity: float
    new_intensity: float
    old_confidence: float | None = None
    new_confidence: float | None = None
    old_prob: float | None = None
    new_prob: float | None = None
    agent: str | None = None


@dataclass
class PlasticityPlan:
    """What :func:`plasticity_kernel` decided, as tensors over the union.

    Attributes:
        edges: shape (C,), int64. Union edge indices of the links that change, ascending.
        intensity / confidence / prob: shape (C,). Their new values (float64 / float32 /
            float64; confidence and prob unchanged for other kinds).
        hot: shape (A, top_k), int64. Union node index of each agent's hot notes, hottest
            first; -1 where an agent has fewer (or is skipped).
        updated: shape (A,), bool. Agents whose hot links were evaluated (active, ≥ 2 hot
            notes, largest frequency > ε).
    """

    edges: Tensor
    intensity: Tensor
    confidence: Tensor
    prob: Tensor
    hot: Tensor
    updated: Tensor


def plasticity_kernel(
    ptr: Tensor,
    rowptr: Tensor,
    dst: Tensor,
    edge_kind: Tensor,
    intensity: Tensor,
    confidence: Tensor,
    prob: Tensor,
    count: Tensor,
    span: Tensor,
    id_rank: Tensor,
    *,
    has_record: Tensor | None = None,
    active: Tensor | None = None,
    top_k: int = DEFAULT_TOP_K,
) -> PlasticityPlan:
    """The plasticity update of many agents at once (see the module docstring).

    Args:
        ptr: shape (A + 1,), int64. Agent ``a`` owns union nodes ``ptr[a]:ptr[a + 1]``.
        rowptr: shape (N + 1,), int64. CSR row pointer of the union's edges (sorted by source).
        dst: shape (E,), int64. Edge targets (union node indices).
        edge_kind: shape (E,), int64. ``LINK_*`` codes.
        intensity: shape (E,), float64. confidence: (E,) float32. prob: (E,) float64.
        count: shape (N,), int64 >= 0. Each note's record ``retrieval_count``.
        span: shape (N,), int64. Each record's ``access_time_span()`` in whole seconds.
        id_rank: shape (N,), int64. Rank of each note's id among its agent's ids (0 = smallest).
        has_record: shape (N,), bool. Notes that have a record (``None``: all).
        active: shape (A,), bool. Agents with a retrieval since their last update (``None``:
            all).
        top_k: >= 0. Hot notes per agent.

    Returns:
        The :class:`PlasticityPlan`.
    """
    top_k = _check_top_k(top_k)
    device = ptr.device
    a = int(ptr.numel()) - 1
    n = int(count.numel())
    sizes = ptr[1:] - ptr[:-1]
    m = int(sizes.max()) if a > 0 and n > 0 else 0
    k = min(top_k, m)
    empty = torch.zeros(0, dtype=_I64, device=device)
    no_hot = torch.full((a, top_k), -1, dtype=_I64, device=device)
    if k < 2 or a == 0:
        return PlasticityPlan(
            empty, intensity[:0].clone(), confidence[:0].clone(), prob[:0].clone(), no_hot,
            torch.zeros(a, dtype=torch.bool, device=device),
        )  # fmt: skip

    hs, hs_norm, hot, updated = _rank_sparse(
        ptr, count, span, id_rank, has_record, active, k, m, top_k
    ) or _rank_padded(ptr, sizes, count, span, id_rank, has_record, active, k, m, top_k)

    # -- the hot notes' out-edges whose target is hot ---------------------------------------------
    norm_node = torch.full((n,), -1.0, dtype=_F64, device=device)  # -1: not hot
    norm_node.index_put_((hs,), hs_norm)
    lo = rowptr.index_select(0, hs)
    deg = rowptr.index_select(0, hs + 1) - lo
    total = int(deg.sum())
    if total == 0:
        return PlasticityPlan(
            empty, intensity[:0].clone(), confidence[:0].clone(), prob[:0].clone(), hot, updated
        )
    firsts = torch.cumsum(deg, 0) - deg
    edges = torch.repeat_interleave(lo - firsts, deg, output_size=total)
    edges += torch.arange(total, device=device)
    src_norm = torch.repeat_interleave(hs_norm, deg, output_size=total)
    to_norm = norm_node.index_select(0, dst.index_select(0, edges))
    keep = (to_norm >= 0).nonzero().squeeze(1)
    edges = edges.index_select(0, keep)
    norm = torch.minimum(src_norm.index_select(0, keep), to_norm.index_select(0, keep))
    edges, order = torch.sort(edges)
    norm = norm.index_select(0, order).clamp_(0.0, 1.0)

    # -- the update ------------------------------------------------------------------------------
    delta = _delta_tensor(norm)
    old_i = intensity.index_select(0, edges)
    new_i = (old_i + delta).clamp_(LINK_VALUE_MIN, LINK_VALUE_MAX)
    kind = edge_kind.index_select(0, edges)
    old_c = confidence.index_select(0, edges)
    new_c = torch.where(
        kind == LINK_SEM,
        (old_c.to(_F64) + delta).clamp_(LINK_VALUE_MIN, LINK_VALUE_MAX).to(torch.float32),
        old_c,
    )
    old_p = prob.index_select(0, edges)
    new_p = torch.where(
        kind == LINK_PROC, (old_p + delta).clamp_(LINK_VALUE_MIN, LINK_VALUE_MAX), old_p
    )
    changed = ((new_i != old_i) | (new_c != old_c) | (new_p != old_p)).nonzero().squeeze(1)
    return PlasticityPlan(
        edges.index_select(0, changed),
        new_i.index_select(0, changed),
        new_c.index_select(0, changed),
        new_p.index_select(0, changed),
        hot,
        updated,
    )


def _rank_padded(
    ptr: Tensor,
    sizes: Tensor,
    count: Tensor,
    span: Tensor,
    id_rank: Tensor,
    has_record: Tensor | None,
    active: Tensor | None,
    k: int,
    m: int,
    top_k: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Every agent's hot notes on padded ``(A, M)`` rows: ``(hot node indices (H,), their
    norm (H,), hot (A, top_k), updated (A,))``."""
    device = ptr.device
    a = int(ptr.numel()) - 1
    no_hot = torch.full((a, top_k), -1, dtype=_I64, device=device)
    # -- ranking on padded (A, M) rows ------------------------------------------------------
    ar = torch.arange(m, device=device)
    neg_f = torch.full((), -1.0, dtype=_F64, device=device)
    freq = count.to(_F64).div_(span.clamp(min=1))  # in float64, as the original's f64
    if bool((sizes == m).all()):  # every agent has M notes: the rows are views
        valid = None
        start = ptr[:-1].unsqueeze(1)
        f_all, c_row, r_row = freq.view(a, m), count.view(a, m), id_rank.view(a, m)
        ok = None if has_record is None else has_record.view(a, m)
    else:
        valid = ar.unsqueeze(0) < sizes.unsqueeze(1)
        start = ptr[:-1].unsqueeze(1)
        idx = torch.where(valid, start + ar, torch.zeros((), dtype=_I64, device=device))
        f_all, c_row = freq[idx], count[idx]
        # pad slots take the id ranks after the agent's own ids
        r_row = torch.where(valid, id_rank[idx], ar.expand(a, m))
        ok = valid if has_record is None else valid & has_record[idx]
    if active is not None:
        ok = active.unsqueeze(1).expand(a, m) if ok is None else ok & active.unsqueeze(1)
    f_row = f_all if ok is None else torch.where(ok, f_all, neg_f)
    top = _top_positions(f_row, c_row, r_row, k)  # (A, k) local positions, hottest first
    top_ok = torch.ones(a, k, dtype=torch.bool, device=device) if ok is None else ok.gather(1, top)
    top_f = f_row.gather(1, top)
    max_f = torch.where(top_ok, top_f, torch.zeros((), dtype=_F64, device=device)).amax(1)
    updated = (top_ok.sum(1) >= 2) & (max_f > EPSILON)
    top_ok &= updated.unsqueeze(1)
    hot_nodes = torch.where(top_ok, start + top, torch.full((), -1, dtype=_I64, device=device))
    hot = no_hot.clone()
    hot[:, :k] = hot_nodes

    sel = top_ok.view(-1).nonzero().squeeze(1)
    hs = hot_nodes.view(-1).index_select(0, sel)
    safe_max = torch.where(updated, max_f, torch.ones((), dtype=_F64, device=device))
    hs_norm = (top_f / safe_max.unsqueeze(1)).view(-1).index_select(0, sel)
    return hs, hs_norm, hot, updated


def _rank_sparse(
    ptr: Tensor,
    count: Tensor,
    span: Tensor,
    id_rank: Tensor,
    has_record: Tensor | None,
    active: Tensor | None,
    k: int,
    m: int,
    top_k: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
    """The same ranking from the retrieved notes only (``count > 0``), when every agent that
    retrieved anything retrieved at least ``k`` notes: then no never-retrieved note (f = 0)
    can be hot, and ranking the retrieved ones (a few per agent) by three stable sorts is
    cheaper than a pass over every agent's padded row. ``None`` when an agent has between 1
    and ``k − 1`` retrieved notes (its hot set is topped up with never-retrieved notes by id:
    the padded path), or when counts are too large for the packed tie key."""
    device = ptr.device
    a = int(ptr.numel()) - 1
    sel = count > 0
    if has_record is not None:
        sel &= has_record
    nodes = sel.nonzero().squeeze(1)  # ascending: grouped by agent
    owner = torch.searchsorted(ptr, nodes, right=True) - 1
    if active is not None:
        keep = active.index_select(0, owner)
        nodes, owner = nodes[keep], owner[keep]
    npos = torch.bincount(owner, minlength=a)
    if bool(((npos > 0) & (npos < k)).any()):
        return None
    c = count.index_select(0, nodes)
    if nodes.numel() and int(c.max()) >= _SECONDARY_COUNT_LIMIT:
        return None
    f = c.to(_F64).div_(span.index_select(0, nodes).clamp(min=1))
    packed = (c * m).add_(m - 1).sub_(id_rank.index_select(0, nodes))
    order = torch.sort(packed, descending=True).indices  # count desc, id asc (unique per agent)
    order = order.index_select(
        0, torch.sort(f.index_select(0, order), descending=True, stable=True).indices
    )
    order = order.index_select(0, torch.sort(owner.index_select(0, order), stable=True).indices)
    nodes, owner, f = nodes[order], owner[order], f[order]
    first = torch.cumsum(npos, 0) - npos
    slot = torch.arange(nodes.numel(), device=device) - first.index_select(0, owner)
    top = slot < k
    nodes, owner, f, slot = nodes[top], owner[top], f[top], slot[top]
    max_f = torch.zeros(a, dtype=_F64, device=device)
    max_f[owner[slot == 0]] = f[slot == 0]
    updated = (npos >= 2) & (max_f > EPSILON)
    live = updated.index_select(0, owner)
    nodes, owner, f, slot = nodes[live], owner[live], f[live], slot[live]
    hot = torch.full((a, top_k), -1, dtype=_I64, device=device)
    hot[owner, slot] = nodes
    return nodes, f / max_f.index_select(0, owner), hot, updated


_SECONDARY_COUNT_LIMIT = 1 << 40
"""Counts below this (and rows of fewer than 2^20 notes) let ties be broken by one packed
int64 key ``count · M + (M − 1 − id rank)``; larger counts take the exact sort path."""


def _top_positions(f_row: Tensor, c_row: Tensor, r_row: Tensor, k: int) -> Tensor:
    """Per row, the positions of the ``k`` best entries by (f desc, count desc, id rank asc),
    best first. ``f_row`` (A, M) float64 (excluded entries: −1), ``c_row`` (A, M) int64,
    ``r_row`` (A, M) int64: a permutation of 0..M−1 per row.

    Two ``topk`` calls and a threshold instead of full row sorts: the ``k``-th largest ``f`` is
    the threshold τ; entries above it are in, and the entries equal to it compete by the packed
    key ``count · M + (M − 1 − rank)`` (unique per row). Only the ``k`` chosen entries are then
    ordered (three stable sorts of ``(A, k)``).
    """
    a, m = f_row.shape
    if int(c_row.max()) >= _SECONDARY_COUNT_LIMIT or m >= (1 << 20):
        # exact path: columns in id order, stable sorts by count then f
        ar = torch.arange(m, device=f_row.device).expand(a, m).contiguous()
        by_id = torch.empty_like(r_row).scatter_(1, r_row, ar)
        c_id = c_row.gather(1, by_id)
        _, o1 = torch.sort(c_id, dim=1, descending=True, stable=True)
        _, o2 = torch.sort(
            f_row.gather(1, by_id).gather(1, o1), dim=1, descending=True, stable=True
        )
        return by_id.gather(1, o1.gather(1, o2[:, :k]))
    best = torch.topk(f_row, k, dim=1, sorted=False)
    tau = best.values.amin(1, keepdim=True)
    at_least = f_row >= tau
    if int(at_least.sum()) == a * k:  # no row has more candidates than slots: no tie to break
        cols = best.indices
    else:
        # fewer than k entries lie above tau: they all get the top key, the ties compete by
        # the packed (count desc, id asc) key, the rest are out
        packed = (c_row * m).add_(m - 1).sub_(r_row)  # counts are >= 0; unique per row
        key = torch.where(at_least, packed, torch.full((), -1, dtype=_I64, device=f_row.device))
        key.masked_fill_(f_row > tau, _SECONDARY_COUNT_LIMIT << 20)
        cols = torch.topk(key, k, dim=1, sorted=False).indices
    # order the chosen k: count desc then id asc (one packed key), then f desc (stable)
    packed_k = (c_row.gather(1, cols) * m).add_(m - 1).sub_(r_row.gather(1, cols))
    order = torch.sort(packed_k, dim=1, descending=True).indices
    cols = cols.gather(1, order)
    order = torch.sort(f_row.gather(1, cols), dim=1, descending=True, stable=True).indices
    return cols.gather(1, order)


def plasticity_reference(
    notes: Sequence[Any],
    records: Mapping[Any, Any],
    top_k: int = DEFAULT_TOP_K,
) -> dict[Any, tuple[float, float | None, float | None]]:
    """The per-link Python loop the kernel is checked against (and benchmarked beside).

    Args:
        notes: the memory's notes (their ``mem_links`` are read, not changed).
        records: id → ``Record``.
        top_k: hot notes.

    Returns:
        ``{link_id: (new intensity, new confidence or None, new prob or None)}`` for every link
        whose values change.
    """
    present = {note.id: note for note in notes}
    hot = hot_notes(records, top_k, among=present)
    if len(hot) < 2:
        return {}
    freq = {mid: f for mid, _, f in hot}
    max_f = max(freq.values())
    if max_f <= EPSILON:
        return {}
    out: dict[Any, tuple[float, float | None, float | None]] = {}
    for mid, _, _ in hot:
        for link in present[mid].mem_links:
            if link.to not in freq:
                continue
            norm = min(max(min(freq[mid], freq[link.to]) / max_f, 0.0), 1.0)
            delta = plasticity_delta(norm)
            new_i = min(max(link.intensity + delta, LINK_VALUE_MIN), LINK_VALUE_MAX)
            lt = link.link_type
            conf = getattr(lt, "confidence", None)
            p = getattr(lt, "prob", None)
            new_c = conf
            if conf is not None:
                # the float32 value widened to float64, as the original's ``as f64``
                wide = to_float32(conf)
                new_c = f32_round(min(max(wide + delta, LINK_VALUE_MIN), LINK_VALUE_MAX))
            new_p = p if p is None else min(max(p + delta, LINK_VALUE_MIN), LINK_VALUE_MAX)
            if (
                new_i != link.intensity
                or (conf is not None and new_c != f32_round(conf))
                or new_p != p
            ):
                out[link.id] = (new_i, new_c, new_p)
    return out
