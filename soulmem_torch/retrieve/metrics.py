"""Retrieval metrics exactly as the original's evaluation tool computes them (docs/spec.md §9).

R = retrieved ids (ranked), G = expected ids (duplicates counted: n = |G|). Each ``k`` is
clipped to |R| and the clipped k is reported. Recall@k = |R[:k] ∩ G| / n; Precision@k =
|R[:k] ∩ G| / k; nDCG@k uses binary gains and **one** IDCG, from ``[1]*n`` cut or padded to the
largest k; MRR = 1 / rank of the first hit within the largest k, else 0; Hit = any hit within the
largest k. n = 0 → every metric is 0.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from soulmem_torch.errors import ValidationError

__all__ = ["RankingMetrics", "ranking_metrics"]


@dataclass(frozen=True)
class RankingMetrics:
    """Metrics of one ranked list; dict keys are the *clipped* k values."""

    recall: dict[int, float] = field(default_factory=dict)
    precision: dict[int, float] = field(default_factory=dict)
    ndcg: dict[int, float] = field(default_factory=dict)
    mrr: float = 0.0
    hit: bool = False
    k_values: tuple[int, ...] = ()


def ranking_metrics(
    retrieved: Sequence[Hashable], expected: Sequence[Hashable], k_values: Sequence[int]
) -> RankingMetrics:
    """Computes Recall/Precision/nDCG@k, MRR and Hit (see the module docstring)."""
    if not k_values:
        raise ValidationError("k_values: expected at least one k, found none")
    for k in k_values:
        if int(k) != k or k < 1:
            raise ValidationError(f"k_values: expected integers >= 1, found {k!r}")
    r = list(retrieved)
    g = list(expected)
    n = len(g)
    gold = set(g)
    clipped = tuple(min(int(k), len(r)) for k in k_values)
    max_k = max(clipped) if clipped else 0
    if n == 0:
        zeros = {k: 0.0 for k in clipped}
        return RankingMetrics(dict(zeros), dict(zeros), dict(zeros), 0.0, False, clipped)
    gains = [1.0 if item in gold else 0.0 for item in r]
    ideal = ([1.0] * n + [0.0] * max_k)[:max_k]
    idcg = sum(gain / math.log2(i + 2) for i, gain in enumerate(ideal))
    recall: dict[int, float] = {}
    precision: dict[int, float] = {}
    ndcg: dict[int, float] = {}
    for k in clipped:
        hits = sum(1 for item in set(r[:k]) if item in gold)
        recall[k] = hits / n
        precision[k] = hits / k if k > 0 else 0.0
        dcg = sum(gains[i] / math.log2(i + 2) for i in range(k))
        ndcg[k] = dcg / idcg if idcg > 0 else 0.0
    mrr = 0.0
    for i in range(max_k):
        if gains[i]:
            mrr = 1.0 / (i + 1)
            break
    return RankingMetrics(recall, precision, ndcg, mrr, mrr > 0, clipped)
