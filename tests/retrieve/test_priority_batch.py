"""``mix_by_priority_batch`` gives exactly ``mix_by_priority`` per group: same ids, scores
and order (ties by first appearance), cut, bonus, equal-but-distinct id objects."""

from __future__ import annotations

import random

import pytest

from soulmem_torch.errors import ValidationError
from soulmem_torch.model import MemoryId
from soulmem_torch.retrieve.priority import mix_by_priority, mix_by_priority_batch


def _random_groups(rng: random.Random, ids: list[MemoryId], num_groups: int, width: int):
    groups = []
    for _ in range(num_groups):
        lists = []
        for _ in range(width):
            n = rng.randint(0, 8)
            # scores from a small set, so ties across lists and within a list are common
            items = [
                (rng.choice(ids), rng.choice([0.0, 0.25, 0.5, 0.5, 0.75, 1.0])) for _ in range(n)
            ]
            lists.append(items)
        groups.append(lists)
    return groups


@pytest.mark.parametrize("priorities", [[0, 0], [1, 3], [2, 0, 1]])
@pytest.mark.parametrize("top_k", [None, 0, 3, 10, -2])
def test_equals_the_per_group_mix(priorities, top_k):
    rng = random.Random(len(priorities) * 100 + (top_k or 0))
    ids = [MemoryId.new() for _ in range(12)]
    groups = _random_groups(rng, ids, 40, len(priorities))
    want = [mix_by_priority(g, priorities, top_k=top_k) for g in groups]
    got = mix_by_priority_batch(groups, priorities, top_k=top_k)
    assert got == want
    assert [[type(v) for _, v in row] for row in got] == [[float] * len(row) for row in got]


def test_equal_ids_that_are_distinct_objects_merge():
    a = MemoryId.new()
    twin = MemoryId(str(a))  # equal, not the same object
    b = MemoryId.new()
    groups = [[[(a, 0.5), (b, 0.4)], [(twin, 0.9)]], [[(twin, 0.1)], [(b, 0.2), (a, 0.3)]]]
    want = [mix_by_priority(g, [0, 0]) for g in groups]
    got = mix_by_priority_batch(groups, [0, 0])
    assert got == want == [[(a, 0.9), (b, 0.4)], [(b, 0.2), (a, 0.3)][::-1]]


def test_batch_of_one_and_empty_groups():
    a, b = MemoryId.new(), MemoryId.new()
    assert mix_by_priority_batch([[[(a, 0.2)], [(b, 0.2), (a, 0.1)]]], [0, 0]) == [
        [(a, 0.2), (b, 0.2)]
    ]
    assert mix_by_priority_batch([[[], []], [[], []]], [0, 0]) == [[], []]
    assert mix_by_priority_batch([], [0, 0]) == []


def test_nan_scores_follow_the_per_group_rules():
    a, b = MemoryId.new(), MemoryId.new()
    groups = [[[(a, float("nan")), (b, 0.3)], [(a, 0.9)]]]
    got = mix_by_priority_batch(groups, [0, 0])
    want = [mix_by_priority(groups[0], [0, 0])]
    assert [[k for k, _ in row] for row in got] == [[k for k, _ in row] for row in want]


def test_bad_inputs():
    a = MemoryId.new()
    with pytest.raises(ValidationError, match="groups\\[0\\]"):
        mix_by_priority_batch([[[(a, 0.1)]]], [0, 0])
    with pytest.raises(ValidationError, match="priorities"):
        mix_by_priority_batch([[[(a, 0.1)], []]], [0, -1])
