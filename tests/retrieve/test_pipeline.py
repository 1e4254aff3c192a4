"""Similarity strategy, the default pipeline, the evaluation module and priority mixing."""

from __future__ import annotations

import math

import pytest
import torch

from soulmem_torch.embedding import HashingEmbedder, MemoryEmbedding, embed_notes
from soulmem_torch.errors import ValidationError
from soulmem_torch.model.query import MemoryRetrieveQuery
from soulmem_torch.model.soul_tune import load_soul_tune_graph
from soulmem_torch.retrieve import (
    AssociateWithActionConfig,
    AssociationConfig,
    DefaultPipelineConfig,
    RetrAssociateWithAction,
    RetrDefaultPipeline,
    RetrSimilarity,
    SimilarityConfig,
    merge_weighted_sum,
    mix_by_priority,
    ranking_metrics,
)
from soulmem_torch.retrieve.evaluation import evaluate_suite_file, format_report, load_suite
from soulmem_torch.runtime import WorkingMemory
from tests.conftest import fixture_path


@pytest.fixture(scope="module")
def congyu() -> tuple[WorkingMemory, dict, HashingEmbedder]:
    graph = load_soul_tune_graph(fixture_path("soul_tune", "congyu", "graph.json"))
    embedder = HashingEmbedder()
    wm = WorkingMemory()
    wm.add_nodes(graph.notes, embed_notes(graph.notes, embedder))
    return wm, graph.id_map, embedder


def _queries() -> list[MemoryRetrieveQuery]:
    return [
        MemoryRetrieveQuery.semantic(
            [{"concept_identifier": "丛雨丸", "description": "神刀"}], tag=["物体"]
        ),
        MemoryRetrieveQuery.situation([{"narrative": "我辈向将臣表白"}], tag=["事件"]),
        MemoryRetrieveQuery.semantic([{"concept_identifier": "芳乃"}]),
    ]


def test_similarity_threshold_sort_and_cut(congyu) -> None:
    wm, _, embedder = congyu
    config = SimilarityConfig(similarity_threshold=0.2, max_results=5)
    for q in _queries():
        got = RetrSimilarity().retrieve(config.into_request(wm, q, embedder=embedder))
        assert 0 < len(got) <= 5
        scores = [s for _, s in got]
        assert scores == sorted(scores, reverse=True)
        assert all(s >= 0.2 for s in scores)
        assert all(s == float(torch.tensor(s, dtype=torch.float32)) for s in scores)  # f32
    high = SimilarityConfig(similarity_threshold=2.0)
    assert RetrSimilarity().retrieve(high.into_request(wm, _queries()[0], embedder=embedder)) == []


def test_similarity_needs_an_embedder(congyu) -> None:
    wm, _, _ = congyu
    with pytest.raises(ValidationError, match="embedder"):
        RetrSimilarity().retrieve(SimilarityConfig().into_request(wm, _queries()[0]))


def test_pipeline_follows_its_stages(congyu) -> None:
    wm, _, embedder = congyu
    sim = SimilarityConfig(similarity_threshold=0.2, max_results=4, situation_units="sum")
    config = DefaultPipelineConfig.original().model_copy(update={"similarity": sim})
    q = _queries()[1]
    result = RetrDefaultPipeline().retrieve(config.into_request(wm, q, 7, embedder=embedder))
    seeds = RetrSimilarity().retrieve(config.similarity.into_request(wm, q, embedder=embedder))
    assert result.seeds == seeds
    awa = RetrAssociateWithAction().retrieve(config.assoc_with_action.into_request(wm, seeds))
    assert result.action == awa.action
    merged: dict = {}
    for i, s in [*seeds, *awa.memory]:
        merged[i] = max(merged.get(i, -math.inf), float(s))
    expected = sorted(merged.items(), key=lambda kv: -kv[1])[:10]
    assert [s for _, s in result.association] == pytest.approx([s for _, s in expected], abs=1e-12)
    assert {i for i, _ in result.association} == {i for i, _ in expected}
    assert result.priority == 7
    assert result.short_history == [] and result.short_mem == ""


def test_pipeline_batch_equals_single(congyu) -> None:
    wm, _, embedder = congyu
    config = DefaultPipelineConfig()
    reqs = [config.into_request(wm, q, i, embedder=embedder) for i, q in enumerate(_queries())]
    batch = RetrDefaultPipeline().retrieve_batch(reqs)
    for req, b in zip(reqs, batch):
        single = RetrDefaultPipeline().retrieve(req)
        assert [i for i, _ in single.association] == [i for i, _ in b.association]
        assert [i for i, _ in single.action] == [i for i, _ in b.action]


@pytest.mark.parametrize("method", ["push", "power"])
def test_pipeline_on_device(congyu, device: torch.device, method: str) -> None:
    wm, _, embedder = congyu
    config = DefaultPipelineConfig(
        assoc_with_action=AssociateWithActionConfig(association=AssociationConfig(method=method))
    )
    cpu = RetrDefaultPipeline().retrieve(config.into_request(wm, _queries()[1], embedder=embedder))
    dev = RetrDefaultPipeline().retrieve(
        config.into_request(wm, _queries()[1], embedder=embedder, device=device)
    )
    assert [i for i, _ in cpu.association[:3]] == [i for i, _ in dev.association[:3]]


