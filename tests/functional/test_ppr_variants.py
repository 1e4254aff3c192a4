"""Power iteration variants: ``local=True`` (reachable subgraph) and ``dtype=float32``."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from soulmem_torch.errors import ValidationError
from soulmem_torch.functional import build_transition, ppr_power_iteration


def _random_problem(seed: int, n: int, e: int, b: int, seeds_per_query: int):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, e), generator=g)
    w = torch.rand(e, generator=g, dtype=torch.float64)
    w[torch.rand(e, generator=g) < 0.1] = 0.0  # zero-weight edges (e.g. into procedures)
    op = build_transition(ei, w, num_nodes=n)
    p = torch.zeros(n, b, dtype=torch.float64)
    keys = torch.zeros(n, b, dtype=torch.bool)
    for j in range(b):
        idx = torch.randint(0, n, (seeds_per_query,), generator=g)
        p[idx, j] = torch.rand(seeds_per_query, generator=g, dtype=torch.float64) + 0.01
        keys[idx, j] = True
        keys[torch.randint(0, n, (1,), generator=g), j] = True  # a zero-weight key
    return op, p, keys


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    n=st.integers(8, 200),
    density=st.floats(0.2, 3.0),
    b=st.integers(1, 5),
    steps=st.integers(1, 30),
)
def test_local_equals_full(seed: int, n: int, density: float, b: int, steps: int) -> None:
    op, p, keys = _random_problem(seed, n, max(1, int(n * density)), b, 1)
    full = ppr_power_iteration(op, p, key_mask=keys, num_steps=steps)
    local = ppr_power_iteration(op, p, key_mask=keys, num_steps=steps, local=True)
    torch.testing.assert_close(local, full, atol=1e-13, rtol=0)


def test_local_on_a_localized_graph(device: torch.device) -> None:
    # the original's benchmark graph: every edge points into the first few nodes
    n = 3000
    src = torch.arange(n).repeat_interleave(6)
    dst = torch.cat([torch.arange(5), torch.tensor([0])]).repeat(n)
    dst[5::6] = torch.arange(n)  # self loops
    ei = torch.stack([src, dst]).to(device)
    op = build_transition(ei, torch.ones(ei.shape[1], dtype=torch.float64, device=device),
                          num_nodes=n)  # fmt: skip
    p = torch.zeros(n, 8, dtype=torch.float64, device=device)
    p[torch.arange(2000, 2008), torch.arange(8)] = 1.0
    full = ppr_power_iteration(op, p, tol=1e-8)
    local = ppr_power_iteration(op, p, tol=1e-8, local=True)
    torch.testing.assert_close(local, full, atol=1e-13, rtol=0)


@pytest.mark.parametrize("tol", [1e-4, 1e-5, 1e-6])
def test_float32_stays_within_tolerance(tol: float, device: torch.device) -> None:
    op, p, keys = _random_problem(7, 2000, 12000, 16, 3)
    op = op.to(device)
    exact = ppr_power_iteration(op, p.to(device), key_mask=keys.to(device), tol=1e-12)
    f32 = ppr_power_iteration(
        op, p.to(device), key_mask=keys.to(device), tol=tol, dtype=torch.float32
    )
    assert f32.dtype == torch.float64
    err = (f32 - exact).abs().sum(dim=0).max().item()
    assert err <= 2 * tol + 2e-6  # the float64 bound plus float32 rounding


def test_bad_dtype() -> None:
    op, p, _ = _random_problem(0, 10, 20, 1, 1)
    with pytest.raises(ValidationError, match="dtype"):
        ppr_power_iteration(op, p, dtype=torch.float16)
