"""``MemoryRetriever``: memory retrieval as an ``nn.Module`` for PyTorch agent models.

The graph tensors (note vectors, the PPR transition operator) are buffers, so the module moves
with ``.to(device)`` and its ``forward`` is pure tensor code: query embeddings ``(B, D)`` in,
top-k note indices and scores out; :meth:`MemoryRetriever.associate` runs the association step
(a fixed number of weighted power-iteration steps, CUDA-graph capturable) on those seeds.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from soulmem_torch.errors import ValidationError
from soulmem_torch.functional.ppr import (
    TransitionOperator,
    power_iteration_steps,
    ppr_power_iteration,
)
from soulmem_torch.retrieve.config import AssociationConfig
from soulmem_torch.retrieve.operators import transition

__all__ = ["MemoryRetriever"]

_OPERATOR_FIELDS = (
    "rowptr",
    "col",
    "weight",
    "out_degree",
    "max_weight",
    "dangling_index",
    "transpose",
)


class MemoryRetriever(nn.Module):
    """Top-k cosine retrieval over note vectors, plus PPR association, as a module.

    Args:
        graph: a ``MemoryGraph`` (e.g. ``working_memory.graph()``).
        note_embeddings: shape (N, D). One vector per note (plain mode). ``None`` → the graph's
            ``tag_emb`` (what plain-mode embeddings store), which must then exist.
        k: >= 1. How many notes ``forward`` returns per query.
        association: the PPR settings (damping, preference, factors, top_k); its
            ``power_tol`` fixes the number of power-iteration steps.

    Example:
        >>> retriever = MemoryRetriever(graph, note_embeddings=x, k=4)  # doctest: +SKIP
        >>> idx, score = retriever(query)                                # (B, 4) each
        >>> a_idx, a_score = retriever.associate(idx, score)            # (B, top_k) each
    """

    def __init__(
        self,
        graph: Any,
        *,
        note_embeddings: Tensor | None = None,
        k: int = 4,
        association: AssociationConfig | None = None,
    ) -> None:
        super().__init__()
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValidationError(f"k: expected an int >= 1, found {k!r}")
        x = note_embeddings if note_embeddings is not None else getattr(graph, "tag_emb", None)
        if x is None:
            raise ValidationError(
                "note_embeddings: expected an (N, D) tensor (the graph has no tag_emb)"
            )
        n = int(graph.num_nodes)
        if x.dim() != 2 or x.shape[0] != n:
            raise ValidationError(
                f"note_embeddings: expected shape ({n}, D), found {tuple(x.shape)}"
            )
        if not bool(torch.isfinite(x).all()):
            raise ValidationError("note_embeddings: expected finite values, found NaN or inf")
        self.k = k
        self.config = association or AssociationConfig()
        self.num_nodes = n
        self.steps = power_iteration_steps(self.config.damping_factor, self.config.power_tol)
        x = x.detach().to(torch.float32)
        norm = x.norm(dim=1, keepdim=True)
        self.register_buffer("note_unit", torch.where(norm > 0, x / norm.clamp_min(1e-30), x))
        op = transition(graph.cpu() if hasattr(graph, "cpu") else graph, self.config)
        for name in _OPERATOR_FIELDS:
            self.register_buffer(f"op_{name}", getattr(op, name))

    def _operator(self) -> TransitionOperator:
        return TransitionOperator(
            self.num_nodes, *(getattr(self, f"op_{name}") for name in _OPERATOR_FIELDS)
        )

    def scores(self, query: Tensor) -> Tensor:
        """Cosine of each query with every note: shape (B, N) (0 for all-zero vectors)."""
        if query.dim() != 2 or query.shape[1] != self.note_unit.shape[1]:
            raise ValidationError(
                f"query: expected shape (B, {self.note_unit.shape[1]}), found {tuple(query.shape)}"
            )
        q = query.to(self.note_unit.dtype)
        qn = q.norm(dim=1, keepdim=True)
        q = torch.where(qn > 0, q / qn.clamp_min(1e-30), q)
        return q @ self.note_unit.T

    def forward(self, query: Tensor) -> tuple[Tensor, Tensor]:
        """Top-k notes per query: ``(indices (B, k) int64, scores (B, k) float32)``."""
        s = self.scores(query)
        k = min(self.k, s.shape[1])
        values, indices = torch.topk(s, k, dim=1, sorted=True)
        return indices, values

    def associate(self, indices: Tensor, scores: Tensor) -> tuple[Tensor, Tensor]:
        """PPR from seeds ``(indices, scores)`` (B, k): ``(indices, scores)`` of shape (B, top_k).

        Negative seed scores count as 0; a query whose seeds all score 0 falls back to uniform
        weights over its seeds (so every row has a defined result).
        """
        b = indices.shape[0]
        w = scores.detach().to(torch.float64).clamp_min(0.0)
        empty = w.sum(dim=1, keepdim=True) <= 0
        w = torch.where(empty, torch.ones_like(w), w)
        p = torch.zeros(self.num_nodes, b, dtype=torch.float64, device=w.device)
        cols = torch.arange(b, device=w.device).unsqueeze(1).expand_as(indices)
        p.index_put_((indices, cols), w, accumulate=True)
        keys = torch.zeros_like(p, dtype=torch.bool)
        keys[indices, cols] = True
        ppr = ppr_power_iteration(
            self._operator(),
            p,
            key_mask=keys,
            damping=self.config.damping_factor,
            num_steps=self.steps,
            validate=False,
        )
        k = min(self.config.top_k, self.num_nodes)
        values, out = torch.topk(ppr.T, k, dim=1, sorted=True)
        return out, values
