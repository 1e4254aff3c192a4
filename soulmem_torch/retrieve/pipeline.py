"""``DefaultPipeline``: ShortOnly → Similarity → AssociateWithAction → fusion (docs/spec.md §7)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from soulmem_torch.functional.fusion import (
    family_weights,
    ppr_start,
    rank_fusion,
    relative_seeds,
    score_dispersion,
)
from soulmem_torch.model import MemoryId
from soulmem_torch.retrieve.assoc_with_action import associate_with_action
from soulmem_torch.retrieve.batches import run_grouped
from soulmem_torch.retrieve.columns import topk_lists, topk_mask
from soulmem_torch.retrieve.config import AssociationConfig, DefaultPipelineConfig
from soulmem_torch.retrieve.operators import undirected_transition
from soulmem_torch.retrieve.propagation import power_ppr
from soulmem_torch.retrieve.requests import DefaultPipelineRequest
from soulmem_torch.retrieve.short_only import RetrShortOnly
from soulmem_torch.retrieve.similarity import (
    effective_weights,
    similarity_scores,
    threshold_mask,
)
from soulmem_torch.retrieve.text import query_strings, text_scores
from soulmem_torch.retrieve.when import time_scores

__all__ = [
    "DefaultPipelineRequest",
    "channel_weights",
    "DefaultPipelineResult",
    "RetrDefaultPipeline",
    "undirected_association",
]

if TYPE_CHECKING:
    from soulmem_torch.graph import MemoryGraph


def undirected_association(
    graph: MemoryGraph, weights: Tensor, keys: Tensor, config: AssociationConfig
) -> Tensor:
    """PPR of every column on :func:`undirected_transition`: the ``graph_undirected`` channel.

    Always the ``power`` method (:func:`~soulmem_torch.retrieve.propagation.power_ppr`: the exact dense solve up to
    ``power_dense_max_nodes`` notes, else the batched power iteration with ``config``'s damping,
    ``power_tol``, ``power_dtype``, ``power_local``; its ``method`` is for the original's
    directed association). Columns with
    no key or a zero weight sum stay zero.

    Args:
        weights: (N, B) float64 personalization (the seeds' structured scores).
        keys: (N, B) bool, the seeds.

    Returns:
        (N, B) float64.
    """
    n, b = weights.shape
    out = torch.zeros(n, b, dtype=torch.float64, device=weights.device)
    ok = keys.any(dim=0) & (weights.sum(dim=0) > 0)
    if n == 0 or not bool(ok.any()):
        return out
    every = bool(ok.all())
    cols = ok.nonzero().reshape(-1)
    p, k = (weights, keys) if every else (weights[:, cols], keys[:, cols])
    res = power_ppr(undirected_transition(graph, config), p, k, config)
    if every:
        return res
    out[:, cols] = res
    return out


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


class RetrDefaultPipeline:
    """``RetrDefaultPipeline().retrieve(request) -> DefaultPipelineResult``.

    Strictly in order: ShortOnly; Similarity (its float32 scores become the personalization);
    AssociateWithAction; then the fusion (``DefaultPipelineConfig.fusion``):

    * ``"rank"`` (default): seeds are the notes scoring at least ``seed_ratio`` × the query's
      best structured score (≥ ``similarity_threshold``, at most ``max_results``); the memory
      list is the reciprocal-rank fusion (``rank_constant``) of ``config.channels``
      (:mod:`soulmem_torch.functional.fusion`) — by default the seeds' structured scores, the
      whole-note BM25 text channel (:mod:`soulmem_torch.retrieve.text`), the PPR scores of
      every note and the PPR on the links taken both ways (:func:`undirected_association`);
      notes no channel scored are left out.
    * ``"max"`` (the original): the top ``max_results`` similarity seeds and the PPR top-k merged
      as float64, max per id, sorted descending.

    Either way cut to ``merge_top_k`` (10). ``retrieve_batch`` runs every step once for all
    requests that share a memory, device, config and embedder (no per-query loop but turning
    indices back into ids).
    """

    def retrieve(self, request: DefaultPipelineRequest) -> DefaultPipelineResult:
        """One request through the default pipeline: a ``DefaultPipelineResult``
        (``association``, ``action``, ``short_history``, ``short_mem``, ``priority``). A batch
        of one through :meth:`retrieve_batch` (the same code path)."""
        return self.retrieve_batch([request])[0]

    def retrieve_batch(
        self, requests: Sequence[DefaultPipelineRequest]
    ) -> list[DefaultPipelineResult]:
        """Many requests at once: each stage runs once for all requests that share a memory,
        device and config; one result per request, in request order."""
        resolved = [(r, r.graph()) for r in requests]

        def key(rg: tuple[DefaultPipelineRequest, Any]) -> Any:
            r, g = rg
            return (
                id(g),
                r.config,
                id(r.embedder),
                r.weights,
                isinstance(r.query, (str, torch.Tensor)),
            )

        return run_grouped(resolved, key=key, run=self._run)

    @staticmethod
    def _run(group: list[tuple[DefaultPipelineRequest, Any]]) -> list[DefaultPipelineResult]:
        first, graph = group[0]
        config = first.config
        windows: dict[int, Any] = {}  # the short-term window once per memory, not per query
        for r, _ in group:
            if id(r.working_memory) not in windows:
                req = config.short_mem_with_history.into_request(r.working_memory)
                windows[id(r.working_memory)] = RetrShortOnly().retrieve(req)
        short = [windows[id(r.working_memory)] for r, _ in group]
        queries = [r.query for r, _ in group]
        sim = similarity_scores(
            graph,
            first.working_memory,
            queries,
            embedder=first.embedder,
            weights=effective_weights(first.weights, config.similarity),
        )  # (B, N) float32
        sim_cfg = config.similarity
        keep = threshold_mask(sim, sim_cfg.similarity_threshold)
        text = None
        if config.fusion == "rank":
            first_stage = torch.where(keep, sim, torch.zeros_like(sim))
            if "text" in config.channels:
                text = text_scores(graph, first.working_memory, queries)
            if text is not None and config.seed_source == "fused":
                first_stage = rank_fusion([first_stage, text], k=config.rank_constant)

            chosen = relative_seeds(
                first_stage,
                ratio=config.seed_ratio,
                max_seeds=sim_cfg.max_results,
                threshold=sim_cfg.similarity_threshold
                if config.seed_source == "similarity" or text is None
                else 0.0,
            ).T.contiguous()  # (N, B)
            weights = torch.where(chosen, first_stage.T.to(torch.float64), 0.0)
            start_w, start = ppr_start(
                config.personalization, chosen.T, weights.T, first_stage, text
            )
            source = (start_w.T.contiguous(), start.T.contiguous())
        else:
            chosen = topk_mask(sim.T.contiguous(), keep.T.contiguous(), sim_cfg.max_results)
        scores_t = sim.T.contiguous()
        seeds = topk_lists(graph, scores_t, chosen, sim_cfg.max_results, as_float32=True)
        if config.fusion != "rank":
            weights = torch.where(chosen, scores_t.to(torch.float64), 0.0)
        _, actions, ppr, ppr_selected = associate_with_action(
            graph,
            weights,
            chosen,
            config.assoc_with_action,
            memory_lists=False,
            personalization=source if config.fusion == "rank" else None,
        )
        if config.fusion == "rank":
            sim_kept = torch.where(keep, sim, torch.zeros_like(sim))
            channels = {
                "similarity": sim_kept,
                "seeds": torch.where(chosen.T, sim_kept, torch.zeros_like(sim_kept)),
                "graph": ppr.T,
            }
            if text is not None:
                channels["text"] = text
            if "time" in config.channels:
                channels["time"] = time_scores(
                    graph.create_time_ns,
                    [" ".join(query_strings(r.query)) for r, _ in group],
                    [r.now for r, _ in group],
                )
            if "graph_undirected" in config.channels:
                channels["graph_undirected"] = undirected_association(
                    graph, *source, config.assoc_with_action.association
                ).T
            used = [channels[c] for c in config.channels]
            weights = channel_weights(config, sim_kept, channels.get("text"))
            fused = rank_fusion(used, k=config.rank_constant, weights=weights)
            present = torch.zeros_like(fused, dtype=torch.bool)
            for c in used:
                present |= torch.isfinite(c) & (c > 0)
            association = topk_lists(
                graph, fused.T.contiguous(), present.T.contiguous(), config.merge_top_k
            )
        else:
            neg_inf = torch.full_like(ppr, float("-inf"))
            merged = torch.maximum(
                torch.where(chosen, weights, neg_inf), torch.where(ppr_selected, ppr, neg_inf)
            )
            association = topk_lists(graph, merged, chosen | ppr_selected, config.merge_top_k)
        return [
            DefaultPipelineResult(
                association=association[j],
                action=actions[j],
                short_history=list(short[j][0]),
                short_mem=short[j][1],
                priority=r.priority,
                seeds=seeds[j],
            )
            for j, (r, _) in enumerate(group)
        ]
