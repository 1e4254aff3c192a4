"""The strategies' requests: what ``XConfig(...).into_request(working_memory, ...)`` builds and
``RetrX().retrieve(request)`` reads — the memory, the query or the scored sources, the config
and the device (docs/spec.md §7).

Plain records below the configs (``retrieve/config.py`` builds them, so a request does not
import its config's class: its ``config`` field is typed ``Any``, the class named beside it).
The config is always given: the configs' ``into_request`` pass themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from soulmem_torch.device import resolve_device
from soulmem_torch.errors import ValidationError
from soulmem_torch.model import MemoryId

if TYPE_CHECKING:
    from soulmem_torch.functional.similarity import BlendWeights
    from soulmem_torch.graph import MemoryGraph
    from soulmem_torch.retrieve._types import MemorySource

__all__ = [
    "AssociateWithActionRequest",
    "AssociationRequest",
    "BayesActionRequest",
    "DefaultPipelineRequest",
    "ShortOnlyRequest",
    "SimilarityRequest",
    "graph_of",
]


def graph_of(memory: Any, device: torch.device | str | None) -> Any:
    """The ``MemoryGraph`` of a ``WorkingMemory`` / ``MemoryCluster`` / ``MemoryGraph`` on a device.

    Snapshots are cached by the cluster (rebuilt only when it changed).
    """
    dev = resolve_device(device)
    if hasattr(memory, "edge_index") and hasattr(memory, "index_of"):
        return memory.to(dev)
    graph = getattr(memory, "graph", None)
    if callable(graph):
        return graph(dev)
    raise ValidationError(
        "working_memory: expected a WorkingMemory, MemoryCluster or MemoryGraph, "
        f"found {type(memory).__name__}"
    )


@dataclass
class SimilarityRequest:
    """One query against a working memory.

    ``query`` is a ``MemoryRetrieveQuery`` (or its JSON dict; embedded with ``embedder``), a
    ``QueryEmbeddingBatch`` of one query (already embedded), or — plain mode, one vector per
    note — a ``(D,)`` tensor or a string (embedded with ``embedder``) scored by plain cosine
    against the notes' single vectors.
    """

    working_memory: MemorySource
    query: Any
    config: Any  # SimilarityConfig
    embedder: Any = None
    device: torch.device | str | None = None
    weights: BlendWeights | None = None

    def graph(self) -> MemoryGraph:
        return graph_of(self.working_memory, self.device)


@dataclass
class AssociationRequest:
    """Sources ``[(MemoryId, f32 score)]`` on a working memory, with a config and a device."""

    working_memory: MemorySource
    source: list[tuple[MemoryId, float]]
    config: Any  # AssociationConfig
    device: torch.device | str | None = None

    def graph(self) -> MemoryGraph:
        return graph_of(self.working_memory, self.device)


@dataclass
class BayesActionRequest:
    """Sources ``[(MemoryId, f64 weight)]`` on a working memory."""

    working_memory: MemorySource
    source: list[tuple[MemoryId, float]]
    config: Any  # BayesActionConfig
    device: torch.device | str | None = None

    def graph(self) -> MemoryGraph:
        return graph_of(self.working_memory, self.device)


@dataclass
class ShortOnlyRequest:
    """The short-term window of a working memory."""

    working_memory: MemorySource
    config: Any  # ShortOnlyConfig


@dataclass
class AssociateWithActionRequest:
    """Seeds ``[(MemoryId, f32 score)]`` (e.g. similarity results) on a working memory."""

    working_memory: MemorySource
    source: list[tuple[MemoryId, float]]
    config: Any  # AssociateWithActionConfig
    device: torch.device | str | None = None

    def graph(self) -> MemoryGraph:
        return graph_of(self.working_memory, self.device)


@dataclass
class DefaultPipelineRequest:
    """One query (as for ``SimilarityRequest``) with a priority that is passed through."""

    working_memory: MemorySource
    query: Any
    priority: int = 0
    config: Any = field(kw_only=True)  # DefaultPipelineConfig
    embedder: Any = None
    device: torch.device | str | None = None
    weights: BlendWeights | None = None
    now: Any = None  # when the question is asked (aware datetime): the ``time`` channel

    def graph(self) -> MemoryGraph:
        return graph_of(self.working_memory, self.device)
