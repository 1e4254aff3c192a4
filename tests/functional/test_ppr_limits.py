"""Kernel bounds (issue 11 item 6), each reproduced on the code before:

* ``ppr_power_iteration`` with damping 0.999999 ran 13.8M steps → now a clear error naming the
  damping and the tolerance (``MAX_POWER_STEPS``); the configs bound ``damping_factor``;
* the sequential push accepted negative edge weights (the other methods reject them);
* a personalization whose column sum overflows gave an ``IndexError`` (push / power) or a
  silently empty result (sequential);
* ``cosine_scores`` returned NaN rows for a NaN / inf query.
"""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError as PydanticValidationError

from soulmem_torch.errors import SoulMemError, ValidationError
from soulmem_torch.functional import (
    MAX_POWER_STEPS,
    build_transition,
    cosine_scores,
    power_iteration_steps,
    ppr_forward_push,
    ppr_naive,
    ppr_power_iteration,
    ppr_sequential_push,
)
from soulmem_torch.retrieve import (
    AssociateWithActionConfig,
    AssociationConfig,
    parse_request_config,
)
from soulmem_torch.retrieve.config import MAX_DAMPING_FACTOR

F64 = torch.float64


def ring(device: torch.device, n: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.arange(n, device=device)
    edge_index = torch.stack([src, (src + 1) % n])
    return edge_index, torch.ones(n, dtype=F64, device=device)


# ---- the power iteration's step cap ----------------------------------------------------------
def test_step_count_is_capped_with_a_clear_error(device: torch.device) -> None:
    edge_index, w = ring(device)
    op = build_transition(edge_index, w, num_nodes=5)
    p = torch.tensor([1.0, 0, 0, 0, 0], dtype=F64, device=device)
    with pytest.raises(ValidationError, match=r"damping=0\.999999 with tol=1e-06 needs 13815\d{3}"):
        ppr_power_iteration(op, p, damping=0.999999)
    with pytest.raises(ValidationError, match="MAX_POWER_STEPS"):
        ppr_power_iteration(op, p, damping=0.99, tol=1e-300)
    with pytest.raises(ValidationError, match="num_steps: expected at most"):
        ppr_power_iteration(op, p, damping=0.5, num_steps=MAX_POWER_STEPS + 1)
    # the largest config damping at a tiny tol stays under the cap and converges
    d = MAX_DAMPING_FACTOR
    x = ppr_power_iteration(op, p, damping=d, tol=1e-12)
    shift = torch.roll(torch.eye(5, dtype=F64), 1, dims=0)  # P^T of the ring
    exact = (1 - d) * torch.linalg.solve(torch.eye(5, dtype=F64) - d * shift, p.cpu())
    assert torch.allclose(x.cpu(), exact / exact.sum(), atol=1e-10)


def test_power_iteration_steps_bounds() -> None:
    assert power_iteration_steps(0.99, 1e-9) == 2061
    assert power_iteration_steps(MAX_DAMPING_FACTOR, 1e-40) <= MAX_POWER_STEPS
    with pytest.raises(ValidationError, match="damping / tol"):
        power_iteration_steps(0.9999, 1e-9)


def test_config_bounds_damping() -> None:
    assert AssociationConfig(damping_factor=MAX_DAMPING_FACTOR).damping_factor == 0.99
    for bad in (0.999999, 0.995, 1.0, -0.1, math.nan):
        with pytest.raises(PydanticValidationError, match="damping_factor"):
            AssociationConfig(damping_factor=bad)
    with pytest.raises(PydanticValidationError, match="damping_factor"):
        AssociateWithActionConfig(association={"damping_factor": 0.999999})
    with pytest.raises((PydanticValidationError, SoulMemError), match="damping_factor"):
        parse_request_config('{"type": "Association", "damping_factor": 0.999999}')


# ---- negative weights ------------------------------------------------------------------------
def test_sequential_push_rejects_negative_weights() -> None:
    edge_index, w = ring(torch.device("cpu"))
    w[2] = -0.5
    with pytest.raises(
        ValidationError, match=r"edge_weight: expected weights >= 0, found -0\.5 at edge 2"
    ):
        ppr_sequential_push(
            edge_index, w, torch.tensor([0]), torch.tensor([1.0], dtype=F64), num_nodes=5
        )
    with pytest.raises(ValidationError, match="edge_weight: expected weights >= 0"):
        build_transition(edge_index, w, num_nodes=5)  # as the batched methods do


# ---- overflowing seed sums -------------------------------------------------------------------
def test_overflowing_personalization_sum_is_a_clear_error(device: torch.device) -> None:
    edge_index, w = ring(device)
    op = build_transition(edge_index, w, num_nodes=5)
    huge = torch.tensor(
        [[1e308, 1.0], [1e308, 0.0], [0, 0], [0, 0], [0, 0]], dtype=F64, device=device
    )
    for run in (
        lambda: ppr_power_iteration(op, huge),
        lambda: ppr_forward_push(op, huge),
        lambda: ppr_naive(edge_index, huge, num_nodes=5, damping=0.5, nb_iter=3),
    ):
        with pytest.raises(ValidationError, match="column 0 summing to inf"):
            run()
    # a non-finite entry is still reported as such
    bad = huge.clone()
    bad[3, 1] = math.inf
    with pytest.raises(ValidationError, match="finite entries, found inf at node 3"):
        ppr_power_iteration(op, bad)


def test_sequential_push_overflowing_sum() -> None:
    edge_index, w = ring(torch.device("cpu"))
    with pytest.raises(ValidationError, match="sum that fits a float64, found inf"):
        ppr_sequential_push(
            edge_index,
            w,
            torch.tensor([0, 1]),
            torch.tensor([1e308, 1e308], dtype=F64),
            num_nodes=5,
        )


# ---- cosine_scores ---------------------------------------------------------------------------
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_cosine_scores_rejects_non_finite_queries(device: torch.device, value: float) -> None:
    x = torch.randn(4, 3, device=device)
    q = torch.ones(2, 3, device=device)
    q[1, 2] = value
    with pytest.raises(
        ValidationError, match=r"query: expected finite values, found NaN or inf in row 1"
    ):
        cosine_scores(q, x)
    with pytest.raises(ValidationError, match="row 0"):
        cosine_scores(q[1], x)  # a single (D,) query
    assert cosine_scores(q[0], x).shape == (4,)
