"""The operators of a snapshot, built once per snapshot version and association settings and
cached on it (``graph.cache``): the dynamic edge weights (docs/spec.md §5) and the transition
operators that PPR walks, along the links and along the links either way.

They read only the snapshot's edge fields (``edge_index``, ``edge_kind``, ``intensity``,
``confidence``, ``node_type``, ``num_nodes``, ``cache``), so one agent's ``MemoryGraph`` and the
bank's union both use them; the bank splices the union's operators from its agents' (see
``bank/_operators.py``). The dense inverse of a small graph is cached on its transition
(:func:`~soulmem_torch.functional.ppr_dense.dense_factors`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor

from soulmem_torch.functional.edge_weights import dynamic_edge_weight
from soulmem_torch.functional.fusion import undirected_edges
from soulmem_torch.functional.ppr import TransitionOperator, build_transition
from soulmem_torch.retrieve.config import AssociationConfig

if TYPE_CHECKING:
    from soulmem_torch.graph import MemoryGraph

__all__ = [
    "dynamic_weights",
    "edge_weights",
    "transition",
    "undirected_transition",
    "weight_key",
]


def weight_key(config: AssociationConfig) -> tuple[Any, ...]:
    """What the edge weights depend on: the preference's boosts and the two factors (the
    cache key of every operator built from them)."""
    return (
        config.preference.boosts,
        config.resolved_intensity_factor,
        config.resolved_confidence_factor,
    )


def dynamic_weights(graph: Any, config: AssociationConfig) -> Tensor:
    """Dynamic edge weights (docs/spec.md §5), float64, of anything with a snapshot's edge
    fields (``edge_index``, ``edge_kind``, ``intensity``, ``confidence``, ``node_type``): one
    agent's snapshot or the bank's union. Not cached (see :func:`edge_weights`)."""
    return dynamic_edge_weight(
        graph.edge_index,
        graph.edge_kind,
        graph.intensity,
        graph.confidence,
        graph.node_type,
        preference=config.preference.boosts,
        intensity_factor=config.resolved_intensity_factor,
        confidence_factor=config.resolved_confidence_factor,
    )


def edge_weights(graph: Any, config: AssociationConfig) -> Tensor:
    """Dynamic edge weights (docs/spec.md §5), float64, cached on the snapshot per preference/factors."""
    key = ("edge_weight", *weight_key(config))
    cached = graph.cache.get(key)
    if cached is None:
        cached = graph.cache[key] = dynamic_weights(graph, config)
    return cached


def transition(graph: Any, config: AssociationConfig) -> TransitionOperator:
    """The row-normalized transition operator, built once per snapshot and preference."""
    key = ("transition", *weight_key(config))
    cached = graph.cache.get(key)
    if cached is None:
        cached = build_transition(
            graph.edge_index, edge_weights(graph, config), num_nodes=int(graph.num_nodes)
        )
        graph.cache[key] = cached
    return cached


def undirected_transition(graph: MemoryGraph, config: AssociationConfig) -> TransitionOperator:
    """The transition that follows every link both ways (:func:`~soulmem_torch.functional.fusion.
    undirected_edges`, the links' dynamic weights of docs/spec.md §5), built once per snapshot and
    preference / factors and cached on the snapshot."""
    key = ("transition_undirected", *weight_key(config))
    cached = graph.cache.get(key)
    if cached is None:
        edge_index, weight = undirected_edges(graph.edge_index, edge_weights(graph, config))
        cached = build_transition(edge_index, weight, num_nodes=int(graph.num_nodes))
        graph.cache[key] = cached
    return cached
