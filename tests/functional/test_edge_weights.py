"""Dynamic edge weights (SPEC §5) against a scalar reference, float32 casts included."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from soulmem_torch.errors import ValidationError
from soulmem_torch.functional import (
    PREFERENCE_SEMANTIC,
    PREFERENCE_SITUATION,
    compute_rowptr,
    dynamic_edge_weight,
    normalized_edge_weight,
    out_weight_sum,
)
from soulmem_torch.functional.codes import (
    LINK_PROC,
    LINK_SEM,
    LINK_SIT_ABSTRACT_TO_SPECIFIC,
    LINK_SIT_SPECIFIC_TO_ABSTRACT,
    NODE_ABSTRACT,
    NODE_PROCEDURE,
    NODE_SEMANTIC,
    NODE_SPECIFIC,
    SITUATION_LINK_CONFIDENCE,
)

F64 = torch.float64
KINDS = [LINK_PROC, LINK_SEM, LINK_SIT_ABSTRACT_TO_SPECIFIC, LINK_SIT_SPECIFIC_TO_ABSTRACT]


def reference_weight(kind, intensity, confidence, target_type, pref, i_f, c_f):
    """One edge, scalar, in the original's operation order (Rust ``f32 as f64`` casts)."""
    if target_type == NODE_PROCEDURE:
        return 0.0
    if kind == LINK_PROC:
        cb, tb = 0.0, 0.0
    elif kind == LINK_SEM:
        cb, tb = float(np.float32(confidence)), pref[0]
    else:
        cb, tb = float(np.float32(0.8)), pref[1]
    den = i_f + c_f + tb
    if den == 0.0:
        return 0.0
    return (intensity * i_f + cb * c_f + tb) / den


def test_situation_confidence_constant_is_float32_point_eight():
    assert SITUATION_LINK_CONFIDENCE == float(np.float32(0.8))


def test_semantic_edge_snapshot(device):
    # association.rs test_dyn_weight_func_semantic_edge: Sem(0.7), Semantic preference,
    # i_f = c_f = 1.0; snapshot 0.88888888447373.
    w = dynamic_edge_weight(
        torch.tensor([[0], [1]], device=device),
        torch.tensor([LINK_SEM], device=device),
        torch.tensor([1.0], dtype=F64, device=device),
        torch.tensor([0.7], dtype=torch.float32, device=device),
        torch.tensor([NODE_SEMANTIC, NODE_SEMANTIC], device=device),
        preference=PREFERENCE_SEMANTIC,
        intensity_factor=1.0,
        confidence_factor=1.0,
    )
    assert w.device.type == device.type and w.dtype == F64
    assert w.item() == 0.88888888447373


@settings(max_examples=60, deadline=None)
@given(
    edges=st.lists(
        st.tuples(
            st.sampled_from(KINDS),
            st.floats(-2.0, 5.0, allow_nan=False),
            st.floats(0.0, 1.0),
            st.sampled_from([NODE_SEMANTIC, NODE_SPECIFIC, NODE_ABSTRACT, NODE_PROCEDURE]),
        ),
        min_size=1,
        max_size=20,
    ),
    pref=st.sampled_from(
        [PREFERENCE_SITUATION, PREFERENCE_SEMANTIC, (0.0, 0.0), (0.123456789, 2.5)]
    ),
    i_f=st.sampled_from([1.0, 0.0, 0.3, 2.75]),
    c_f=st.sampled_from([0.8, 0.0, 1.0, 0.1]),
)
def test_matches_scalar_reference_bit_for_bit(edges, pref, i_f, c_f):
    n = len(edges) + 1
    node_type = [NODE_SEMANTIC] + [e[3] for e in edges]  # edge i: node 0 -> node i + 1
    edge_index = torch.stack([torch.zeros(len(edges), dtype=torch.int64), torch.arange(1, n)])
    got = dynamic_edge_weight(
        edge_index,
        torch.tensor([e[0] for e in edges]),
        torch.tensor([e[1] for e in edges], dtype=F64),
        torch.tensor([e[2] for e in edges], dtype=F64),  # f64 in: rounded to f32 first
        torch.tensor(node_type),
        preference=pref,
        intensity_factor=i_f,
        confidence_factor=c_f,
    )
    expected = [reference_weight(*e[:3], e[3], pref, i_f, c_f) for e in edges]
    assert got.tolist() == expected


def test_each_rule():
    # Sem (0.5), Situation both ways, Proc, and an edge into a Procedure note.
    edge_index = torch.tensor([[0, 0, 0, 0, 0], [1, 2, 3, 4, 5]])
    kind = torch.tensor(
        [
            LINK_SEM,
            LINK_SIT_ABSTRACT_TO_SPECIFIC,
            LINK_SIT_SPECIFIC_TO_ABSTRACT,
            LINK_PROC,
            LINK_SEM,
        ]
    )
    node_type = torch.tensor([NODE_SEMANTIC] * 5 + [NODE_PROCEDURE])
    w = dynamic_edge_weight(
        edge_index,
        kind,
        torch.full((5,), 2.0, dtype=F64),
        torch.full((5,), 0.5, dtype=torch.float32),
        node_type,
    )
    sit = (2.0 + SITUATION_LINK_CONFIDENCE * 0.8 + 0.7) / (1.0 + 0.8 + 0.7)
    assert w.tolist() == [
        (2.0 + 0.5 * 0.8 + 0.3) / (1.0 + 0.8 + 0.3),
        sit,
        sit,
        2.0 / 1.8,
        0.0,
    ]


