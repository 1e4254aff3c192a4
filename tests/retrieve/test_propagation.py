"""Association (``retrieve/propagation.py``) and the top-k of ``retrieve/columns.py``: the exact
top-k selection equals a stable descending sort (ties keep node order)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from soulmem_torch.retrieve.columns import topk_select


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(1, 40),
    b=st.integers(1, 4),
    k=st.integers(1, 45),
    seed=st.integers(0, 2**31 - 1),
)
def test_topk_select_equals_stable_sort(n: int, b: int, k: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 4, (n, b), generator=g).double()  # many ties
    present = torch.rand(n, b, generator=g) > 0.3
    _, values, index, valid = topk_select(scores, present, k)
    masked = torch.where(present, scores, torch.full_like(scores, float("-inf")))
    for c in range(b):
        vals, order = torch.sort(masked[:, c], descending=True, stable=True)
        ref = [(int(o), float(v)) for o, v in zip(order[:k], vals[:k]) if bool(present[o, c])]
        got = [(int(i), float(v)) for i, v, ok in zip(index[c], values[c], valid[c]) if ok]
        assert got == ref


def test_auto_method_is_exact_on_small_cpu_graphs_and_power_elsewhere() -> None:
    from soulmem_torch.retrieve.config import AUTO_SEQUENTIAL_MAX_NODES, PprMethod
    from soulmem_torch.retrieve.propagation import resolve_method

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_method(PprMethod.AUTO, num_nodes=34, device=cpu) is PprMethod.SEQUENTIAL
    big = AUTO_SEQUENTIAL_MAX_NODES + 1
    assert resolve_method(PprMethod.AUTO, num_nodes=big, device=cpu) is PprMethod.POWER
    assert resolve_method(PprMethod.AUTO, num_nodes=34, device=cuda) is PprMethod.POWER
    assert resolve_method(PprMethod.PUSH, num_nodes=34, device=cpu) is PprMethod.PUSH


def test_default_association_is_the_power_method_near_the_sequential_oracle() -> None:
    from soulmem_torch.retrieve import AssociationConfig, RetrAssociation
    from soulmem_torch.retrieve.config import PprMethod
    from tests.retrieve.helpers import small_world

    assert AssociationConfig().method is PprMethod.POWER
    wm, names = small_world()
    src = [(names["cafe"], 0.7), (names["rainy"], 0.4)]
    default = RetrAssociation().retrieve(AssociationConfig(top_k=7).into_request(wm, src))
    auto = RetrAssociation().retrieve(
        AssociationConfig(top_k=7, method="auto").into_request(wm, src)
    )
    oracle = RetrAssociation().retrieve(
        AssociationConfig(top_k=7, method="sequential").into_request(wm, src)
    )
    assert auto == oracle  # bit for bit
    got, want = dict(default), dict(oracle)
    assert set(got) == set(want)
    for mid, score in want.items():  # the push stops within its residue threshold (1e-5)
        assert got[mid] == pytest.approx(score, abs=1e-4)
