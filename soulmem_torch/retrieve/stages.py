"""The default pipeline, written once, as stages over per-query candidate rows ``(B, M)``.

Every stage works on rows: query ``b``'s candidate notes, ``M`` wide, with an optional
validity mask (``None``: every entry is a note). Where the rows come from, and how the kernels
that depend on the graph run, is a :class:`PipelineBackend`'s business:

* one memory (``retrieve/pipeline.py``, ``GraphBackend``): a batch of queries against one
  ``MemoryGraph``, the rows its ``N`` notes (no mask);
* the disjoint union of many agents (``bank/_pipeline.py``, ``UnionBackend``): query ``b``'s
  agent's notes, padded to the largest agent of the batch, ``valid`` marking the real ones.

:func:`run_stages` is the order (docs/spec.md §7): the short-term window → similarity (the
backend) → seeds (the relative cut for ``fusion="rank"``, threshold + top-k for ``"max"``)
→ association (the backend: PPR on its operator, and the undirected one) and its top-k →
BayesAction from the recalled situations (the backend) → the memory list: reciprocal-rank
fusion of ``config.channels`` (seeds / similarity, whole-note text, time, graph, graph both
ways) or the original's max merge → ``DefaultPipelineResult``'s, every list of the batch in
one host transfer. A new channel is one more ``(B, M)`` tensor from the backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Protocol

import torch
from torch import Tensor

from soulmem_torch._gcpause import gc_paused
from soulmem_torch.errors import ValidationError
from soulmem_torch.functional.fusion import (
    family_weights,
    mix_row_pairs,
    ppr_start,
    rank_fusion,
    relative_seeds,
    score_dispersion,
)
from soulmem_torch.functional.topk import stable_topk
from soulmem_torch.model import MemoryId
from soulmem_torch.retrieve.config import (
    AssociateWithActionConfig,
    AssociationConfig,
    DefaultPipelineConfig,
)
from soulmem_torch.retrieve.priority import mix_by_priority_batch
from soulmem_torch.retrieve.short_only import RetrShortOnly
from soulmem_torch.retrieve.similarity import threshold_mask

__all__ = [
    "DefaultPipelineResult",
    "PipelineBackend",
    "channel_weights",
    "question_results",
    "result_lists",
    "row_topk",
    "run_stages",
    "short_windows",
]

_F64 = torch.float64


@dataclass
class DefaultPipelineResult:
    """``association``: the memories, best first, ≤ ``merge_top_k`` — with ``fusion="rank"`` (the
    default) scored by reciprocal-rank fusion (float64, in ``(0, C / (k + 1)]`` for C channels),
    with ``fusion="max"`` the original's merge of seeds and PPR memories (max per id);
    ``action``: recommended actions; ``short_history`` / ``short_mem``: the short-term window and
    its summary; ``priority``: passed through; ``seeds``: the similarity notes that seeded PPR
    (float32 scores)."""

    association: list[tuple[MemoryId, float]]
    action: list[tuple[MemoryId, float]]
    short_history: list[Any]
    short_mem: str
    priority: int
    seeds: list[tuple[MemoryId, float]] = field(default_factory=list)


class PipelineBackend(Protocol):
    """Where :func:`run_stages`' rows come from: the graph-dependent kernels of one batch.

    ``valid``: (B, M) bool, or ``None`` when every entry of every row is a note.
    ``ids`` / ``index``: the candidates' ``MemoryId`` — ``ids[index[b, j]]`` (``index``
    ``None``: ``ids[j]``); ``queries``: the B queries.
    """

    valid: Tensor | None
    ids: Sequence[Any]
    index: Tensor | None
    queries: Sequence[Any]

    def similarity(self, weights: Any) -> Tensor:
        """(B, M) float32 fused similarity of every query against its candidates."""
        ...

    def text(self) -> Tensor | None:
        """(B, M) float64 whole-note BM25, or ``None`` (no note of the batch has a text)."""
        ...

    def time(self) -> Tensor | None:
        """(B, M) float64 time channel, or ``None`` (the questions carry no time)."""
        ...

    def association(
        self, weights: Tensor, keys: Tensor, config: AssociationConfig, *, undirected: bool
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """PPR from (B, M) ``weights`` / ``keys``: ``(scores (B, M) float64, ok (B,) bool,
        undirected scores (B, M) float64 or None)``."""
        ...

    def actions(
        self,
        seed_weights: Tensor,
        seeds: Tensor,
        ppr: Tensor,
        selected: Tensor,
        ok: Tensor,
        config: AssociateWithActionConfig,
        *,
        rank: bool,
    ) -> tuple[Tensor, Tensor]:
        """BayesAction from the situations among the seeds and the PPR top-k: ``(scores
        (B, M) float64, candidates (B, M) bool)``."""
        ...

    def evidence(self) -> Tensor | None:
        """For the questions' first rows (``0::2``): (B / 2, M) bool, which candidates have
        evidence for the question (``retrieve.evidence.candidate_evidence``); ``None`` when
        a memory asked has no text index (the lists are then filtered by
        ``evidence.keep_matching``)."""
        ...


def row_topk(scores: Tensor, mask: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Stable top-k per row (ties keep candidate order): ``(selected (B, M) bool, values,
    index, valid)`` (:func:`~soulmem_torch.functional.topk.stable_topk`)."""
    values, index, valid = stable_topk(scores, int(k), mask=mask)
    selected = torch.zeros(mask.shape, dtype=torch.bool, device=mask.device)
    selected.scatter_(1, index, valid)
    return selected, values, index, valid


