"""MemoryRetriever: buffers move with .to(), forward matches numpy cosine, association = PPR."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from soulmem_torch.errors import ValidationError
from soulmem_torch.functional import build_transition, dynamic_edge_weight, ppr_power_iteration
from soulmem_torch.graph import MemoryGraph
from soulmem_torch.nn import MemoryRetriever


def _graph(n: int = 30, e: int = 90, seed: int = 0) -> MemoryGraph:
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, e), generator=g)
    return MemoryGraph.from_tensors(
        ei,
        num_nodes=n,
        edge_kind=torch.randint(1, 4, (e,), generator=g),
        node_type=torch.randint(0, 3, (n,), generator=g),
        intensity=torch.rand(e, generator=g, dtype=torch.float64),
        confidence=torch.rand(e, generator=g),
    )


def test_forward_matches_numpy_cosine(device: torch.device) -> None:
    graph = _graph()
    x = torch.randn(30, 16)
    module = MemoryRetriever(graph, note_embeddings=x, k=5).to(device)
    assert module.note_unit.device.type == device.type
    q = torch.randn(4, 16)
    idx, scores = module(q.to(device))
    xn = x.numpy() / np.linalg.norm(x.numpy(), axis=1, keepdims=True)
    qn = q.numpy() / np.linalg.norm(q.numpy(), axis=1, keepdims=True)
    ref = qn @ xn.T
    ref_idx = np.argsort(-ref, axis=1)[:, :5]
    assert np.array_equal(idx.cpu().numpy(), ref_idx)
    np.testing.assert_allclose(scores.cpu().numpy(), np.take_along_axis(ref, ref_idx, 1), rtol=1e-5)


def test_associate_equals_power_iteration(device: torch.device) -> None:
    graph = _graph()
    module = MemoryRetriever(graph, note_embeddings=torch.randn(30, 8), k=3).to(device)
    idx, scores = module(torch.randn(2, 8, device=device))
    a_idx, a_val = module.associate(idx, scores)
    w = dynamic_edge_weight(graph.edge_index, graph.edge_kind, graph.intensity, graph.confidence,
                            graph.node_type)  # fmt: skip
    op = build_transition(graph.edge_index, w, num_nodes=30)
    p = torch.zeros(30, 2, dtype=torch.float64)
    for b in range(2):
        p[idx[b].cpu(), b] = scores[b].cpu().double().clamp_min(0)
    keys = p > 0
    ref = ppr_power_iteration(op, p, key_mask=keys, tol=module.config.power_tol)
    ref_val, _ = torch.topk(ref.T, module.config.top_k, dim=1)
    torch.testing.assert_close(a_val.cpu(), ref_val, atol=1e-9, rtol=0)
    assert a_idx.shape == (2, module.config.top_k)


def test_bad_inputs() -> None:
    graph = _graph()
    with pytest.raises(ValidationError, match="note_embeddings"):
        MemoryRetriever(graph, note_embeddings=torch.randn(29, 8))
    with pytest.raises(ValidationError, match="k"):
        MemoryRetriever(graph, note_embeddings=torch.randn(30, 8), k=0)
    module = MemoryRetriever(graph, note_embeddings=torch.randn(30, 8))
    with pytest.raises(ValidationError, match="query"):
        module(torch.randn(2, 7))
    zero = module.scores(torch.zeros(1, 8))
    assert torch.all(zero == 0)  # an all-zero query has cosine 0 with every note
