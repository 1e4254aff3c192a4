"""BayesAction scores against the original's tests and a scalar reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from soulmem_torch.errors import ValidationError
from soulmem_torch.functional import bayes_action_candidates, bayes_action_scores
from soulmem_torch.functional.codes import (
    LINK_PROC,
    LINK_SEM,
    LINK_SIT_ABSTRACT_TO_SPECIFIC,
    NODE_PROCEDURE,
    NODE_SEMANTIC,
    NODE_SPECIFIC,
)

F64 = torch.float64


def test_basic_prob_times_weight(device):
    # bayes_action.rs test_retr_bayes_action_basic: prob 0.5, weight 0.8 -> exactly 0.4.
    scores = bayes_action_scores(
        torch.tensor([0.8, 0.0], dtype=F64, device=device),
        torch.tensor([[0], [1]], device=device),
        torch.tensor([LINK_PROC], device=device),
        torch.tensor([0.5], dtype=F64, device=device),
        torch.tensor([NODE_SEMANTIC, NODE_PROCEDURE], device=device),
    )
    assert scores.device.type == device.type
    assert scores.tolist() == [0.0, 0.4]


def test_multi_source_aggregation_snapshot():
    # test_multi_source_action_aggregation: (src_a 0.8, prob 0.6), (src_b 0.5, prob 0.4)
    # -> snapshot 0.6799999999999999.
    scores = bayes_action_scores(
        torch.tensor([0.8, 0.5, 0.0], dtype=F64),
        torch.tensor([[0, 1], [2, 2]]),
        torch.tensor([LINK_PROC, LINK_PROC]),
        torch.tensor([0.6, 0.4], dtype=F64),
        torch.tensor([NODE_SEMANTIC, NODE_SEMANTIC, NODE_PROCEDURE]),
    )
    assert scores[2].item() == 0.6799999999999999


def test_multi_action_inference_snapshot():
    # test_multi_action_inference: one source (1.0) -> A (0.7), -> B (0.3).
    scores = bayes_action_scores(
        torch.tensor([1.0, 0.0, 0.0], dtype=F64),
        torch.tensor([[0, 0], [1, 2]]),
        torch.tensor([LINK_PROC, LINK_PROC]),
        torch.tensor([0.7, 0.3], dtype=F64),
        torch.tensor([NODE_SEMANTIC, NODE_PROCEDURE, NODE_PROCEDURE]),
    )
    assert scores.tolist() == [0.0, 0.7, 0.3]


def test_only_proc_links_into_procedure_notes_count():
    edge_index = torch.tensor([[0, 0, 0, 0], [1, 1, 2, 3]])
    kind = torch.tensor([LINK_PROC, LINK_SEM, LINK_PROC, LINK_SIT_ABSTRACT_TO_SPECIFIC])
    prob = torch.tensor([0.5, 9.0, 0.25, 9.0], dtype=F64)
    node_type = torch.tensor([NODE_SPECIFIC, NODE_PROCEDURE, NODE_SEMANTIC, NODE_PROCEDURE])
    weight = torch.tensor([[2.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]], dtype=F64)
    scores = bayes_action_scores(weight, edge_index, kind, prob, node_type)
    assert scores.tolist() == [[0.0, 0.0], [1.0, 0.0], [0.0, 0.0], [0.0, 0.0]]
    candidates = bayes_action_candidates(weight != 0, edge_index, kind, node_type)
    assert candidates[:, 0].tolist() == [False, True, False, False]
    assert not candidates[:, 1].any()


def test_zero_weight_source_is_a_candidate_with_score_zero():
    edge_index = torch.tensor([[0], [1]])
    kind = torch.tensor([LINK_PROC])
    node_type = torch.tensor([NODE_SEMANTIC, NODE_PROCEDURE])
    scores = bayes_action_scores(
        torch.zeros(2, dtype=F64), edge_index, kind, torch.tensor([0.5], dtype=F64), node_type
    )
    cand = bayes_action_candidates(torch.tensor([True, False]), edge_index, kind, node_type)
    assert scores.tolist() == [0.0, 0.0] and cand.tolist() == [False, True]


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_matches_scalar_reference_and_batches(data):
    n = data.draw(st.integers(1, 12))
    num_e = data.draw(st.integers(0, 30))
    edges = data.draw(
        st.lists(
            st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)),
            min_size=num_e,
            max_size=num_e,
        )
    )
    kinds = data.draw(st.lists(st.sampled_from([0, 1, 2, 3]), min_size=num_e, max_size=num_e))
    probs = data.draw(st.lists(st.floats(0.0, 1.0), min_size=num_e, max_size=num_e))
    types = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    b = data.draw(st.integers(1, 3))
    weights = data.draw(
        st.lists(st.lists(st.floats(0.0, 1.0), min_size=b, max_size=b), min_size=n, max_size=n)
    )
    edge_index = torch.tensor(edges, dtype=torch.int64).reshape(-1, 2).T
    w = torch.tensor(weights, dtype=F64)
    got = bayes_action_scores(
        w, edge_index, torch.tensor(kinds), torch.tensor(probs, dtype=F64), torch.tensor(types)
    )
    for q in range(b):
        expected = [0.0] * n
        for (s, t), k, p in zip(edges, kinds, probs):
            if k == LINK_PROC and types[t] == NODE_PROCEDURE:
                expected[t] += p * weights[s][q]
        torch.testing.assert_close(got[:, q], torch.tensor(expected, dtype=F64), rtol=1e-15, atol=0)
        one = bayes_action_scores(
            w[:, q],
            edge_index,
            torch.tensor(kinds),
            torch.tensor(probs, dtype=F64),
            torch.tensor(types),
        )
        assert torch.equal(one, got[:, q])


def test_sparse_source_weights():
    dense = torch.tensor([[0.8, 0.0], [0.0, 0.0]], dtype=F64)
    args = (
        torch.tensor([[0], [1]]),
        torch.tensor([LINK_PROC]),
        torch.tensor([0.5], dtype=F64),
        torch.tensor([NODE_SEMANTIC, NODE_PROCEDURE]),
    )
    assert torch.equal(
        bayes_action_scores(dense.to_sparse(), *args), bayes_action_scores(dense, *args)
    )


@pytest.mark.parametrize(
    ("weight", "prob", "match"),
    [
        (torch.tensor([float("nan"), 0.0], dtype=F64), torch.tensor([0.5], dtype=F64), "finite"),
        (torch.ones(3, dtype=F64), torch.tensor([0.5], dtype=F64), "shape"),
        (torch.ones(2, dtype=F64), torch.tensor([float("inf")], dtype=F64), "prob"),
        (torch.ones(2, dtype=F64), torch.ones(2, dtype=F64), "prob"),
    ],
)
def test_rejects(weight, prob, match):
    with pytest.raises(ValidationError, match=match):
        bayes_action_scores(
            weight,
            torch.tensor([[0], [1]]),
            torch.tensor([LINK_PROC]),
            prob,
            torch.tensor([NODE_SEMANTIC, NODE_PROCEDURE]),
        )
    with pytest.raises(ValidationError, match="bool"):
        bayes_action_candidates(
            torch.ones(2),
            torch.tensor([[0], [1]]),
            torch.tensor([LINK_PROC]),
            torch.tensor([NODE_SEMANTIC, NODE_PROCEDURE]),
        )
