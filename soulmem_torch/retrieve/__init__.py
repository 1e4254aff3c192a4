"""Retrieval strategies (docs/spec.md §7): configs, requests, ``RetrX().retrieve(request)`` and batches.

``XConfig(...).into_request(working_memory, ...)`` builds a request; ``RetrX().retrieve(req)``
answers it and ``RetrX().retrieve_batch(reqs)`` answers many at once (one kernel call per group
of requests sharing a memory, device and config).

The default pipeline's stages are written once (``stages.py``: ``run_stages`` over per-query
candidate rows); ``pipeline.py`` is its one-memory backend (``GraphBackend``) and
``RetrDefaultPipeline``, ``bank/_pipeline.py`` its backend on a bank's union.
"""

from __future__ import annotations

from soulmem_torch.retrieve.assoc_with_action import (
    AssociateWithActionRequest,
    AssociateWithActionResult,
    RetrAssociateWithAction,
)
from soulmem_torch.retrieve.association import AssociationRequest, RetrAssociation
from soulmem_torch.retrieve.bayes_action import BayesActionRequest, RetrBayesAction
from soulmem_torch.retrieve.config import (
    AssociateWithActionConfig,
    AssociationConfig,
    BayesActionConfig,
    DefaultPipelineConfig,
    FusionChannel,
    PprMethod,
    RetrRequestConfig,
    ShortOnlyConfig,
    SimilarityConfig,
    TypePreference,
    parse_request_config,
)
from soulmem_torch.retrieve.metrics import RankingMetrics, ranking_metrics
from soulmem_torch.retrieve.pipeline import (
    DefaultPipelineRequest,
    DefaultPipelineResult,
    RetrDefaultPipeline,
)
from soulmem_torch.retrieve.priority import merge_weighted_sum, mix_by_priority
from soulmem_torch.retrieve.short_only import RetrShortOnly, ShortOnlyRequest
from soulmem_torch.retrieve.similarity import RetrSimilarity, SimilarityRequest

__all__ = [
    "AssociateWithActionConfig",
    "AssociateWithActionRequest",
    "AssociateWithActionResult",
    "AssociationConfig",
    "AssociationRequest",
    "BayesActionConfig",
    "BayesActionRequest",
    "DefaultPipelineConfig",
    "DefaultPipelineRequest",
    "DefaultPipelineResult",
    "FusionChannel",
    "PprMethod",
    "RankingMetrics",
    "RetrAssociateWithAction",
    "RetrAssociation",
    "RetrBayesAction",
    "RetrDefaultPipeline",
    "RetrRequestConfig",
    "RetrShortOnly",
    "RetrSimilarity",
    "ShortOnlyConfig",
    "ShortOnlyRequest",
    "SimilarityConfig",
    "SimilarityRequest",
    "TypePreference",
    "merge_weighted_sum",
    "mix_by_priority",
    "parse_request_config",
    "ranking_metrics",
]
