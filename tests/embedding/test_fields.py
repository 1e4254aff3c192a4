"""``stack_compact_field_embeddings``: the bulk path (stack, then one check) gives the same tables
as the vector-by-vector checked path, and a bad vector is still named."""

from __future__ import annotations

import pytest
import torch

from soulmem_torch.embedding import MemoryEmbedding, stack_compact_field_embeddings
from soulmem_torch.embedding.fields import FIELD_NAMES, _stack_compact_checked
from soulmem_torch.errors import ValidationError


def _embeddings(seed: int = 0, n: int = 40, d: int = 8) -> list[MemoryEmbedding | None]:
    g = torch.Generator().manual_seed(seed)
    shared = torch.randn(6, d, generator=g)  # views of one buffer, some shared between notes
    out: list[MemoryEmbedding | None] = []
    for i in range(n):
        if i % 7 == 3:
            out.append(None)
            continue
        names = [FIELD_NAMES[k] for k in torch.randperm(len(FIELD_NAMES), generator=g)[: i % 5]]
        fields = {
            name: shared[(i + k) % 6] if k % 2 else torch.randn(d, generator=g)
            for k, name in enumerate(names)
        }
        if i % 11 == 0:
            fields["not_a_field"] = torch.ones(d)  # ignored
        out.append(MemoryEmbedding(tag=torch.randn(d, generator=g), fields=fields))
    return out


@pytest.mark.parametrize("every_note", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bulk_stacking_equals_the_checked_path_bit_for_bit(seed: int, every_note: bool) -> None:
    embs = _embeddings(seed)
    if every_note:
        embs = [e for e in embs if e is not None]
    fast = stack_compact_field_embeddings(embs)
    slow = _stack_compact_checked(embs, len(embs), 8)
    for a, b in zip(fast, slow):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)
    # shared memory is stored once per field
    assert fast[2].shape[0] < int((fast[3] >= 0).sum())


def test_mixed_float_dtypes_are_cast_as_the_checked_path_casts() -> None:
    embs = _embeddings(3)
    for e in embs[:10]:
        if e is not None:
            e.tag = e.tag.double()
            e.fields = {k: v.half() for k, v in e.fields.items()}
    fast = stack_compact_field_embeddings(embs)
    slow = _stack_compact_checked(embs, len(embs), 8)
    assert all(torch.equal(a, b) for a, b in zip(fast, slow))
    assert fast[0].dtype == torch.float32 and fast[2].dtype == torch.float32


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (lambda d: torch.full((d,), float("nan")), "expected finite values"),
        (lambda d: torch.ones(d + 1), "expected width 8"),
        (lambda d: torch.ones(d, dtype=torch.int64), "expected a 1-D float tensor"),
        (lambda d: torch.ones(1, d), "expected a 1-D float tensor"),
        (lambda d: "not a vector", "expected a 1-D float tensor"),
    ],
)
def test_a_bad_vector_is_named(bad, message: str) -> None:
    embs = _embeddings(4)
    embs[12] = MemoryEmbedding(tag=torch.ones(8), fields={"narrative": bad(8)})
    with pytest.raises(ValidationError, match=r"embeddings\[12\]\.fields\['narrative'\]") as info:
        stack_compact_field_embeddings(embs)
    assert message in str(info.value)


def test_a_bad_tag_and_a_bad_entry_are_named() -> None:
    embs = _embeddings(5)
    embs[9] = MemoryEmbedding(tag=torch.tensor([float("inf")] * 8), fields={})
    with pytest.raises(ValidationError, match=r"embeddings\[9\]\.tag: expected finite"):
        stack_compact_field_embeddings(embs)
    embs = _embeddings(5)
    embs[2] = "x"  # type: ignore[call-overload]
    with pytest.raises(ValidationError, match=r"embeddings\[2\]: expected a MemoryEmbedding"):
        stack_compact_field_embeddings(embs)


def test_a_float64_value_past_float32s_range_is_named() -> None:
    embs = _embeddings(6)
    big = torch.zeros(8, dtype=torch.float64)
    big[2] = 1e300  # finite as float64, inf as float32
    embs[5] = MemoryEmbedding(tag=torch.ones(8), fields={"event_action": big})
    with pytest.raises(
        ValidationError, match=r"embeddings\[5\]\.fields\['event_action'\]: .*float32"
    ):
        stack_compact_field_embeddings(embs)
    embs[5] = MemoryEmbedding(tag=big, fields={})
    with pytest.raises(ValidationError, match=r"embeddings\[5\]\.tag: .*float32"):
        stack_compact_field_embeddings(embs)
