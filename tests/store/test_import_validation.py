"""What an import file may hold: one note per id (or an explicit policy), and integers inside
the original's Rust types (``retrieval_count: usize``)."""

from __future__ import annotations

import json

import pytest

from soulmem_torch.errors import ValidationError
from soulmem_torch.forget.decay import note_time_tensors
from soulmem_torch.model import MemoryNote
from soulmem_torch.model.serde_io import parse_notes_text
from tests.store._helpers import note

U64_MAX = 2**64 - 1


def _line(i: int, **changes: object) -> str:
    data = json.loads(note(i).to_json())
    data.update(changes)
    return json.dumps(data, ensure_ascii=False)


def test_duplicate_ids_are_rejected_naming_both_lines() -> None:
    text = "\n".join([_line(1), _line(2), "", _line(1, tags=["second copy"])]) + "\n"
    with pytest.raises(
        ValidationError,
        match=r"x.jsonl: 1 duplicate note id\(s\): line 4 "
        r"repeats note id 00000000-0000-4000-8000-000000000001 of line 1",
    ):
        parse_notes_text(text, source="x.jsonl")


def test_duplicate_ids_in_an_array_name_both_items() -> None:
    text = "[" + ",".join([_line(1), _line(1), _line(1)]) + "]"
    with pytest.raises(
        ValidationError,
        match=r"2 duplicate .*item 1 repeats .* of item 0; "
        r"item 2 repeats .* of item 0",
    ):
        parse_notes_text(text)


def test_duplicate_policies_first_and_last() -> None:
    text = "\n".join([_line(1, tags=["a"]), _line(2), _line(1, tags=["b"])])
    first = parse_notes_text(text, on_duplicate="first")
    last = parse_notes_text(text, on_duplicate="last")
    assert [n.id for n in first] == [n.id for n in last] == [note(1).id, note(2).id]
    assert first[0].tags == ["a"] and last[0].tags == ["b"]
    with pytest.raises(ValidationError, match="on_duplicate: expected one of reject, first, last"):
        parse_notes_text(text, on_duplicate="merge")


@pytest.mark.parametrize("value", [-1, U64_MAX + 1, 10**30])
def test_retrieval_count_outside_usize_is_rejected_naming_the_field(value: int) -> None:
    with pytest.raises(ValidationError, match=r"line 1: retrieval_count: Input should be"):
        parse_notes_text(_line(1, retrieval_count=value))


def test_retrieval_count_at_usize_max_round_trips_and_decays() -> None:
    line = _line(1, retrieval_count=U64_MAX)
    (parsed,) = parse_notes_text(line)
    assert parsed.retrieval_count == U64_MAX
    assert json.loads(parsed.to_json()) == json.loads(line)
    _, counts = note_time_tensors([parsed, MemoryNote.model_validate_json(_line(2))])
    assert counts.tolist() == [2**63 - 1, 0]  # saturates; decay reads min(count, cap)


def test_duplicate_readable_ids_in_a_graph_name_both_nodes() -> None:
    from soulmem_torch.data import sample_memory_path
    from soulmem_torch.errors import GraphLoadError
    from soulmem_torch.model.soul_tune import parse_soul_tune_graph

    nodes = json.loads(sample_memory_path().read_text(encoding="utf-8"))
    dup = nodes[3]["id"]
    with pytest.raises(GraphLoadError, match=rf"{dup}: duplicate readable id \(nodes #3 and #77\)"):
        parse_soul_tune_graph([*nodes, nodes[3]], source="g.json")
