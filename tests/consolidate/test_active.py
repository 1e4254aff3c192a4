"""select_active_nodes: the issue's exact cases."""

from __future__ import annotations

import pytest

from soulmem_torch.consolidate import select_active_nodes
from soulmem_torch.errors import ValidationError
from soulmem_torch.model import MemoryId
from soulmem_torch.runtime import Record


def _records(ids, totals):
    out = {}
    for mid, total in zip(ids, totals):
        r = Record.new(mid)
        r.retrieval_count = total
        out[mid] = r
    return out


def test_hits_one_to_five_top_three():
    ids = [MemoryId() for _ in range(5)]
    hits = dict(zip(ids, [1, 2, 3, 4, 5]))
    out = select_active_nodes(_records(ids, [0] * 5), hits, top_k=3)
    assert [hits[i] for i in out] == [5, 4, 3]


def test_equal_hits_ordered_by_total_then_id():
    ids = [MemoryId() for _ in range(4)]
    recs = _records(ids, [7, 5, 2, 2])
    out = select_active_nodes(recs, dict.fromkeys(ids, 2), top_k=8)
    assert out[:2] == [ids[0], ids[1]]
    assert out[2:] == sorted(ids[2:])


def test_min_cycle_hits_and_edge_cases():
    ids = [MemoryId() for _ in range(3)]
    hits = dict(zip(ids, [1, 4, 0]))
    assert select_active_nodes(_records(ids, [9, 9, 9]), hits, min_cycle_hits=2) == [ids[1]]
    assert select_active_nodes({}, {}) == []
    assert select_active_nodes({}, hits, top_k=0) == []
    # a hit without a record has total 0: ranked after an equal hit with a record
    a, b = MemoryId(), MemoryId()
    out = select_active_nodes(_records([a], [3]), {a: 1, b: 1})
    assert out == [a, b]


@pytest.mark.parametrize("kwargs", [{"top_k": -1}, {"min_cycle_hits": -1}, {"top_k": 1.5}])
def test_bad_arguments(kwargs):
    with pytest.raises(ValidationError):
        select_active_nodes({}, {}, **kwargs)
