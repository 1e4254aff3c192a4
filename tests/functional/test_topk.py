"""stable_topk and similarity.topk equal the first k of a stable descending sort."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from soulmem_torch.errors import ValidationError
from soulmem_torch.functional.similarity import topk
from soulmem_torch.functional.topk import stable_topk


@settings(max_examples=120, deadline=None)
@given(
    rows=st.integers(1, 4),
    n=st.integers(1, 50),
    k=st.integers(0, 55),
    seed=st.integers(0, 2**31 - 1),
    with_nan=st.booleans(),
)
def test_topk_equals_stable_sort(rows: int, n: int, k: int, seed: int, with_nan: bool) -> None:
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 5, (rows, n), generator=g).float()  # many ties
    if with_nan:
        scores[torch.rand(rows, n, generator=g) < 0.2] = float("nan")
    values, index = topk(scores, k, dim=1)
    key = torch.where(torch.isnan(scores), torch.full_like(scores, float("-inf")), scores)
    ref = torch.sort(key, dim=1, descending=True, stable=True).indices[:, : min(k, n)]
    assert torch.equal(index, ref)
    assert torch.equal(values.nan_to_num(-1.0), scores.gather(1, ref).nan_to_num(-1.0))
    # along dim 0 as well
    _, index0 = topk(scores.T.contiguous(), k, dim=0)
    assert torch.equal(index0, ref.T)


def test_mask_and_padding() -> None:
    scores = torch.tensor([[3.0, 1.0, 2.0, 5.0]])
    mask = torch.tensor([[True, False, True, False]])
    values, index, valid = stable_topk(scores, 3, mask=mask)
    assert index[0, :2].tolist() == [0, 2] and valid[0].tolist() == [True, True, False]
    assert values[0, :2].tolist() == [3.0, 2.0]
    with pytest.raises(ValidationError, match="k"):
        stable_topk(scores, -1)
    v, i, ok = stable_topk(scores, 0)
    assert v.shape == (1, 0) and i.shape == (1, 0) and ok.shape == (1, 0)