def test_zero_denominator_gives_zero_not_nan():
    # i_f = c_f = 0 and a Proc link: den == 0.
    w = dynamic_edge_weight(
        torch.tensor([[0, 0], [1, 1]]),
        torch.tensor([LINK_PROC, LINK_SEM]),
        torch.ones(2, dtype=F64),
        torch.ones(2, dtype=torch.float32),
        torch.tensor([NODE_SEMANTIC, NODE_SEMANTIC]),
        preference=PREFERENCE_SEMANTIC,
        intensity_factor=0.0,
        confidence_factor=0.0,
    )
    assert w.tolist() == [0.0, 1.0]


def test_empty_graph():
    w = dynamic_edge_weight(
        torch.zeros(2, 0, dtype=torch.int64),
        torch.zeros(0, dtype=torch.int64),
        torch.zeros(0, dtype=F64),
        torch.zeros(0),
        torch.zeros(0, dtype=torch.int64),
    )
    assert w.shape == (0,) and w.dtype == F64


def test_uint8_kinds_and_device(device):
    w = dynamic_edge_weight(
        torch.tensor([[0], [1]], device=device),
        torch.tensor([LINK_SIT_SPECIFIC_TO_ABSTRACT], dtype=torch.uint8, device=device),
        torch.tensor([1.0], dtype=F64, device=device),
        torch.zeros(1, device=device),
        torch.tensor([NODE_SPECIFIC, NODE_ABSTRACT], device=device),
    )
    assert w.device.type == device.type
    assert w.item() == (1.0 + SITUATION_LINK_CONFIDENCE * 0.8 + 0.7) / 2.5


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"intensity_factor": -1.0}, "intensity_factor"),
        ({"intensity_factor": float("nan")}, "intensity_factor"),
        ({"confidence_factor": float("inf")}, "confidence_factor"),
        ({"confidence_factor": "x"}, "confidence_factor"),
        ({"preference": (0.3, -0.7)}, "situation_boost"),
        ({"preference": (float("nan"), 0.7)}, "semantic_boost"),
        ({"preference": (0.3,)}, "preference"),
        ({"edge_kind": torch.tensor([9])}, "edge_kind"),
        ({"edge_kind": torch.tensor([1, 1])}, "edge_kind"),
        ({"intensity": torch.ones(2, dtype=F64)}, "intensity"),
        ({"edge_index": torch.tensor([[0], [5]])}, "edge_index"),
        ({"edge_index": torch.tensor([0, 1])}, "edge_index"),
        ({"edge_index": torch.tensor([[0.0], [1.0]])}, "integer"),
    ],
)
def test_rejects(kwargs, match):
    args = {
        "edge_index": torch.tensor([[0], [1]]),
        "edge_kind": torch.tensor([LINK_SEM]),
        "intensity": torch.ones(1, dtype=F64),
        "confidence": torch.ones(1),
        "node_type": torch.tensor([NODE_SEMANTIC, NODE_SEMANTIC]),
    }
    args.update(kwargs)
    tensors = [args.pop(k) for k in ("edge_index", "edge_kind", "intensity", "confidence")]
    with pytest.raises(ValidationError, match=match):
        dynamic_edge_weight(*tensors, args.pop("node_type"), **args)


def test_normalized_edge_weight(device):
    edge_index = torch.tensor([[0, 0, 0, 1, 2, 2], [1, 2, 0, 2, 0, 1]], device=device)
    weight = torch.tensor([1.0, 3.0, 0.0, 2.0, 0.0, 0.0], dtype=F64, device=device)
    got = normalized_edge_weight(edge_index, weight, num_nodes=4)
    assert got.tolist() == [0.25, 0.75, 0.0, 1.0, 0.0, 0.0]  # node 2 sums to 0: kept
    assert out_weight_sum(edge_index, weight, num_nodes=4).tolist() == [4.0, 2.0, 0.0, 0.0]
    with pytest.raises(ValidationError, match="edge_weight"):
        normalized_edge_weight(edge_index, weight[:2], num_nodes=4)


def test_compute_rowptr():
    assert compute_rowptr(torch.tensor([0, 0, 2, 2, 2]), num_nodes=4).tolist() == [0, 2, 2, 5, 5]
    assert compute_rowptr(torch.zeros(0, dtype=torch.int64), num_nodes=2).tolist() == [0, 0, 0]
    with pytest.raises(ValidationError, match="sorted"):
        compute_rowptr(torch.tensor([1, 0]), num_nodes=2)
    with pytest.raises(ValidationError, match=r"\[0, 2\)"):
        compute_rowptr(torch.tensor([0, 3]), num_nodes=2)