def test_plain_mode_vectors() -> None:
    from tests.retrieve.helpers import small_world

    wm, names = small_world()
    ids = wm.cluster.ids()
    basis = torch.eye(len(ids), 8)
    for i, mid in enumerate(ids):
        wm.cluster.set_embedding(mid, MemoryEmbedding.from_vector(basis[i]))
    q = basis[ids.index(names["rain"])] + 0.5 * basis[ids.index(names["cafe"])]
    got = RetrSimilarity().retrieve(SimilarityConfig(similarity_threshold=0.1).into_request(wm, q))
    assert [i for i, _ in got] == [names["rain"], names["cafe"]]
    assert got[0][1] == pytest.approx(1 / math.sqrt(1.25), rel=1e-6)
    with pytest.raises(ValidationError, match="width"):
        RetrSimilarity().retrieve(SimilarityConfig().into_request(wm, torch.ones(3)))


def test_congyu_suite_meets_the_bar() -> None:
    report = evaluate_suite_file(fixture_path("soul_tune", "congyu", "question.json"))
    summary = report.summary()
    assert summary["q_mrr"] >= 0.85
    assert summary["pass_rate"] == 1.0
    text = format_report(report, per_case=True)
    assert "per sub-query" in text and "PASS" in text


def test_sample_suite_runs() -> None:
    from soulmem_torch.data import sample_queries_path

    report = evaluate_suite_file(sample_queries_path())
    assert len(report.cases) == len(load_suite(sample_queries_path()).test_cases)
    assert report.summary()["q_mrr"] >= 0.9
    assert report.pass_rate == 1.0


# ---- metrics and mixing (reference values worked by hand) --------------------------------
def test_ranking_metrics_reference() -> None:
    m = ranking_metrics(["a", "b", "c", "d"], ["b", "x"], [1, 3, 5])
    assert m.k_values == (1, 3, 4)  # k clipped to |R|
    assert m.recall == {1: 0.0, 3: 0.5, 4: 0.5}
    assert m.precision[3] == pytest.approx(1 / 3)
    idcg = 1 + 1 / math.log2(3)  # [1]*n padded to max k = 4
    assert m.ndcg[3] == pytest.approx((1 / math.log2(3)) / idcg)
    assert m.mrr == 0.5 and m.hit
    empty = ranking_metrics(["a"], [], [1])
    assert empty.mrr == 0 and not empty.hit and empty.recall == {1: 0.0}
    miss = ranking_metrics(["a", "b"], ["z"], [1, 2])
    assert miss.mrr == 0.0 and not miss.hit
    with pytest.raises(ValidationError):
        ranking_metrics(["a"], ["a"], [0])


def test_priority_helpers() -> None:
    mixed = mix_by_priority([[("a", 0.5), ("b", 0.4)], [("b", 0.5)]], [1, 2])
    assert mixed[0] == ("b", pytest.approx(0.55))
    assert mixed[1] == ("a", pytest.approx(0.525))
    summed = merge_weighted_sum([[("a", 0.5), ("b", 0.4)], [("b", 0.5)]], [1, 2], top_k=1)
    assert summed == [("b", pytest.approx(1.4))]
    with pytest.raises(ValidationError):
        mix_by_priority([[("a", 1.0)]], [1, 2])


def test_plain_mode_zero_and_nan_queries() -> None:
    from tests.retrieve.helpers import small_world

    wm, _ = small_world()
    for i, mid in enumerate(wm.cluster.ids()):
        wm.cluster.set_embedding(mid, MemoryEmbedding.from_vector(torch.eye(7, 8)[i]))
    zero = SimilarityConfig(similarity_threshold=0.0).into_request(wm, torch.zeros(8))
    got = RetrSimilarity().retrieve(zero)
    assert got and all(s == 0.0 for _, s in got)  # cos with a zero vector is 0 (SPEC §3)
    assert RetrSimilarity().retrieve(SimilarityConfig().into_request(wm, torch.zeros(8))) == []
    nan = torch.full((8,), float("nan"))
    with pytest.raises(ValidationError, match="finite"):
        RetrSimilarity().retrieve(SimilarityConfig().into_request(wm, nan))


def test_pipeline_on_a_bare_graph_has_no_short_term_memory() -> None:
    from tests.retrieve.helpers import small_world

    wm, _ = small_world()
    for i, mid in enumerate(wm.cluster.ids()):
        wm.cluster.set_embedding(mid, MemoryEmbedding.from_vector(torch.eye(7, 8)[i]))
    graph = wm.graph()
    res = RetrDefaultPipeline().retrieve(
        DefaultPipelineConfig(similarity=SimilarityConfig(similarity_threshold=0.5)).into_request(
            graph, torch.eye(7, 8)[2]
        )
    )
    assert res.short_history == [] and res.short_mem == ""
    assert res.association[0][0] == wm.cluster.ids()[2]
