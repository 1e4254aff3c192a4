"""BayesAction scoring (docs/spec.md §7): aggregate ``prob * weight`` over trigger -> action links.

For every query (column) and every Procedure note ``a``::

    score[a] = sum over Proc links s -> a of prob(link) * weight[s]

with no normalization and no prior, as the original's ``RetrBayesAction``. All queries are
scored with one sparse product (a gather over the selected links, a scale by ``prob``, a
scatter-add onto the actions).

Example:
    >>> import torch
    >>> from soulmem_torch.functional.codes import LINK_PROC, NODE_PROCEDURE, NODE_SEMANTIC
    >>> scores = bayes_action_scores(
    ...     torch.tensor([0.8, 0.0], dtype=torch.float64),
    ...     torch.tensor([[0], [1]]),
    ...     torch.tensor([LINK_PROC]),
    ...     torch.tensor([0.5], dtype=torch.float64),
    ...     torch.tensor([NODE_SEMANTIC, NODE_PROCEDURE]),
    ... )
    >>> scores.tolist()
    [0.0, 0.4]
"""

from __future__ import annotations

import torch
from torch import Tensor

from soulmem_torch.errors import ValidationError
from soulmem_torch.functional.codes import LINK_PROC, NODE_PROCEDURE
from soulmem_torch.functional.edge_weights import _check_edge_index, _check_edge_vector

__all__ = ["bayes_action_candidates", "bayes_action_scores"]


def _check_node_type(node_type: Tensor) -> int:
    if not isinstance(node_type, Tensor) or node_type.dim() != 1:
        raise ValidationError("node_type: expected an integer tensor of shape (N,)")
    return int(node_type.shape[0])


def _as_matrix(name: str, value: Tensor, num_nodes: int) -> tuple[Tensor, bool]:
    if not isinstance(value, Tensor):
        raise ValidationError(f"{name}: expected a tensor, found {type(value).__name__}")
    if value.layout != torch.strided:
        value = value.to_dense()
    if value.dim() not in (1, 2) or value.shape[0] != num_nodes:
        raise ValidationError(
            f"{name}: expected shape ({num_nodes},) or ({num_nodes}, B), found {tuple(value.shape)}"
        )
    return value.reshape(num_nodes, -1), value.dim() == 1


def bayes_action_scores(
    source_weight: Tensor,
    edge_index: Tensor,
    edge_kind: Tensor,
    prob: Tensor,
    node_type: Tensor,
) -> Tensor:
    """``score[a] += prob * weight[s]`` over every Proc link ``s -> a`` whose target is a Procedure.

    Args:
        source_weight: shape (N,) or (N, B), float, finite (dense or a torch sparse
            tensor). Source weights per node and query; 0 for non-sources.
        edge_index: shape (2, E), integer.
        edge_kind: shape (E,), integer. ``LINK_*`` codes.
        prob: shape (E,), float, finite on Proc links. ``TrigToAction.prob`` (read only
            where ``edge_kind == LINK_PROC``).
        node_type: shape (N,), integer. ``NODE_*`` codes.

    Returns:
        shape as ``source_weight`` (dense), float64, on ``edge_index``'s device. The score of
        every node per query (0 for non-Procedure nodes and unreached actions). Which actions
        are *candidates* (possibly with score 0, e.g. from a zero-weight source) is
        :func:`bayes_action_candidates`.

    Raises:
        ValidationError: bad shapes, non-finite weights or Proc-link probabilities.
    """
    n = _check_node_type(node_type)
    _check_edge_index(edge_index, n)
    num_edges = edge_index.shape[1]
    _check_edge_vector("edge_kind", edge_kind, num_edges)
    _check_edge_vector("prob", prob, num_edges)
    device = edge_index.device
    w, squeeze = _as_matrix("source_weight", source_weight, n)
    w = w.to(device=device, dtype=torch.float64)
    if w.numel() and not bool(torch.isfinite(w).all()):
        raise ValidationError("source_weight: expected finite weights, found NaN or inf")
    src, dst = edge_index[0], edge_index[1]
    selected = (edge_kind.to(device) == LINK_PROC) & (node_type.to(device)[dst] == NODE_PROCEDURE)
    sel_src, sel_dst = src[selected], dst[selected]
    sel_prob = prob.to(device=device, dtype=torch.float64)[selected]
    if sel_prob.numel() and not bool(torch.isfinite(sel_prob).all()):
        raise ValidationError("prob: expected finite TrigToAction probabilities, found NaN or inf")
    scores = torch.zeros_like(w).index_add_(0, sel_dst, sel_prob.unsqueeze(1) * w[sel_src])
    return scores.reshape(-1) if squeeze else scores


def bayes_action_candidates(
    source_mask: Tensor, edge_index: Tensor, edge_kind: Tensor, node_type: Tensor
) -> Tensor:
    """Candidate actions: Procedure notes at the end of a source's Proc link.

    The original lists every such action of a resolved source as a candidate (score 0 until a
    link adds to it), whatever the source's weight -- so a candidate can score 0.

    Args:
        source_mask: shape (N,) or (N, B), bool. Resolved sources per query (a source with
            weight 0 still counts).
        edge_index: shape (2, E), integer.
        edge_kind: shape (E,), integer. ``LINK_*`` codes.
        node_type: shape (N,), integer. ``NODE_*`` codes.

    Returns:
        shape as ``source_mask``, bool, on ``edge_index``'s device.

    Raises:
        ValidationError: bad shapes or dtype.
    """
    n = _check_node_type(node_type)
    _check_edge_index(edge_index, n)
    _check_edge_vector("edge_kind", edge_kind, edge_index.shape[1])
    mask, squeeze = _as_matrix("source_mask", source_mask, n)
    if mask.dtype != torch.bool:
        raise ValidationError(f"source_mask: expected a bool tensor, found {mask.dtype}")
    device = edge_index.device
    src, dst = edge_index[0], edge_index[1]
    selected = (edge_kind.to(device) == LINK_PROC) & (node_type.to(device)[dst] == NODE_PROCEDURE)
    hits = torch.zeros(mask.shape, dtype=torch.int64, device=device).index_add_(
        0, dst[selected], mask.to(device=device, dtype=torch.int64)[src[selected]]
    )
    out = hits > 0
    return out.reshape(-1) if squeeze else out