def short_windows(config: Any, memories: Sequence[Any]) -> list[tuple[list[Any], str]]:
    """Stage 0: the short-term window of each query's memory (``None``: no memory → empty),
    once per memory, not per query."""
    windows: dict[int, Any] = {}
    for mem in memories:
        if mem is not None and id(mem) not in windows:
            windows[id(mem)] = RetrShortOnly().retrieve(config.into_request(mem))
    return [windows[id(mem)] if mem is not None else ([], "") for mem in memories]


def channel_weights(
    config: DefaultPipelineConfig,
    similarity: Tensor,
    text: Tensor | None,
    mask: Tensor | None = None,
) -> list[Tensor | None] | None:
    """The rank fusion's per-query weight of each of ``config.channels`` (``None``: equal).

    ``channel_weights="family"``: channels that derive from one signal share one vote —
    ``similarity`` and ``seeds``, ``graph`` and ``graph_undirected`` — each ``1 / (members
    present)``; the others 1.

    With ``channel_weights="dispersion"`` the channels form two evidence families — the text
    channel, and the structured similarity with everything seeded by it (``similarity``,
    ``seeds``, ``graph``, ``graph_undirected``) — each weighted by
    :func:`~soulmem_torch.functional.fusion.score_dispersion` of its scores (``similarity``:
    the kept (B, N) similarity; ``text``: the BM25 scores) over the larger of the two.
    """
    if config.channel_weights == "family":
        families = {"similarity": "s", "seeds": "s", "graph": "g", "graph_undirected": "g"}
        keys = [families.get(c, c) for c in config.channels]
        b = similarity.shape[0]
        return [
            torch.full((b,), 1.0 / keys.count(key), dtype=torch.float64, device=similarity.device)
            for key in keys
        ]
    if config.channel_weights == "equal" or text is None or "text" not in config.channels:
        return None
    w_sim, w_text = family_weights(
        [score_dispersion(similarity, mask), score_dispersion(text, mask)]
    )
    return [w_text if c == "text" else w_sim for c in config.channels]


