"""``DefaultPipeline``: ShortOnly → Similarity → AssociateWithAction → fusion (docs/spec.md §7).

The stages are :func:`soulmem_torch.retrieve.stages.run_stages`, written once for one memory
and for a bank's union; this module is the one-memory backend (:class:`GraphBackend`: the
rows of a batch are one ``MemoryGraph``'s notes) and the original's strategy class.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from soulmem_torch.errors import ValidationError
from soulmem_torch.retrieve.assoc_with_action import situation_weights
from soulmem_torch.retrieve.batches import run_grouped
from soulmem_torch.retrieve.bayes_action import bayes_action_columns
from soulmem_torch.retrieve.config import (
    AssociateWithActionConfig,
    AssociationConfig,
)
from soulmem_torch.retrieve.operators import undirected_transition
from soulmem_torch.retrieve.propagation import power_ppr, run_association
from soulmem_torch.retrieve.requests import DefaultPipelineRequest
from soulmem_torch.retrieve.similarity import effective_weights, similarity_scores
from soulmem_torch.retrieve.stages import DefaultPipelineResult, channel_weights, run_stages
from soulmem_torch.retrieve.text import query_strings, text_index
from soulmem_torch.retrieve.when import time_scores

__all__ = [
    "DefaultPipelineRequest",
    "DefaultPipelineResult",
    "GraphBackend",
    "RetrDefaultPipeline",
    "channel_weights",
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


class GraphBackend:
    """The one-memory backend of :func:`~soulmem_torch.retrieve.stages.run_stages`: B queries
    against one ``MemoryGraph``, the rows its N notes (no validity mask).

    The graph's kernels run in the retrieve layer's ``(N, B)`` column layout (the same
    operators and tensors as ``RetrAssociateWithAction``); the stages see their rows.
    """

    def __init__(
        self,
        graph: Any,
        memory: Any,
        queries: Sequence[Any],
        *,
        embedder: Any = None,
        nows: Sequence[Any] | None = None,
        rank: bool = True,
    ) -> None:
        self.graph = graph
        self.memory = memory
        self.queries = list(queries)
        self.embedder = embedder
        self.nows = list(nows) if nows is not None else [None] * len(self.queries)
        self.valid = None
        self.ids = graph.ids
        self.index = None
        self.rank = rank
        self._text_terms: Any = None  # the text channel's terms, kept for the evidence

    def similarity(self, weights: Any) -> Tensor:
        return similarity_scores(
            self.graph, self.memory, self.queries, embedder=self.embedder, weights=weights
        )

    def text(self) -> Tensor | None:
        """Whole-note BM25 of every query (:func:`~soulmem_torch.retrieve.text.text_scores`'
        bits, by the candidate kernel over the one memory), its terms kept for the evidence."""
        n = int(self.graph.num_nodes)
        self._text_terms = self._query_terms()
        if self._text_terms is None:
            return torch.zeros(len(self.queries), n, dtype=torch.float64, device=self.graph.device)
        return self._text_terms.bm25(n)

    def _query_terms(self) -> Any:
        """The queries' terms over the graph's text index
        (:func:`~soulmem_torch.retrieve.text.candidate_query_terms`); ``None`` without one."""
        from soulmem_torch.retrieve.text import candidate_query_terms

        graph = self.graph
        index = text_index(graph, self.memory)
        if index is None:
            return None
        b = len(self.queries)
        return candidate_query_terms(
            {0: index}, [0] * b, self.queries, int(graph.num_nodes), device=graph.device,
            cache=graph.cache,
        )  # fmt: skip

    def time(self) -> Tensor | None:
        texts = [" ".join(query_strings(q)) for q in self.queries]
        return time_scores(self.graph.create_time_ns, texts, self.nows)

    def association(
        self, weights: Tensor, keys: Tensor, config: AssociationConfig, *, undirected: bool
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        if self.rank:  # the PPR start as contiguous columns
            weights, keys = weights.T.contiguous(), keys.T.contiguous()
        else:  # the seeds themselves, as the columns of the rows
            weights, keys = weights.T, keys.T
        scores, ok = run_association(self.graph, weights, keys, config)
        both = None
        if undirected:
            both = undirected_association(self.graph, weights, keys, config).T
        return scores.T, ok, both

    def evidence(self) -> Tensor | None:
        """Which notes have evidence for each question (rows ``0::2``): the text channel's
        terms (kept from :meth:`text`, or looked up now) over the graph's text index, and its
        links (:func:`~soulmem_torch.retrieve.evidence.candidate_evidence`)."""
        from soulmem_torch.retrieve.evidence import candidate_evidence

        graph = self.graph
        terms = self._text_terms if self._text_terms is not None else self._query_terms()
        if terms is None:
            return None
        n = int(graph.num_nodes)
        rows = torch.arange(0, len(self.queries), 2, device=graph.device)
        zeros = torch.zeros(int(rows.shape[0]), dtype=torch.int64, device=graph.device)
        return candidate_evidence(
            terms.rows(rows), n, edge_index=graph.edge_index, edge_start=zeros,
            edge_count=torch.full_like(zeros, graph.num_links), node_start=zeros,
        )  # fmt: skip

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
        graph = self.graph
        if rank:  # the seeds as contiguous columns, as RetrAssociateWithAction's
            w, k = seed_weights.T.contiguous(), seeds.T.contiguous()
        else:
            w, k = seed_weights.T, seeds.T
        soft, kept = situation_weights(graph, w, k, ppr.T, selected.T, ok, config)
        scores, candidates = bayes_action_columns(graph, soft, kept)
        return scores.T, candidates.T


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

    def retrieve_questions(
        self, requests: Sequence[DefaultPipelineRequest], only_matching: Sequence[bool]
    ) -> list[DefaultPipelineResult]:
        """Free-text questions as ``ask`` runs them: ``requests[2i]`` and ``requests[2i + 1]``
        question ``i``'s concept and episode queries (``text_queries``), all of one memory,
        device, config and embedder (one batch); one answer per question, the pair mixed and,
        where ``only_matching[i]``, its results without evidence left out
        (:func:`~soulmem_torch.retrieve.stages.run_stages`' ``questions``)."""
        if len(requests) != 2 * len(only_matching):
            raise ValidationError(
                f"requests: expected {2 * len(only_matching)} (a concept and an episode query "
                f"per question), found {len(requests)}"
            )
        if not requests:
            return []
        resolved = [(r, r.graph()) for r in requests]
        first, graph = resolved[0]
        for i, (r, g) in enumerate(resolved):
            if g is not graph or r.config != first.config or r.embedder is not first.embedder:
                raise ValidationError(
                    f"requests[{i}]: expected the memory, config and embedder of requests[0]"
                )
        return self._run(resolved, questions=only_matching)

    @staticmethod
    def _run(
        group: list[tuple[DefaultPipelineRequest, Any]],
        questions: Sequence[bool] | None = None,
    ) -> list[DefaultPipelineResult]:
        first, graph = group[0]
        config = first.config
        backend = GraphBackend(
            graph,
            first.working_memory,
            [r.query for r, _ in group],
            embedder=first.embedder,
            nows=[r.now for r, _ in group],
            rank=config.fusion == "rank",
        )
        return run_stages(
            backend,
            config,
            memories=[r.working_memory for r, _ in group],
            priorities=[r.priority for r, _ in group],
            weights=effective_weights(first.weights, config.similarity),
            questions=questions,
        )
