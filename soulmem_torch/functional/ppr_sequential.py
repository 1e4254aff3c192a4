"""Sequential forward push: the original's ``weighted_ppr_fp``, exactly, in plain Python on the
CPU -- the parity oracle (docs/spec.md §6.1).

Conventions (damping, row-stochastic ``P``, the dangling rule, ``(N, B)`` personalization):
see :mod:`soulmem_torch.functional.ppr`.
"""

from __future__ import annotations

import heapq
import math

import torch
from torch import Tensor

from soulmem_torch.errors import ValidationError
from soulmem_torch.functional._ppr_common import (
    _F64,
    PushStats,
    _check_count,
    _check_damping,
    _check_edge_weight,
    _check_num_nodes,
    _check_positive,
    _make_stats,
)
from soulmem_torch.functional.edge_weights import _check_edge_index

__all__ = ["ppr_sequential_push"]


def ppr_sequential_push(
    edge_index: Tensor,
    edge_weight: Tensor,
    personalization_index: Tensor,
    personalization_weight: Tensor,
    *,
    num_nodes: int,
    damping: float = 0.65,
    threshold: float = 1e-5,
    max_iterations: int | None = None,
    return_stats: bool = False,
) -> Tensor | tuple[Tensor, PushStats]:
    """The original's weighted forward push (``weighted_ppr_fp``), operation for operation.

    This is the parity oracle: a plain-Python loop on the CPU, float64, reproducing the
    original's float operation order (docs/spec.md §6.1):

    1. ``residue = personalization / sum`` (divided only when the sum is not exactly 1),
       ``reserve = 0``; ``n_src`` = number of keys (zero-weight keys count).
    2. Repeatedly take the node ``u`` with the largest residue ``r`` (ties: the highest node
       index); stop when ``r <= threshold`` or after ``max_iterations`` pushes.
       ``residue[u] = 0``; ``reserve[u] += (1 - damping) * r``. If ``u`` has out-edges, its
       weights are taken **newest first** (reverse of their order in ``edge_index``), summed in
       that order and divided by the sum when it is not 0; if ``r * max(w) > threshold`` every
       out-edge adds ``(damping * w) * r`` to its target's residue (newest edge first), else
       that mass is dropped. If ``u`` has no out-edge and ``r / n_src > threshold``, every key
       gets ``(damping * r) / n_src``, else it is dropped.
    3. ``reserve / sum(reserve)``, summed in node order.

    A binary heap with lazy deletion gives the arg-max in ``O(log N)``.

    Args:
        edge_index: shape (2, E), integer. Edges; within one source, their order in this
            tensor is the link insertion order (oldest first), as in the graph snapshot.
        edge_weight: shape (E,), float. Raw (unnormalized) edge weights, e.g.
            :func:`~soulmem_torch.functional.edge_weights.dynamic_edge_weight`; finite.
        personalization_index: shape (K,), integer, distinct, in ``[0, N)``. The keys.
        personalization_weight: shape (K,), float, finite, >= 0, positive sum. Key weights
            (zero weights allowed: such keys still receive dangling mass).
        num_nodes: >= 0. ``N``.
        damping: in [0, 1). Continue probability (default 0.65).
        threshold: finite, > 0. Residue threshold (default 1e-5).
        max_iterations: >= 0 or None. Push cap; ``None`` is ``max(N, 1) * 1024``.
        return_stats: also return the :class:`PushStats` certificate.

    Returns:
        shape (N,), float64, CPU: the normalized PPR of every node (zeros included); an empty
        tensor (shape (0,)) when nothing was reserved (e.g. every key weight <= threshold).
        For ``N = 0`` (an empty graph, where no key can exist) an empty tensor, without
        checking the personalization sum. With ``return_stats``: ``(ppr, stats)``.

    Raises:
        ValidationError: bad damping / threshold / shapes, out-of-range or duplicate keys,
            negative / NaN edge or key weights, a non-positive or overflowing personalization
            sum.
    """
    d = _check_damping(damping)
    thr = _check_positive("threshold", threshold)
    n = _check_num_nodes(num_nodes)
    max_iterations = _check_count("max_iterations", max_iterations, minimum=0)
    _check_edge_index(edge_index, n)
    _check_edge_weight(edge_weight, edge_index.shape[1])
    if edge_weight.numel() and bool((edge_weight < 0).any()):
        e = int((edge_weight < 0).nonzero()[0, 0])
        raise ValidationError(
            f"edge_weight: expected weights >= 0, found {edge_weight[e].item()} at edge {e}"
        )
    if not isinstance(personalization_index, Tensor) or personalization_index.dim() != 1:
        raise ValidationError("personalization_index: expected an integer tensor of shape (K,)")
    if personalization_index.dtype.is_floating_point or personalization_index.dtype == torch.bool:
        raise ValidationError(
            f"personalization_index: expected an integer tensor, found {personalization_index.dtype}"
        )
    keys: list[int] = personalization_index.tolist()
    if not isinstance(personalization_weight, Tensor) or personalization_weight.shape != (
        len(keys),
    ):
        raise ValidationError(
            f"personalization_weight: expected a tensor of shape ({len(keys)},) (one per key)"
        )
    bias: list[float] = personalization_weight.to(_F64).tolist()
    for k in keys:
        if not 0 <= k < n:
            raise ValidationError(
                f"personalization_index: expected node indices in [0, {n}), found {k}"
            )
    if len(set(keys)) != len(keys):
        seen: set[int] = set()
        dup = next(k for k in keys if k in seen or seen.add(k))
        raise ValidationError(f"personalization_index: expected distinct keys, found {dup} twice")
    for k, b in zip(keys, bias):
        if not math.isfinite(b) or b < 0:
            raise ValidationError(
                f"personalization_weight: expected finite weights >= 0, found {b} for node {k}"
            )

    empty = torch.zeros(0, dtype=_F64)
    if n == 0:
        zero = torch.zeros((), dtype=_F64)
        stats = _make_stats(0, True, zero, zero.clone(), zero.clone())
        return (empty, stats) if return_stats else empty

    psum = 0.0
    for b in bias:
        psum += b
    if not psum > 0:
        raise ValidationError(
            f"personalization_weight: expected a positive sum, found {psum} ({len(keys)} keys)"
        )
    if not math.isfinite(psum):
        raise ValidationError(
            f"personalization_weight: expected a sum that fits a float64, found {psum} "
            f"(largest weight {max(bias):.3g}); scale the weights down"
        )
    if psum != 1.0:
        bias = [b / psum for b in bias]
    n_src = float(len(keys))
    cap = max(n, 1) * 1024 if max_iterations is None else max_iterations

    # Out-edges per source, in order of appearance (= link insertion order).
    src_l: list[int] = edge_index[0].tolist()
    dst_l: list[int] = edge_index[1].tolist()
    w_l: list[float] = edge_weight.to(_F64).tolist()
    out_t: list[list[int]] = [[] for _ in range(n)]
    out_w: list[list[float]] = [[] for _ in range(n)]
    for s_, t_, w_ in zip(src_l, dst_l, w_l):
        out_t[s_].append(t_)
        out_w[s_].append(w_)
    cache: dict[int, tuple[list[int], list[float], float]] = {}

    residue = [0.0] * n
    reserve = [0.0] * n
    for k, b in zip(keys, bias):
        residue[k] = b
    heap = [(-residue[k], -k) for k in keys if residue[k] > 0.0]
    heapq.heapify(heap)
    keep = 1.0 - d
    pushes = 0
    dropped = 0.0
    converged = True

    while heap:
        neg_r, neg_u = heapq.heappop(heap)
        r, u = -neg_r, -neg_u
        if r <= thr:
            break
        if r != residue[u]:  # stale heap entry: u changed since this entry was pushed
            continue
        if pushes >= cap:
            converged = False
            break
        pushes += 1
        entry = cache.get(u)
        if entry is None:
            # Newest first, as the original's graph library yields them.
            targets = out_t[u][::-1]
            weights = out_w[u][::-1]
            total = 0.0
            for w_ in weights:
                total += w_
            if total != 0.0:
                weights = [w_ / total for w_ in weights]
            entry = (targets, weights, max(weights) if weights else 0.0)
            cache[u] = entry
        targets, weights, max_w = entry
        residue[u] = 0.0
        reserve[u] += keep * r
        if targets:
            if r * max_w > thr:
                for t_, w_ in zip(targets, weights):
                    v = residue[t_] + d * w_ * r
                    residue[t_] = v
                    if v > thr:
                        heapq.heappush(heap, (-v, -t_))
            else:
                dropped += d * r
        elif r / n_src > thr:
            share = d * r / n_src
            for k in keys:
                v = residue[k] + share
                residue[k] = v
                if v > thr:
                    heapq.heappush(heap, (-v, -k))
        else:
            dropped += d * r

    total = 0.0
    for v in reserve:
        total += v
    if return_stats:
        res_mass = 0.0
        for v in residue:
            res_mass += v
        stats = _make_stats(
            pushes,
            converged,
            torch.tensor(total, dtype=_F64),
            torch.tensor(res_mass, dtype=_F64),
            torch.tensor(dropped, dtype=_F64),
        )
    if total == 0.0:
        return (empty, stats) if return_stats else empty
    out = torch.tensor([v / total for v in reserve], dtype=_F64)
    return (out, stats) if return_stats else out