def result_lists(
    ids: Sequence[Any], index: Tensor | None, *blocks: tuple[Tensor, Tensor, Tensor]
) -> tuple[list[tuple[Any, float]], list[int]]:
    """The ``(id, score)`` entries of several stable top-k's, each block ``(values, index,
    valid)`` of shape ``(B, k_i)``: one flat list — row by row, within a row block by block, each
    block's valid entries in order — and the end of every (row, block) run in it (``B ×
    len(blocks)`` ends, row-major), so a row's list of a block is one slice of it.

    ``ids``: every note's id; ``index``: the candidate rows (candidate → position in ``ids``),
    or ``None`` when a candidate's column is its position. One gather, one boolean mask and one
    ``tolist`` per tensor for the whole batch. Scores become Python floats through float64,
    exact for float32 values (the same floats as their own ``tolist``)."""
    values = torch.cat([v.to(_F64) for v, _, _ in blocks], dim=1)
    at = torch.cat([i for _, i, _ in blocks], dim=1)
    if index is not None:
        at = index.gather(1, at)
    ok = torch.cat([k for _, _, k in blocks], dim=1)
    ends = torch.stack([k.sum(dim=1) for _, _, k in blocks], dim=1).reshape(-1).cumsum(0)
    nodes = at[ok].tolist()
    if len(nodes) > 1:
        found = itemgetter(*nodes)(ids)
    else:
        found = [ids[n] for n in nodes]
    return list(zip(found, values[ok].tolist())), ends.tolist()


