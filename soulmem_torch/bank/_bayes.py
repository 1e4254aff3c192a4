"""BayesAction on candidate rows: ``score[a] += prob · weight[s]`` over each asked agent's Proc
links, as ``functional.bayes`` on the agent's own graph (docs/spec.md §7)."""

from __future__ import annotations

import torch
from torch import Tensor

from soulmem_torch.bank._union import UnionSnapshot
from soulmem_torch.functional.codes import LINK_PROC, NODE_PROCEDURE

__all__ = ["candidate_bayes"]

_F64 = torch.float64
_I64 = torch.int64


def _proc_edges(union: UnionSnapshot) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Proc links into Procedure notes: ``(src, dst, prob, pptr)`` in agent order."""
    cached = union.cache.get("proc_edges")
    if cached is None:
        ei = union.edge_index
        sel = (union.edge_kind == LINK_PROC) & (union.node_type[ei[1]] == NODE_PROCEDURE)
        src, dst, prob = ei[0][sel], ei[1][sel], union.prob[sel]
        counts = torch.bincount(union.agent[src], minlength=union.num_agents)
        pptr = torch.zeros(union.num_agents + 1, dtype=_I64, device=src.device)
        torch.cumsum(counts, 0, out=pptr[1:])
        cached = union.cache["proc_edges"] = (src, dst, prob, pptr)
    return cached


def candidate_bayes(
    union: UnionSnapshot, agents: Tensor, weight: Tensor, keys: Tensor
) -> tuple[Tensor, Tensor]:
    """``score[a] += prob · weight[s]`` over each agent's Proc links, on candidate rows.

    Returns ``(scores (B, M) float64, candidates (B, M) bool)`` as
    ``bayes_action_scores`` / ``bayes_action_candidates`` on the agent's own graph.
    """
    b, m = weight.shape
    src, dst, prob, pptr = _proc_edges(union)
    scores = torch.zeros(b, m, dtype=_F64, device=weight.device)
    cand = torch.zeros(b, m, dtype=torch.bool, device=weight.device)
    if b == 0 or src.numel() == 0:
        return scores, cand
    start = pptr.index_select(0, agents)
    count = pptr.index_select(0, agents + 1) - start
    p = int(count.max())
    if p == 0:
        return scores, cand
    ar = torch.arange(p, device=weight.device)
    pvalid = ar.unsqueeze(0) < count.unsqueeze(1)
    e = torch.where(pvalid, start.unsqueeze(1) + ar.unsqueeze(0), 0)
    base = union.ptr.index_select(0, agents).unsqueeze(1)
    s_loc = torch.where(pvalid, src[e] - base, 0)
    d_loc = torch.where(pvalid, dst[e] - base, 0)
    pr = torch.where(pvalid, prob[e], 0.0)
    scores.scatter_add_(1, d_loc, pr * weight.gather(1, s_loc))
    hits = torch.zeros(b, m, dtype=_I64, device=weight.device)
    hits.scatter_add_(1, d_loc, (keys.gather(1, s_loc) & pvalid).to(_I64))
    return scores, hits > 0
