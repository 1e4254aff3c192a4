"""Association, BayesAction, AssociateWithAction, ShortOnly and the config union."""

from __future__ import annotations

import math

import pydantic
import pytest
import torch

from soulmem_torch.errors import ValidationError
from soulmem_torch.functional.edge_weights import dynamic_edge_weight
from soulmem_torch.model import MemoryId
from soulmem_torch.model.soul_tune import load_soul_tune_graph
from soulmem_torch.retrieve import (
    AssociateWithActionConfig,
    AssociationConfig,
    BayesActionConfig,
    RetrAssociateWithAction,
    RetrAssociation,
    RetrBayesAction,
    RetrShortOnly,
    ShortOnlyConfig,
    SimilarityConfig,
    parse_request_config,
)
from soulmem_torch.runtime import WorkingMemory
from tests.conftest import fixture_path
from tests.retrieve.helpers import small_world


def _congyu() -> tuple[WorkingMemory, dict[str, MemoryId]]:
    graph = load_soul_tune_graph(fixture_path("soul_tune", "congyu", "graph.json"))
    wm = WorkingMemory()
    for note in graph.notes:
        wm.add_node(note)
    return wm, graph.id_map


# ---- Association -------------------------------------------------------------------------
def test_association_empty_and_unknown_sources() -> None:
    wm, _ = small_world()
    assert RetrAssociation().retrieve(AssociationConfig().into_request(wm, [])) == []
    unknown = [(MemoryId(), 0.9)]
    assert RetrAssociation().retrieve(AssociationConfig().into_request(wm, unknown)) == []
    zero = [(wm.cluster.ids()[0], 0.0)]
    assert RetrAssociation().retrieve(AssociationConfig().into_request(wm, zero)) == []


def test_association_bad_scores_are_errors() -> None:
    wm, names = small_world()
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValidationError, match="source"):
            RetrAssociation().retrieve(AssociationConfig().into_request(wm, [(names["cafe"], bad)]))


@pytest.mark.parametrize("method", ["sequential", "push", "power"])
def test_association_methods_agree_on_congyu(method: str, device: torch.device) -> None:
    if method == "sequential" and device.type != "cpu":
        pytest.skip("the sequential oracle runs on the CPU")
    wm, ids = _congyu()
    source = [(ids["sit_night_raid_confession"], 0.9), (ids["sem_self"], 0.5)]
    reference = RetrAssociation().retrieve(
        AssociationConfig(method="sequential", top_k=34).into_request(wm, source)
    )
    got = RetrAssociation().retrieve(
        AssociationConfig(method=method, top_k=34).into_request(wm, source, device=device)
    )
    assert len(got) == 34
    ref = dict(reference)
    assert sum(abs(ref[i] - s) for i, s in got) < 1e-3  # within the threshold's error
    assert [i for i, _ in got[:5]] == [i for i, _ in reference[:5]]
    assert all(got[i][1] >= got[i + 1][1] for i in range(len(got) - 1))
    assert math.isclose(sum(s for _, s in got), 1.0, rel_tol=1e-9)


def test_association_sequential_matches_kernel_and_keeps_zero_nodes() -> None:
    wm, names = small_world()
    got = RetrAssociation().retrieve(
        AssociationConfig(method="sequential", top_k=7).into_request(wm, [(names["coffee"], 1.0)])
    )
    assert len(got) == 7  # zero-score notes may appear
    assert got[0][0] == names["coffee"]
    assert got[-1][1] == 0.0
    graph = wm.graph()
    w = dynamic_edge_weight(graph.edge_index, graph.edge_kind, graph.intensity, graph.confidence,
                            graph.node_type)  # fmt: skip
    assert w.dtype == torch.float64


def test_association_batch_equals_single() -> None:
    wm, ids = _congyu()
    srcs = [[(ids[k], 0.3 + 0.1 * i)] for i, k in enumerate(sorted(ids)[:12])]
    config = AssociationConfig(top_k=6)
    batch = RetrAssociation().retrieve_batch([config.into_request(wm, s) for s in srcs])
    for s, b in zip(srcs, batch):
        single = RetrAssociation().retrieve(config.into_request(wm, s))
        assert [i for i, _ in single] == [i for i, _ in b]
        assert all(abs(x - y) < 1e-12 for (_, x), (_, y) in zip(single, b))


def test_association_mixed_configs_in_one_batch() -> None:
    wm, names = small_world()
    reqs = [
        AssociationConfig(top_k=2).into_request(wm, [(names["cafe"], 1.0)]),
        AssociationConfig(top_k=3, preference="Semantic").into_request(wm, [(names["rainy"], 1.0)]),
        AssociationConfig(top_k=2).into_request(wm, []),
    ]
    out = RetrAssociation().retrieve_batch(reqs)
    assert [len(o) for o in out] == [2, 3, 0]


