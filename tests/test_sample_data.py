"""The bundled sample memory and its retrieval suite: they load, cover every kind, and agree."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from datetime import datetime, timezone

import pytest

from soulmem_torch.data import (
    load_sample_memory,
    load_sample_queries,
    sample_memory_path,
    sample_queries_path,
)
from soulmem_torch.model import (
    AbstractSituation,
    AbstractToSpecific,
    ActionType,
    ConceptType,
    MemoryNote,
    ProcMemory,
    SemMemLink,
    SemMemory,
    SpecificSituation,
    SpecificToAbstract,
    TrigToAction,
)
from soulmem_torch.model.soul_tune import SoulTuneGraph, parse_soul_tune_graph
from tests.conftest import fixture_path

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
PREFIX = {
    "Semantic": "sem_",
    "SpecificSituation": "sit_",
    "AbstractSituation": "sit_abstract_",
    "Procedure": "proc_",
}
_CJK = re.compile(r"[\u4e00-\u9fff]")
_LATIN_WORD = re.compile(r"[A-Za-z]{3,}")


@pytest.fixture(scope="module")
def graph() -> SoulTuneGraph:
    return load_sample_memory(now=NOW)


@pytest.fixture(scope="module")
def suite() -> dict:
    return load_sample_queries()


def _by_rid(graph: SoulTuneGraph) -> dict[str, MemoryNote]:
    notes = {n.id: n for n in graph.notes}
    return {rid: notes[mid] for rid, mid in graph.id_map.items()}


def _texts(note: MemoryNote) -> list[str]:
    """Every human-written string of a note (tags included)."""
    out = list(note.tags)
    mt = note.mem_type
    if isinstance(mt, SemMemory):
        out += [mt.content, *mt.aliases, mt.description]
    elif isinstance(mt, SpecificSituation):
        c = mt.context
        out.append(mt.narrative)
        if c.location is not None:
            out += [c.location.name, c.location.coordinates]
        out += [x for p in c.participants for x in (p.name, p.role)]
        out += [e.name for e in c.emotions] + [s.name for s in c.sensory_data]
        out += [c.environment.atmosphere, c.environment.tone]
        out += [x for e in c.event for x in (e.action, e.initiator, e.target)]
    elif isinstance(mt, AbstractSituation):
        out += [v for v in mt.leaf.model_dump().values() if isinstance(v, str)]
    else:
        out.append(mt.action.content)
    return out


# ---- the graph -----------------------------------------------------------------------------
def test_paths_point_into_the_package() -> None:
    assert sample_memory_path().name == "sample_memory.graph.json"
    assert sample_queries_path().name == "sample_queries.json"
    assert sample_memory_path().parent.name == "data"
    assert sample_memory_path().is_file() and sample_queries_path().is_file()


def test_sample_loads_and_every_link_resolves(graph: SoulTuneGraph) -> None:
    assert len(graph.notes) == 77
    assert graph.num_links == 212
    assert len(graph.id_map) == len(graph.notes)
    ids = {n.id for n in graph.notes}
    for note in graph.notes:
        assert note.create_time == NOW and note.last_accessed_time == NOW
        for link in note.mem_links:
            assert link.from_ == note.id
            assert link.to in ids
            assert link.to != note.id
    # each (source, target, type) appears once
    triples = Counter(
        (link.from_, link.to, type(link.link_type).__name__)
        for n in graph.notes
        for link in n.mem_links
    )
    assert max(triples.values()) == 1


def test_every_kind_is_present_with_readable_prefixes(graph: SoulTuneGraph) -> None:
    kinds = Counter(n.kind for n in graph.notes)
    assert kinds == {
        "Semantic": 25,
        "SpecificSituation": 16,
        "AbstractSituation": 19,
        "Procedure": 17,
    }
    for rid, note in _by_rid(graph).items():
        assert rid.startswith(PREFIX[note.kind]), rid
        if note.kind == "SpecificSituation":
            assert not rid.startswith("sit_abstract_"), rid

    concept_types = Counter(n.mem_type.concept_type for n in graph.notes if n.kind == "Semantic")
    assert concept_types == {ConceptType.ENTITY: 19, ConceptType.ABSTRACT: 6}
    leaves = Counter(n.mem_type.kind for n in graph.notes if n.kind == "AbstractSituation")
    assert leaves == {"Location": 4, "Participant": 5, "Environment": 4, "Event": 6}
    actions = Counter(
        n.mem_type.action.action_type for n in graph.notes if isinstance(n.mem_type, ProcMemory)
    )
    assert set(actions) == {ActionType.SPEAK, ActionType.THINK, ActionType.SKILL}
    link_types = Counter(type(link.link_type) for n in graph.notes for link in n.mem_links)
    assert link_types == {
        SemMemLink: 87,
        TrigToAction: 45,
        SpecificToAbstract: 40,
        AbstractToSpecific: 40,
    }


def test_concepts_have_aliases_and_descriptions(graph: SoulTuneGraph) -> None:
    for note in graph.notes:
        if isinstance(note.mem_type, SemMemory):
            assert note.mem_type.aliases and note.mem_type.description, note.mem_type.content
        assert note.tags


def test_specific_situations_have_full_context(graph: SoulTuneGraph) -> None:
    for rid, note in _by_rid(graph).items():
        mt = note.mem_type
        if not isinstance(mt, SpecificSituation):
            continue
        c = mt.context
        assert c.location is not None and c.location.name and c.location.coordinates, rid
        assert c.participants and c.emotions and c.sensory_data and c.event, rid
        assert c.environment.atmosphere and c.environment.tone, rid
        assert mt.time_span.year >= 2019, rid  # a real instant, not the epoch repair
        assert all(0 < e.intensity <= 1 for e in c.emotions), rid
        assert all(0 < e.action_intensity <= 1 for e in c.event), rid


def test_link_structure(graph: SoulTuneGraph) -> None:
    notes = {n.id: n for n in graph.notes}
    s2a: set[tuple] = set()
    a2s: set[tuple] = set()
    trig_targets: set = set()
    for note in graph.notes:
        for link in note.mem_links:
            target = notes[link.to]
            lt = link.link_type
            if isinstance(lt, TrigToAction):
                assert target.kind == "Procedure"
                assert note.kind != "Procedure"
                assert 0 < lt.prob <= 1 and link.intensity == lt.prob
                trig_targets.add(link.to)
            elif isinstance(lt, SemMemLink):
                assert lt.verb and 0 < lt.confidence <= 1
                assert target.kind == "Semantic"
            elif isinstance(lt, SpecificToAbstract):
                assert (note.kind, target.kind) == ("SpecificSituation", "AbstractSituation")
                s2a.add((note.id, link.to))
            elif isinstance(lt, AbstractToSpecific):
                assert (note.kind, target.kind) == ("AbstractSituation", "SpecificSituation")
                a2s.add((link.to, note.id))
    assert s2a == a2s  # every episode ↔ pattern link goes both ways
    specifics = {n.id for n in graph.notes if n.kind == "SpecificSituation"}
    abstracts = {n.id for n in graph.notes if n.kind == "AbstractSituation"}
    assert {s for s, _ in s2a} == specifics
    assert {a for _, a in s2a} == abstracts
    procs = {n.id for n in graph.notes if n.kind == "Procedure"}
    assert procs - trig_targets == {graph.id_map["proc_none"]}  # only the idle action is unlinked


def test_bilingual(graph: SoulTuneGraph) -> None:
    zh = en = mixed = 0
    for note in graph.notes:
        text = " ".join(_texts(note))
        has_zh, has_en = bool(_CJK.search(text)), bool(_LATIN_WORD.search(text))
        zh += has_zh and not has_en
        en += has_en and not has_zh
        mixed += has_zh and has_en
    assert zh >= 15 and en >= 5 and mixed >= 15, (zh, en, mixed)
    narratives = [n.mem_type.narrative for n in graph.notes if n.kind == "SpecificSituation"]
    assert sum(not _CJK.search(t) for t in narratives) >= 4  # English-only episodes
    assert sum(not _LATIN_WORD.search(t) for t in narratives) >= 8  # Chinese-only episodes


def test_round_trips_through_the_graph_format(graph: SoulTuneGraph) -> None:
    from soulmem_torch.model.soul_tune import dump_soul_tune_graph

    dumped = dump_soul_tune_graph(graph.notes, graph.readable_ids)
    again = parse_soul_tune_graph(dumped, now=NOW)
    assert sorted(again.id_map) == sorted(graph.id_map)
    assert again.num_links == graph.num_links
    raw = json.loads(sample_memory_path().read_text(encoding="utf-8"))
    for node, back in zip(raw, dumped):
        assert back["id"] == node["id"] and back["tags"] == node["tags"]
        assert [(x["from"], x["to"]) for x in back["mem_links"]] == [
            (x["from"], x["to"]) for x in node["mem_links"]
        ]


def test_world_is_original() -> None:
    """Nothing is copied from the original's fixture graph (ids or texts)."""
    fixture = json.loads(fixture_path("soul_tune", "congyu", "graph.json").read_text("utf-8"))
    ours = load_sample_memory(now=NOW)
    theirs = parse_soul_tune_graph(fixture, now=NOW)
    shared_ids = (set(ours.id_map) & set(theirs.id_map)) - {"proc_none", "sem_self"}
    assert not shared_ids
    ours_text = {t for n in ours.notes for t in _texts(n) if len(t) >= 6}
    theirs_text = {t for n in theirs.notes for t in _texts(n) if len(t) >= 6}
    assert not ours_text & theirs_text


