"""``Association``: Personalized PageRank from scored source notes (docs/spec.md §7)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from soulmem_torch.model import MemoryId
from soulmem_torch.retrieve.batches import run_grouped
from soulmem_torch.retrieve.columns import sources_matrix, topk_lists
from soulmem_torch.retrieve.config import AssociationConfig
from soulmem_torch.retrieve.propagation import run_association
from soulmem_torch.retrieve.requests import AssociationRequest

__all__ = ["AssociationRequest", "RetrAssociation"]

if TYPE_CHECKING:
    from soulmem_torch.graph import MemoryGraph


class RetrAssociation:
    """``RetrAssociation().retrieve(request) -> [(MemoryId, f64)]``.

    Empty source → ``[]``; unknown ids are dropped; nothing resolved (or a zero total score) →
    ``[]``, never an exception. Scores are rounded to float32 and widened to float64 (the
    original's ``f32`` similarity scores), PPR runs with ``config.method``, the result is
    stable-sorted descending (ties keep note order) and cut to ``top_k`` (zero-score notes may
    appear).
    """

    def retrieve(self, request: AssociationRequest) -> list[tuple[MemoryId, float]]:
        """One request: ``[(MemoryId, float64 score)]``, PPR from the request's sources, best
        first, ``top_k`` long (docs/spec.md §7); ``[]`` when no source is in the memory. A batch
        of one through :meth:`retrieve_batch` (the same code path)."""
        return self.retrieve_batch([request])[0]

    def retrieve_batch(
        self, requests: Sequence[AssociationRequest]
    ) -> list[list[tuple[MemoryId, float]]]:
        """Answers many requests; those sharing a memory, device and config run as one batch."""
        resolved = [(r, r.graph()) for r in requests]
        return run_grouped(
            resolved,
            key=lambda rg: (id(rg[1]), rg[0].config),
            run=lambda group: self._run(group[0][1], group[0][0].config, [r for r, _ in group]),
        )

    @staticmethod
    def _run(
        graph: MemoryGraph, config: AssociationConfig, requests: list[AssociationRequest]
    ) -> list[list[tuple[MemoryId, float]]]:
        weights, keys = sources_matrix(graph, [r.source for r in requests], float32_scores=True)
        scores, ok = run_association(graph, weights, keys, config)
        present = ok.unsqueeze(0).expand_as(scores)
        return topk_lists(graph, scores, present, config.top_k)
