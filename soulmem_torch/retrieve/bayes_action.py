"""``BayesAction``: next actions from TrigToAction links (docs/spec.md §7)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from soulmem_torch.functional.bayes import bayes_action_candidates, bayes_action_scores
from soulmem_torch.model import MemoryId
from soulmem_torch.retrieve.batches import run_grouped
from soulmem_torch.retrieve.columns import sources_matrix, topk_lists
from soulmem_torch.retrieve.requests import BayesActionRequest

__all__ = ["BayesActionRequest", "RetrBayesAction", "bayes_action_columns", "bayes_actions"]

if TYPE_CHECKING:
    from soulmem_torch.graph import MemoryGraph


def bayes_action_columns(
    graph: MemoryGraph, weights: torch.Tensor, keys: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scores (N, B) float64, candidates (N, B) bool)`` of source ``weights``/``keys``
    (N, B): Σ prob · weight over the sources' Proc links into Procedure notes."""
    if int(graph.num_nodes) == 0:  # an empty memory triggers nothing
        b = weights.shape[1]
        return (
            torch.zeros(0, b, dtype=torch.float64, device=weights.device),
            torch.zeros(0, b, dtype=torch.bool, device=weights.device),
        )
    scores = bayes_action_scores(
        weights, graph.edge_index, graph.edge_kind, graph.prob, graph.node_type
    )
    candidates = bayes_action_candidates(keys, graph.edge_index, graph.edge_kind, graph.node_type)
    return scores, candidates


def bayes_actions(
    graph: MemoryGraph, weights: torch.Tensor, keys: torch.Tensor, top_k: int
) -> list[list[tuple[MemoryId, float]]]:
    """Top-k actions per column of source ``weights``/``keys`` (N, B): Σ prob · weight."""
    if int(graph.num_nodes) == 0:  # an empty memory triggers nothing
        return [[] for _ in range(weights.shape[1])]
    return topk_lists(graph, *bayes_action_columns(graph, weights, keys), top_k)


class RetrBayesAction:
    """``RetrBayesAction().retrieve(request) -> [(MemoryId, f64)]``.

    Candidates are the Procedure targets of the sources' Proc links; ``score[action] +=
    prob · weight`` over sources; no normalization, no prior; descending, ``top_k``.
    """

    def retrieve(self, request: BayesActionRequest) -> list[tuple[MemoryId, float]]:
        """One request: ``[(MemoryId, score)]`` of the actions the sources trigger, scored
        ``Σ prob · source weight``, best first, ``top_k`` long (docs/spec.md §7). A batch of
        one through :meth:`retrieve_batch`."""
        return self.retrieve_batch([request])[0]

    def retrieve_batch(
        self, requests: Sequence[BayesActionRequest]
    ) -> list[list[tuple[MemoryId, float]]]:
        """Many requests at once; one action list per request, in request order."""
        resolved = [(r, r.graph()) for r in requests]

        def run(group: list[tuple[BayesActionRequest, Any]]) -> list[list[tuple[MemoryId, float]]]:
            graph = group[0][1]
            weights, keys = sources_matrix(
                graph, [r.source for r, _ in group], float32_scores=False
            )
            return bayes_actions(graph, weights, keys, group[0][0].config.top_k)

        return run_grouped(resolved, key=lambda rg: (id(rg[1]), rg[0].config), run=run)