# ---- the retrieval suite -------------------------------------------------------------------
def _expected_ids(case: dict) -> list[str]:
    out = list(case["expected_combined_ranking"]) + list(case.get("bonus_combined_ranking", []))
    for entry in case["expected_per_query"]:
        out += entry["ranking"] + entry.get("bonus_ranking", [])
    return out


def test_suite_shape(suite: dict) -> None:
    assert set(suite) >= {"name", "description", "graph_path", "config", "test_cases"}
    assert suite["graph_path"] == sample_memory_path().name
    config = suite["config"]
    assert 0 <= config["similarity_threshold"] < 1
    assert config["max_results"] >= max(config["test_k_values"])
    cases = suite["test_cases"]
    assert len(cases) >= 12
    assert len({c["name"] for c in cases}) == len(cases)
    assert sum(len(c["sub_queries"]) > 1 for c in cases) >= 3
    assert sum(bool(c.get("expected_actions")) for c in cases) >= 8
    for case in cases:
        subs = case["sub_queries"]
        assert subs, case["name"]
        assert [e["q"] for e in case["expected_per_query"]] == list(range(len(subs)))
        for sub in subs:
            assert isinstance(sub["priority"], int) and sub["priority"] >= 0
            assert isinstance(sub["tag"], list) and sub["tag"]
            (kind, units), *rest = sub["variant"].items()
            assert not rest and kind in ("Semantic", "Situation") and units
        assert case["expected_combined_ranking"]
        per_query = {rid for e in case["expected_per_query"] for rid in e["ranking"]}
        assert set(case["expected_combined_ranking"]) <= per_query, case["name"]


