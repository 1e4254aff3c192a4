"""soulmem_torch: the SoulMem agent memory system on PyTorch and PyTorch Geometric.

``import soulmem_torch`` loads only the data model (no torch); the tensor layers — runtime,
graph snapshot, embeddings, kernels, strategies, forgetting, the ``nn.Module`` and the
``SoulMem`` facade — are imported on first attribute access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from soulmem_torch.errors import (
    ConfigError,
    NotFoundError,
    SoulMemError,
    StoreError,
    ValidationError,
)
from soulmem_torch.model import *  # noqa: F403
from soulmem_torch.model import __all__ as _model_all

__version__ = "0.1.0"

_LAZY: dict[str, str] = {
    "SoulMem": "soulmem_torch.api",
    "text_queries": "soulmem_torch.retrieve.questions",
    "MemoryCluster": "soulmem_torch.runtime",
    "WorkingMemory": "soulmem_torch.runtime",
    "SlidingWindow": "soulmem_torch.runtime",
    "Feedback": "soulmem_torch.runtime",
    "MemoryGraph": "soulmem_torch.graph",
    "MemoryStore": "soulmem_torch.store",
    "MemoryRetriever": "soulmem_torch.nn",
    "HashingEmbedder": "soulmem_torch.embedding",
    "SentenceTransformerEmbedder": "soulmem_torch.embedding",
    "MemoryEmbedding": "soulmem_torch.embedding",
    "EmbeddedMemoryNote": "soulmem_torch.embedding",
    "embed_notes": "soulmem_torch.embedding",
    "embed_queries": "soulmem_torch.embedding",
    "MemoryRetrieveQuery": "soulmem_torch.model.query",
    "PrioritizedMemoryRetrieveQuery": "soulmem_torch.model.query",
    "FakeLLM": "soulmem_torch.forget",
    "forget_cluster": "soulmem_torch.forget",
    "lazy_forget": "soulmem_torch.forget",
    "MemoryBank": "soulmem_torch.bank",
    "BatchingRetriever": "soulmem_torch.bank",
    "ShardedMemoryBank": "soulmem_torch.bank",
}
for _name in (
    "AssociateWithActionConfig",
    "AssociationConfig",
    "BayesActionConfig",
    "DefaultPipelineConfig",
    "PprMethod",
    "RetrAssociateWithAction",
    "RetrAssociation",
    "RetrBayesAction",
    "RetrDefaultPipeline",
    "RetrRequestConfig",
    "RetrShortOnly",
    "RetrSimilarity",
    "ShortOnlyConfig",
    "SimilarityConfig",
    "TypePreference",
    "parse_request_config",
    "mix_by_priority",
):
    _LAZY[_name] = "soulmem_torch.retrieve"

if TYPE_CHECKING:
    from soulmem_torch.api import SoulMem
    from soulmem_torch.bank import BatchingRetriever, MemoryBank, ShardedMemoryBank
    from soulmem_torch.embedding import (
        EmbeddedMemoryNote,
        HashingEmbedder,
        MemoryEmbedding,
        SentenceTransformerEmbedder,
        embed_notes,
        embed_queries,
    )
    from soulmem_torch.forget import FakeLLM, forget_cluster, lazy_forget
    from soulmem_torch.graph import MemoryGraph
    from soulmem_torch.model.query import MemoryRetrieveQuery, PrioritizedMemoryRetrieveQuery
    from soulmem_torch.nn import MemoryRetriever
    from soulmem_torch.retrieve import (
        AssociateWithActionConfig,
        AssociationConfig,
        BayesActionConfig,
        DefaultPipelineConfig,
        PprMethod,
        RetrAssociateWithAction,
        RetrAssociation,
        RetrBayesAction,
        RetrDefaultPipeline,
        RetrRequestConfig,
        RetrShortOnly,
        RetrSimilarity,
        ShortOnlyConfig,
        SimilarityConfig,
        TypePreference,
        mix_by_priority,
        parse_request_config,
    )
    from soulmem_torch.retrieve.questions import text_queries
    from soulmem_torch.runtime import Feedback, MemoryCluster, SlidingWindow, WorkingMemory
    from soulmem_torch.store import MemoryStore


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'soulmem_torch' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "ConfigError",
    "NotFoundError",
    "SoulMemError",
    "StoreError",
    "ValidationError",
    "__version__",
    *_model_all,
    *_LAZY,
]