def run_stages(
    backend: PipelineBackend,
    config: DefaultPipelineConfig,
    *,
    memories: Sequence[Any],
    priorities: Sequence[int],
    weights: Any,
    questions: Sequence[bool] | None = None,
) -> list[DefaultPipelineResult]:
    """ShortOnly → Similarity → AssociateWithAction → fusion for the B queries of ``backend``.

    Args:
        backend: the batch's rows and graph kernels (:class:`PipelineBackend`).
        config: ``DefaultPipelineConfig`` — every field is read here or by the backend.
        memories: each query's ``WorkingMemory`` (``None``: none), for the short-term window.
        priorities: passed through, one per query.
        weights: the effective ``BlendWeights`` of the similarity.
        questions: ``None``: one result per query. Else the queries are free-text questions'
            pairs (``text_queries``: rows ``2i`` and ``2i + 1``, question ``i``'s concept and
            episode queries) and the result is one answer per question, as
            ``question_results`` mixes them; ``questions[i]``: whether question ``i``'s
            results without evidence are left out (``ask``'s ``only_matching``; a question
            whose query has no ``WorkingMemory`` is never filtered).
    """
    valid = backend.valid
    rank = config.fusion == "rank"
    sim_cfg = config.similarity
    short = short_windows(config.short_mem_with_history, memories)

    # stage 1: similarity on the rows
    sim = backend.similarity(weights)  # (B, M) float32
    nb, m = sim.shape
    keep = threshold_mask(sim, sim_cfg.similarity_threshold)
    if valid is not None:
        keep = keep & valid
    sim_kept = torch.where(keep, sim, torch.zeros_like(sim))

    # stage 2: seeds (the relative cut of the rank fusion, or top-k)
    text = backend.text() if rank and "text" in config.channels else None
    if rank:
        first_stage = sim_kept
        fused_seeds = config.seed_source == "fused" and text is not None
        if fused_seeds:
            first_stage = rank_fusion([sim_kept, text], k=config.rank_constant, mask=valid)
        chosen = relative_seeds(
            first_stage,
            ratio=config.seed_ratio,
            max_seeds=sim_cfg.max_results,
            threshold=0.0 if fused_seeds else sim_cfg.similarity_threshold,
            mask=valid,
        )
        seed_w = torch.where(chosen, first_stage.to(_F64), 0.0)
        source = ppr_start(config.personalization, chosen, seed_w, first_stage, text, mask=valid)
    else:
        chosen = row_topk(sim, keep, sim_cfg.max_results)[0]
        seed_w = torch.where(chosen, sim.to(_F64), 0.0)
        source = (seed_w, chosen)
    _, s_values, s_index, s_valid = row_topk(sim, chosen, sim_cfg.max_results)

    # stage 3: association (PPR) and its top-k
    awa = config.assoc_with_action
    undirected = rank and "graph_undirected" in config.channels
    ppr, ok, ppr_both = backend.association(*source, awa.association, undirected=undirected)
    present = ok.unsqueeze(1).expand(nb, m)
    if valid is not None:
        present = present & valid
    ppr_selected = row_topk(ppr, present, awa.association.top_k)[0]

    # stage 4: BayesAction from the recalled situations
    act_scores, act_cand = backend.actions(seed_w, chosen, ppr, ppr_selected, ok, awa, rank=rank)
    _, a_values, a_index, a_valid = row_topk(act_scores, act_cand, awa.action_top_k)

    # stage 5: one memory list — reciprocal-rank fusion of the channels, or the max merge
    if rank:
        channels: dict[str, Tensor] = {
            "similarity": sim_kept,
            "seeds": torch.where(chosen, sim_kept, torch.zeros_like(sim_kept)),
            "graph": ppr,
        }
        if text is not None:
            channels["text"] = text
        if "time" in config.channels:
            when = backend.time()
            if when is not None:
                channels["time"] = when
        if ppr_both is not None:
            channels["graph_undirected"] = ppr_both
        names = [c for c in config.channels if c in channels]
        used = [channels[c] for c in names]
        if used:
            fusing = config
            if len(names) != len(config.channels):
                fusing = config.model_copy(update={"channels": tuple(names)})
            fused = rank_fusion(
                used,
                k=config.rank_constant,
                mask=valid,
                weights=channel_weights(fusing, sim_kept, channels.get("text"), valid),
            )
            # a note is in the list when some channel scored it (finite, > 0)
            listed = torch.zeros_like(fused, dtype=torch.bool)
            for c in used:
                listed |= torch.isfinite(c) & (c > 0)
            if valid is not None:
                listed &= valid
        else:  # only the text channel, and no note of the batch has a text
            fused = torch.zeros(nb, m, dtype=_F64, device=sim.device)
            listed = torch.zeros(nb, m, dtype=torch.bool, device=sim.device)
        _, m_values, m_index, m_valid = row_topk(fused, listed, config.merge_top_k)
    else:
        neg_inf = torch.full_like(ppr, float("-inf"))
        merged = torch.maximum(
            torch.where(chosen, seed_w, neg_inf), torch.where(ppr_selected, ppr, neg_inf)
        )
        _, m_values, m_index, m_valid = row_topk(merged, chosen | ppr_selected, config.merge_top_k)

    blocks = [
        (s_values.to(torch.float32), s_index, s_valid),  # seeds keep float32 scores
        (a_values, a_index, a_valid),
        (m_values, m_index, m_valid),
    ]
    if questions is not None:
        return _question_lists(backend, config, blocks, short, questions, memories)
    return _lists(backend.ids, backend.index, blocks, short, priorities)


def _lists(
    ids: Sequence[Any],
    index: Tensor | None,
    blocks: Sequence[tuple[Tensor, Tensor, Tensor]],
    short: Sequence[tuple[list[Any], str]],
    priorities: Sequence[int],
) -> list[DefaultPipelineResult]:
    """One result per row of the (seeds, actions, memories) ``blocks``: slices of one flat list
    of (id, score) pairs."""
    with gc_paused():  # B·k fresh tuples, none cyclic (see soulmem_torch._gcpause)
        if all(int(i.shape[1]) == 0 for _, i, _ in blocks):  # no candidates (M = 0)
            empty: list[tuple[Any, float]] = []
            pairs, ends = empty, [0] * (3 * int(blocks[0][1].shape[0]))
        else:
            pairs, ends = result_lists(ids, index, *blocks)
        starts = [0, *ends[2::3]]
        return [
            DefaultPipelineResult(
                association=pairs[c:d],
                action=pairs[b:c],
                short_history=list(history),
                short_mem=summary,
                priority=priority,
                seeds=pairs[a:b],
            )
            for a, b, c, d, (history, summary), priority in zip(
                starts, ends[0::3], ends[1::3], ends[2::3], short, priorities
            )
        ]