# ---- BayesAction -------------------------------------------------------------------------
def test_bayes_action_hand_computed() -> None:
    wm, n = small_world()
    req = BayesActionConfig(top_k=5).into_request(wm, [(n["rainy"], 0.5), (n["rain"], 1.0)])
    got = dict(RetrBayesAction().retrieve(req))
    assert set(got) == {n["greet"], n["umbrella"]}
    assert got[n["umbrella"]] == pytest.approx(0.3 * 0.5 + 0.9 * 1.0)
    assert got[n["greet"]] == pytest.approx(0.5 * 0.5)
    ranked = RetrBayesAction().retrieve(req)
    assert ranked[0][0] == n["umbrella"]
    assert (
        RetrBayesAction().retrieve(BayesActionConfig().into_request(wm, [(n["cafe"], 1.0)])) == []
    )


def test_bayes_action_zero_weight_source_still_gives_candidates() -> None:
    wm, n = small_world()
    got = RetrBayesAction().retrieve(BayesActionConfig().into_request(wm, [(n["coffee"], 0.0)]))
    assert got == [(n["think"], 0.0)]


# ---- AssociateWithAction -----------------------------------------------------------------
def test_associate_with_action_softmax_over_situations() -> None:
    wm, n = small_world()
    config = AssociateWithActionConfig(association=AssociationConfig(method="sequential", top_k=7))
    seeds = [(n["rainy"], 0.9)]
    result = RetrAssociateWithAction().retrieve(config.into_request(wm, seeds))
    memory = RetrAssociation().retrieve(config.association.into_request(wm, seeds))
    assert result.memory == memory
    ppr = dict(memory)
    w_rainy = max(float(torch.tensor(0.9, dtype=torch.float32)), ppr[n["rainy"]])
    w_rain = ppr[n["rain"]] * config.abstract_source_priority
    m = max(w_rainy, w_rain)
    e1, e2 = math.exp(w_rainy - m), math.exp(w_rain - m)
    s_rainy, s_rain = e1 / (e1 + e2), e2 / (e1 + e2)
    expected = {n["umbrella"]: 0.3 * s_rainy + 0.9 * s_rain, n["greet"]: 0.5 * s_rainy}
    got = dict(result.action)
    assert set(got) == set(expected)
    for k, v in expected.items():
        assert got[k] == pytest.approx(v, rel=1e-12)


def test_associate_with_action_empty() -> None:
    wm, _ = small_world()
    result = RetrAssociateWithAction().retrieve(AssociateWithActionConfig().into_request(wm, []))
    assert result.memory == [] and result.action == []


# ---- ShortOnly ---------------------------------------------------------------------------
async def _fill(wm: WorkingMemory) -> None:
    from soulmem_torch.runtime import make_information

    for i in range(5):
        await wm.push(make_information(f"m{i}", "user" if i % 2 == 0 else "assistant"))


def test_short_only_clipping_and_summary() -> None:
    import asyncio

    wm = WorkingMemory()
    asyncio.run(_fill(wm))
    msgs, summary = RetrShortOnly().retrieve(ShortOnlyConfig(clipping_length=2).into_request(wm))
    assert [m.text for m in msgs] == ["m3", "m4"]
    assert summary == ""
    msgs, _ = RetrShortOnly().retrieve(ShortOnlyConfig().into_request(wm))
    assert len(msgs) == 5
    msgs, _ = RetrShortOnly().retrieve(ShortOnlyConfig(clipping_length=0).into_request(wm))
    assert msgs == []


# ---- configs -----------------------------------------------------------------------------
def test_config_union_from_json() -> None:
    c = parse_request_config('{"type": "Association", "top_k": 3, "preference": "Semantic"}')
    assert isinstance(c, AssociationConfig) and c.top_k == 3
    c = parse_request_config({"type": "Similarity"})
    assert c == SimilarityConfig()
    c = parse_request_config(
        {"type": "AssociateWithAction", "association": {"damping_factor": 0.5}}
    )
    assert c.association.damping_factor == 0.5
    assert AssociationConfig().damping_factor == 0.65 and AssociationConfig().top_k == 8
    assert BayesActionConfig().top_k == 5 and SimilarityConfig().similarity_threshold == 0.35
    again = parse_request_config(AssociationConfig(top_k=2).model_dump_json())
    assert again == AssociationConfig(top_k=2)


@pytest.mark.parametrize(
    "bad",
    [
        {"type": "Association", "damping_factor": 1.0},
        {"type": "Association", "damping_factor": -0.1},
        {"type": "Association", "residue_threshold": 0.0},
        {"type": "Association", "top_k": 0},
        {"type": "Similarity", "max_results": 0},
        {"type": "Nope"},
        {"type": "Association", "unknown_key": 1},
    ],
)
def test_bad_configs_rejected(bad: dict) -> None:
    with pytest.raises(pydantic.ValidationError):
        parse_request_config(bad)
