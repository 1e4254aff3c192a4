"""The original's evaluation-graph format: repairs, id maps, and rejecting bad LLM output."""

from __future__ import annotations

import pytest

from soulmem_torch.errors import GraphLoadError
from soulmem_torch.model import AbstractToSpecific, SpecificSituation, TrigToAction
from soulmem_torch.model.soul_tune import (
    dump_soul_tune_graph,
    load_soul_tune_graph,
    parse_soul_tune_graph,
)
from tests.conftest import fixture_path


def test_congyu_loads() -> None:
    graph = load_soul_tune_graph(fixture_path("soul_tune", "congyu", "graph.json"))
    assert len(graph.notes) == 34
    assert graph.num_links == 61
    assert len(graph.id_map) == 34
    self_id = graph.id_map["sem_self"]
    note = next(n for n in graph.notes if n.id == self_id)
    assert note.mem_type.content == "丛雨"
    assert all(link.from_ == self_id for link in note.mem_links)
    # the repair of time_span: null
    night = next(n for n in graph.notes if n.id == graph.id_map["sit_night_raid_confession"])
    assert isinstance(night.mem_type, SpecificSituation)
    assert night.mem_type.time_span.to_rfc3339() == "1970-01-01T00:00:00Z"


def test_round_trip_through_graph_format() -> None:
    graph = load_soul_tune_graph(fixture_path("soul_tune", "congyu", "graph.json"))
    again = parse_soul_tune_graph(dump_soul_tune_graph(graph.notes, graph.readable_ids))
    assert sorted(again.id_map) == sorted(graph.id_map)
    assert again.num_links == 61


def test_negative_file_names_all_eleven_bad_nodes() -> None:
    path = fixture_path("soul_tune", "negative", "fuhua_raw_failed_nodes.json")
    with pytest.raises(GraphLoadError) as info:
        load_soul_tune_graph(path)
    problems = info.value.problems
    assert len(problems) == 11
    text = str(info.value)
    assert "11 of 65" in text
    for rid, why in problems:
        assert rid in text
        assert why
    reasons = " ".join(why for _, why in problems)
    assert "sensory_data" in reasons and "environment" in reasons and "emotions" in reasons
    assert "action_type" in reasons


def _node(rid: str, links: list | None = None) -> dict:
    return {"id": rid, "tags": ["t"],
            "mem_type": {"Semantic": {"content": rid, "aliases": [], "concept_type": "Entity", "description": ""}},
            "mem_links": links or []}  # fmt: skip


def test_link_repairs_and_unknown_end() -> None:
    graph = parse_soul_tune_graph(
        [
            _node("a", [
                {"from": "a", "to": "b", "intensity": 0.5, "link_type": {"Proc": {"prob": 0.3}}},
                {"from": "a", "to": "b", "intensity": 0.5, "link_type": {"Situation": {}}},
            ]),
            _node("b"),
        ]
    )  # fmt: skip
    links = graph.notes[0].mem_links
    assert isinstance(links[0].link_type, TrigToAction) and links[0].link_type.prob == 0.3
    assert isinstance(links[1].link_type, AbstractToSpecific)
    with pytest.raises(GraphLoadError, match="unknown node 'zzz'"):
        parse_soul_tune_graph([_node("a", [{"from": "a", "to": "zzz", "intensity": 1.0,
                                            "link_type": {"Sem": {"verb": "v", "confidence": 0.5}}}])])  # fmt: skip
