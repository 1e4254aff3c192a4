"""``AssociateWithAction``: association, then Bayes actions from the situations found (docs/spec.md §7)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from soulmem_torch.functional.codes import NODE_ABSTRACT, NODE_SPECIFIC
from soulmem_torch.model import MemoryId
from soulmem_torch.retrieve.batches import run_grouped
from soulmem_torch.retrieve.bayes_action import bayes_actions
from soulmem_torch.retrieve.columns import sources_matrix, topk_lists, topk_mask
from soulmem_torch.retrieve.config import AssociateWithActionConfig
from soulmem_torch.retrieve.propagation import run_association
from soulmem_torch.retrieve.requests import AssociateWithActionRequest

__all__ = [
    "AssociateWithActionRequest",
    "AssociateWithActionResult",
    "RetrAssociateWithAction",
    "associate_with_action",
    "situation_softmax",
    "situation_weights",
]

if TYPE_CHECKING:
    from soulmem_torch.graph import MemoryGraph


@dataclass
class AssociateWithActionResult:
    """``memory``: the PPR list unchanged; ``action``: Bayes actions ``[(MemoryId, f64)]``."""

    memory: list[tuple[MemoryId, float]]
    action: list[tuple[MemoryId, float]]


def associate_with_action(
    graph: MemoryGraph,
    weights: Tensor,
    keys: Tensor,
    config: AssociateWithActionConfig,
    *,
    memory_lists: bool = True,
    personalization: tuple[Tensor, Tensor] | None = None,
) -> tuple[list[list[tuple[MemoryId, float]]], list[list[tuple[MemoryId, float]]], Tensor, Tensor]:
    """Batched core: returns (memory lists, action lists, PPR scores (N,B), PPR top-k mask (N,B)).

    ``memory_lists=False`` skips building the PPR id lists (returns ``[]`` for them): the
    pipeline reads the score matrix instead. ``personalization``: ``(weights, keys)`` (N, B)
    the PPR starts from instead of the seeds (the default pipeline's
    ``personalization="first_stage"``); the merge below keeps the seeds.

    Seeds and PPR results are merged (max per note), only Situation notes with a score > 0 are
    kept, abstract ones multiplied by ``abstract_source_priority``, turned into weights by a
    max-subtracted softmax per request, and fed to BayesAction with ``action_top_k``.
    """
    assoc = config.association
    p_weights, p_keys = (weights, keys) if personalization is None else personalization
    scores, ok = run_association(graph, p_weights, p_keys, assoc)
    present = ok.unsqueeze(0).expand_as(scores)
    memory = topk_lists(graph, scores, present, assoc.top_k) if memory_lists else []
    selected = topk_mask(scores, present, assoc.top_k)
    soft, kept = situation_weights(graph, weights, keys, scores, selected, ok, config)
    actions = bayes_actions(graph, soft, kept, config.action_top_k)
    return memory, actions, scores, selected


def situation_weights(
    graph: MemoryGraph,
    weights: Tensor,
    keys: Tensor,
    scores: Tensor,
    selected: Tensor,
    ok: Tensor,
    config: AssociateWithActionConfig,
) -> tuple[Tensor, Tensor]:
    """The sources of BayesAction, ``(weights (N, B) float64, kept (N, B) bool)``: the seeds
    (``weights`` / ``keys``) and the PPR top-k (``scores`` where ``selected``) merged (max per
    note), only Situation notes with a score > 0 kept (``ok``: the columns PPR ran for),
    abstract ones multiplied by ``abstract_source_priority``, turned into weights by a
    max-subtracted softmax per column."""
    neg_inf = torch.full_like(scores, float("-inf"))
    merged = torch.maximum(
        torch.where(keys, weights, neg_inf), torch.where(selected, scores, neg_inf)
    )
    return situation_softmax(
        merged, graph.node_type.unsqueeze(1), ok.unsqueeze(0), config.abstract_source_priority
    )


def situation_softmax(
    merged: Tensor, node_type: Tensor, ok: Tensor, abstract_priority: float, *, dim: int = 0
) -> tuple[Tensor, Tensor]:
    """BayesAction's source weights from merged seed / PPR scores, one softmax per query along
    ``dim`` (0: ``(N, B)`` columns, 1: ``(B, M)`` candidate rows; the one-memory and the union
    backend of the default pipeline run this same code).

    Situation notes (Specific or Abstract) with a merged score > 0 where ``ok`` are kept,
    abstract ones multiplied by ``abstract_priority``, then a max-subtracted softmax; a query
    without kept notes gets zeros.

    Args:
        merged: float64 scores (``-inf`` off the seeds and the PPR top-k).
        node_type: the notes' type codes, broadcastable to ``merged``.
        ok: bool, broadcastable to ``merged`` (the queries PPR ran for, real candidates).

    Returns:
        ``(weights, kept)``, both ``merged``'s shape.
    """
    neg_inf = torch.full_like(merged, float("-inf"))
    situation = (node_type == NODE_SPECIFIC) | (node_type == NODE_ABSTRACT)
    kept = situation & (merged > 0) & ok
    is_abstract = node_type == NODE_ABSTRACT
    w = torch.where(is_abstract, merged * abstract_priority, merged)
    w = torch.where(kept, w, neg_inf)
    if w.shape[dim]:
        top = w.max(dim=dim, keepdim=True).values
    else:
        top = w.narrow(dim, 0, 0)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    e = torch.where(kept, torch.exp(w - top), torch.zeros_like(w))
    total = e.sum(dim=dim, keepdim=True)
    soft = torch.where(total > 0, e / torch.where(total > 0, total, 1.0), e)
    return soft, kept


class RetrAssociateWithAction:
    """``RetrAssociateWithAction().retrieve(request) -> AssociateWithActionResult``.

    Association empty → ``memory = [], action = []``.
    """

    def retrieve(self, request: AssociateWithActionRequest) -> AssociateWithActionResult:
        """One request: association from the seeds, then the actions the recalled situations
        trigger (docs/spec.md §7) — a result with ``memory`` and ``action``. A batch of one
        through :meth:`retrieve_batch`."""
        return self.retrieve_batch([request])[0]

    def retrieve_batch(
        self, requests: Sequence[AssociateWithActionRequest]
    ) -> list[AssociateWithActionResult]:
        """Many requests at once (one PPR batch per memory / device / config group); one
        result per request, in request order."""
        resolved = [(r, r.graph()) for r in requests]

        def run(group: list[tuple[AssociateWithActionRequest, Any]]) -> list[Any]:
            graph, config = group[0][1], group[0][0].config
            weights, keys = sources_matrix(graph, [r.source for r, _ in group], float32_scores=True)
            memory, actions, _, _ = associate_with_action(graph, weights, keys, config)
            return [AssociateWithActionResult(m, a) for m, a in zip(memory, actions)]

        return run_grouped(resolved, key=lambda rg: (id(rg[1]), rg[0].config), run=run)