def test_sub_queries_parse_as_retrieval_queries(suite: dict) -> None:
    query_mod = pytest.importorskip("soulmem_torch.model.query")
    for case in suite["test_cases"]:
        for sub in case["sub_queries"]:
            query = query_mod.MemoryRetrieveQuery.model_validate(
                {"tag": sub["tag"], "variant": sub["variant"]}
            )
            assert query.kind in sub["variant"]


def test_every_expected_id_exists_and_fits_the_query(suite: dict, graph: SoulTuneGraph) -> None:
    notes = _by_rid(graph)
    for case in suite["test_cases"]:
        for rid in _expected_ids(case) + case.get("expected_actions", []):
            assert rid in notes, f"{case['name']}: {rid} is not in the sample graph"
        for rid in case.get("expected_actions", []):
            assert notes[rid].kind == "Procedure", (case["name"], rid)
        for sub, entry in zip(case["sub_queries"], case["expected_per_query"]):
            kind = next(iter(sub["variant"]))
            for rid in entry["ranking"]:  # a query kind only scores notes of its kind
                expected = ("Semantic",) if kind == "Semantic" else (
                    "SpecificSituation", "AbstractSituation")  # fmt: skip
                assert notes[rid].kind in expected, (case["name"], rid)


def test_expected_actions_are_triggered_near_the_expected_situations(
    suite: dict, graph: SoulTuneGraph
) -> None:
    """Each expected action is a TrigToAction target of an expected situation or its pattern."""
    notes = _by_rid(graph)
    rid_of = graph.readable_ids
    for case in suite["test_cases"]:
        situations = {r for r in _expected_ids(case) if notes[r].kind.endswith("Situation")}
        near = set(situations)
        for r in situations:
            near |= {
                rid_of[link.to]
                for link in notes[r].mem_links
                if isinstance(link.link_type, (SpecificToAbstract, AbstractToSpecific))
            }
        triggered = {
            rid_of[link.to]
            for r in near
            for link in notes[r].mem_links
            if isinstance(link.link_type, TrigToAction)
        }
        for action in case.get("expected_actions", []):
            assert action in triggered, (case["name"], action)


def _features(text: str) -> Counter[str]:
    """Character unigrams + bigrams of CJK runs, lowercase Latin words (a tiny lexical model)."""
    feats: Counter[str] = Counter()
    for run in re.findall(r"[\u4e00-\u9fff]+", text):
        feats.update(run)
        feats.update(run[i : i + 2] for i in range(len(run) - 1))
    feats.update(w.lower() for w in re.findall(r"[A-Za-z]{2,}", text))
    return feats


def _strings(value: object) -> list[str]:
    """Every string value inside parsed JSON (keys excluded)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _cosine(a: Counter[str], b: Counter[str]) -> float:
    dot = sum(v * b[k] for k, v in a.items())
    na = math.sqrt(sum(v * v for v in a.values()))
    nb = math.sqrt(sum(v * v for v in b.values()))
    return 0.0 if na == 0 or nb == 0 else dot / (na * nb)


def test_expected_answers_are_lexically_the_best(suite: dict, graph: SoulTuneGraph) -> None:
    """Even a bag of characters finds each sub-query's first expected id near the top.

    A sanity check that the suite is answerable (the built-in embedder and the full similarity
    score rank them first or close to it).
    """
    notes = _by_rid(graph)
    docs = {rid: _features(" ".join(_texts(n))) for rid, n in notes.items()}
    for case in suite["test_cases"]:
        for sub, entry in zip(case["sub_queries"], case["expected_per_query"]):
            kind = next(iter(sub["variant"]))
            query = _features(" ".join([*sub["tag"], *_strings(sub["variant"][kind])]))
            family = ("Semantic",) if kind == "Semantic" else (
                "SpecificSituation", "AbstractSituation")  # fmt: skip
            ranked = sorted(
                (r for r, n in notes.items() if n.kind in family),
                key=lambda r: -_cosine(query, docs[r]),
            )
            assert entry["ranking"][0] in ranked[:3], (case["name"], entry["q"], ranked[:5])
