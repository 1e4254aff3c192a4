"""Association: PPR of ``(N, B)`` personalization columns on one snapshot, with the configured
method (docs/spec.md §6)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from soulmem_torch.functional.ppr import (
    TransitionOperator,
    ppr_forward_push,
    ppr_power_iteration,
    ppr_sequential_push,
)
from soulmem_torch.functional.ppr_dense import ppr_dense
from soulmem_torch.retrieve.config import AUTO_SEQUENTIAL_MAX_NODES, AssociationConfig, PprMethod
from soulmem_torch.retrieve.operators import edge_weights, transition

__all__ = ["power_ppr", "resolve_method", "run_association"]


def resolve_method(method: PprMethod, *, num_nodes: int, device: torch.device) -> PprMethod:
    """``auto`` → ``sequential`` on a CPU graph of ≤ 4096 notes, else ``power``."""
    if method is not PprMethod.AUTO:
        return method
    if device.type == "cpu" and num_nodes <= AUTO_SEQUENTIAL_MAX_NODES:
        return PprMethod.SEQUENTIAL
    return PprMethod.POWER


def power_ppr(
    operator: TransitionOperator, weights: Tensor, keys: Tensor, config: AssociationConfig
) -> Tensor:
    """The ``power`` method on one operator: the exact dense solve (:func:`~soulmem_torch.
    functional.ppr_dense.ppr_dense`, its inverse cached on ``operator``) for a graph of at most
    ``config.power_dense_max_nodes`` notes, else the power iteration to ``config.power_tol``.
    The choice depends only on the graph's size, so a query scores the same in any batch.

    Args:
        operator: the graph's transition (directed or undirected).
        weights: (N, B) float64 personalization, every column with a positive sum.
        keys: (N, B) bool, the keys.

    Returns:
        (N, B) float64, columns normalized.
    """
    if operator.num_nodes <= config.power_dense_max_nodes:
        return ppr_dense(operator, weights, key_mask=keys, damping=config.damping_factor)
    return ppr_power_iteration(
        operator,
        weights,
        key_mask=keys,
        damping=config.damping_factor,
        tol=config.power_tol,
        dtype=torch.float32 if config.power_dtype == "float32" else torch.float64,
        local=config.power_local,
    )


def run_association(
    graph: Any, weights: Tensor, keys: Tensor, config: AssociationConfig
) -> tuple[Tensor, Tensor]:
    """PPR of every column with the configured method → ``(scores (N, B) f64, ok (B,) bool)``.

    A column with no key or a zero weight sum gives ``ok = False`` (the strategies return ``[]``).
    """
    n = int(graph.num_nodes)
    b = weights.shape[1]
    ok = keys.any(dim=0) & (weights.sum(dim=0) > 0)
    if n == 0 or not bool(ok.any()):
        return torch.zeros(n, b, dtype=torch.float64, device=weights.device), ok
    every = bool(ok.all())  # the usual case: no (N, B) copies of the inputs or the result
    cols = ok.nonzero().reshape(-1)
    p, k = (weights, keys) if every else (weights[:, cols], keys[:, cols])
    damping, threshold = config.damping_factor, config.residue_threshold
    method = resolve_method(config.method, num_nodes=n, device=weights.device)
    if method is PprMethod.SEQUENTIAL:
        edge_index = graph.edge_index.cpu()
        w = edge_weights(graph, config).cpu()
        pc, kc = p.cpu(), k.cpu()
        results = []
        for j in range(pc.shape[1]):  # the parity oracle is sequential by definition
            idx = kc[:, j].nonzero().reshape(-1)
            r = ppr_sequential_push(
                edge_index, w, idx, pc[idx, j], num_nodes=n, damping=damping, threshold=threshold
            )
            results.append(r if r.numel() else torch.zeros(n, dtype=torch.float64))
        res = torch.stack(results, dim=1).to(weights.device)
    elif method is PprMethod.PUSH:
        res = ppr_forward_push(
            transition(graph, config), p, key_mask=k, damping=damping, threshold=threshold
        )
    else:
        res = power_ppr(transition(graph, config), p, k, config)
    ok = ok.clone()
    ok[cols] = res.sum(dim=0) > 0
    if every:
        return res, ok
    out = torch.zeros(n, b, dtype=torch.float64, device=weights.device)
    out[:, cols] = res
    return out, ok