def _question_lists(
    backend: PipelineBackend,
    config: DefaultPipelineConfig,
    blocks: Sequence[tuple[Tensor, Tensor, Tensor]],
    short: Sequence[tuple[list[Any], str]],
    questions: Sequence[bool],
    memories: Sequence[Any],
) -> list[DefaultPipelineResult]:
    """One answer per question (rows ``2i``, ``2i + 1``): each kind of list mixed on the
    tensors (:func:`~soulmem_torch.functional.fusion.mix_row_pairs`, memories cut to
    ``merge_top_k``), the flagged questions' rows without evidence masked out
    (``backend.evidence``), then one host transfer. The same lists, bit for bit, as
    ``question_results`` and ``evidence.filter_result`` of the rows' own lists (which run
    instead when a score is NaN, and the filter when the backend has no text index)."""
    from soulmem_torch.retrieve.evidence import filter_result

    nq = len(questions)
    nb = int(blocks[0][1].shape[0])
    if nb != 2 * nq:
        raise ValidationError(
            f"questions: expected {nb // 2} flags (one per pair of rows), found {nq}"
        )
    flagged = [i for i, f in enumerate(questions) if f and memories[2 * i] is not None]
    cuts = (None, None, config.merge_top_k)
    mixed = [mix_row_pairs(v, i, k, top_k=cut) for (v, i, k), cut in zip(blocks, cuts)]
    index = None if backend.index is None else backend.index[0::2]
    python_filter = flagged
    if all(block is not None for block in mixed):
        if flagged:
            found = backend.evidence()
            if found is not None:
                python_filter = []
                rows = torch.tensor(flagged, dtype=torch.int64, device=found.device)
                mask = found.index_select(0, rows)
                for _, at, ok in mixed:  # type: ignore[misc]
                    ok[rows] &= mask.gather(1, at.index_select(0, rows))
        out = _lists(backend.ids, index, mixed, short[0::2], [0] * nq)  # type: ignore[arg-type]
    else:  # a NaN score: the lists' own mix
        rows_out = _lists(backend.ids, backend.index, blocks, short, [0] * nb)
        out = question_results(rows_out, config.merge_top_k)
    for i in python_filter:
        out[i] = filter_result(memories[2 * i].cluster, backend.queries[2 * i], out[i])
    return out


def question_results(
    results: Sequence[DefaultPipelineResult], merge_top_k: int
) -> list[DefaultPipelineResult]:
    """One answer per question from the pipeline's answers to its (concept, episode) queries,
    laid out as ``text_queries`` made them (``results[2i]``, ``results[2i + 1]``): memories,
    actions and seeds mixed max per note (equal priorities), memories cut to ``merge_top_k``;
    the short-term window is the first query's. All questions' mixes are one batch."""
    if len(results) % 2:
        raise ValidationError(
            f"results: expected a (concept, episode) pair per question, found {len(results)}"
        )
    pairs = list(zip(results[0::2], results[1::2]))
    q = len(pairs)
    mixed = mix_by_priority_batch(  # the three mixes of every question in one batch
        [[a.association, b.association] for a, b in pairs]
        + [[a.action, b.action] for a, b in pairs]
        + [[a.seeds, b.seeds] for a, b in pairs],
        [0, 0],
    )
    return [
        DefaultPipelineResult(
            association=mixed[i][:merge_top_k],
            action=mixed[q + i],
            short_history=a.short_history,
            short_mem=a.short_mem,
            priority=0,
            seeds=mixed[2 * q + i],
        )
        for i, (a, _) in enumerate(pairs)
    ]
