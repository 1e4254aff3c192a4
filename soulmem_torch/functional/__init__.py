"""Pure-torch kernels: dynamic edge weights, Personalized PageRank, BayesAction scores,
fused similarity and the string channel.

Everything here follows its inputs' device and imports only torch (plus the package's error
types and integer codes).
"""

from __future__ import annotations

from soulmem_torch.functional.bayes import bayes_action_candidates, bayes_action_scores
from soulmem_torch.functional.edge_weights import (
    PREFERENCE_SEMANTIC,
    PREFERENCE_SITUATION,
    compute_rowptr,
    dynamic_edge_weight,
    normalized_edge_weight,
    out_weight_sum,
)
from soulmem_torch.functional.fusion import (
    bm25_note_weights,
    bm25_scores,
    ppr_start,
    rank_fusion,
    reciprocal_rank,
    relative_seeds,
    undirected_edges,
)
from soulmem_torch.functional.ppr import (
    MAX_POWER_STEPS,
    PushStats,
    TransitionOperator,
    build_transition,
    power_iteration_steps,
    ppr_forward_push,
    ppr_naive,
    ppr_power_iteration,
    ppr_sequential_push,
)
from soulmem_torch.functional.ppr_dense import DenseFactors, dense_factors, ppr_dense
from soulmem_torch.functional.similarity import (
    BlendWeights,
    cosine_scores,
    embedding_scores,
    fuse_string_scores,
    fused_similarity,
    topk,
)
from soulmem_torch.functional.string_sim import string_distance_score
from soulmem_torch.functional.topk import stable_topk

__all__ = [
    "bm25_note_weights",
    "bm25_scores",
    "ppr_start",
    "rank_fusion",
    "reciprocal_rank",
    "relative_seeds",
    "undirected_edges",
    "BlendWeights",
    "DenseFactors",
    "cosine_scores",
    "embedding_scores",
    "fuse_string_scores",
    "fused_similarity",
    "stable_topk",
    "string_distance_score",
    "topk",
    "MAX_POWER_STEPS",
    "PREFERENCE_SEMANTIC",
    "PREFERENCE_SITUATION",
    "PushStats",
    "TransitionOperator",
    "bayes_action_candidates",
    "bayes_action_scores",
    "build_transition",
    "compute_rowptr",
    "dense_factors",
    "dynamic_edge_weight",
    "normalized_edge_weight",
    "out_weight_sum",
    "power_iteration_steps",
    "ppr_dense",
    "ppr_forward_push",
    "ppr_naive",
    "ppr_power_iteration",
    "ppr_sequential_push",
]
