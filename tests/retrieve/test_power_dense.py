"""The ``power`` method's exact dense solve (``AssociationConfig.power_dense_max_nodes``): the
same lists as the power iteration on small graphs, chosen by the graph's size only, and the
config's bounds."""

from __future__ import annotations

import functools

import pydantic
import pytest
import torch

from soulmem_torch.retrieve import (
    AssociateWithActionConfig,
    AssociationConfig,
    DefaultPipelineConfig,
    RetrAssociation,
    operators,
    parse_request_config,
    propagation,
)
from soulmem_torch.retrieve.config import MAX_DENSE_NODES, POWER_DENSE_MAX_NODES
from soulmem_torch.retrieve.pipeline import undirected_association
from soulmem_torch.runtime import WorkingMemory
from tests.retrieve.helpers import small_world


@functools.cache
def _sample_notes() -> tuple:
    from soulmem_torch.data import sample_memory_path
    from soulmem_torch.model.soul_tune import load_soul_tune_graph

    return tuple(load_soul_tune_graph(sample_memory_path()).notes)


def sample_world() -> WorkingMemory:
    """The bundled sample memory (77 notes, under the default limit of 128)."""
    import copy

    wm = WorkingMemory()
    for note in _sample_notes():
        wm.add_node(copy.deepcopy(note))
    return wm


def assert_same(got: list, want: list, tol: float = 1e-8) -> None:
    assert [i for i, _ in got] == [i for i, _ in want]
    assert all(abs(a - b) <= tol for (_, a), (_, b) in zip(got, want))


def _spy(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the calls of the two kernels ``propagation.power_ppr`` chooses between."""
    calls = {"dense": 0, "power": 0}
    dense, power = propagation.ppr_dense, propagation.ppr_power_iteration

    def spy_dense(*args, **kwargs):
        calls["dense"] += 1
        return dense(*args, **kwargs)

    def spy_power(*args, **kwargs):
        calls["power"] += 1
        return power(*args, **kwargs)

    monkeypatch.setattr(propagation, "ppr_dense", spy_dense)
    monkeypatch.setattr(propagation, "ppr_power_iteration", spy_power)
    return calls


# ---- same lists as the power iteration -----------------------------------------------------
@pytest.mark.parametrize(
    "settings",
    [{}, {"preference": "Semantic"}, {"damping_factor": 0.9}, {"intensity_factor": 0.5}],
)
def test_dense_equals_power_iteration_on_the_sample_memory(device, settings) -> None:
    wm = sample_world()
    ids = wm.cluster.ids()
    assert len(ids) <= POWER_DENSE_MAX_NODES
    sources = [
        [(ids[3], 0.9), (ids[40], 0.4), (ids[70], 0.2)],
        [(ids[0], 1.0)],
        [(ids[i], 0.1 * (i % 7)) for i in range(0, 77, 5)],  # a zero score among them
        [(ids[76], 0.3), (ids[12], 0.3)],
    ]
    dense_cfg = AssociationConfig(top_k=30, **settings)
    assert dense_cfg.power_dense_max_nodes == POWER_DENSE_MAX_NODES == 128
    power_cfg = AssociationConfig(top_k=30, power_dense_max_nodes=0, power_tol=1e-12, **settings)
    retr = RetrAssociation()
    dense = retr.retrieve_batch([dense_cfg.into_request(wm, s, device=device) for s in sources])
    power = retr.retrieve_batch([power_cfg.into_request(wm, s, device=device) for s in sources])
    for got, want in zip(dense, power):
        assert len(got) == 30
        assert_same(got, want)
    # the default power_tol (1e-9) too, one request at a time
    loose = AssociationConfig(top_k=30, power_dense_max_nodes=0, **settings)
    for s, got in zip(sources, dense):
        assert_same(got, retr.retrieve(loose.into_request(wm, s, device=device)))
        # a query scores the same alone as in the batch
        alone = retr.retrieve(dense_cfg.into_request(wm, s, device=device))
        if device.type == "cpu":
            assert alone == got
        else:
            assert_same(alone, got, 1e-14)


def test_undirected_channel_equals_power_iteration() -> None:
    graph = sample_world().graph()
    n = int(graph.num_nodes)
    gen = torch.Generator().manual_seed(0)
    weights = torch.rand(n, 5, generator=gen, dtype=torch.float64)
    keys = torch.rand(n, 5, generator=gen) < 0.1
    keys[n - 1, 3] = True  # a zero-weight key
    weights = torch.where(keys, weights, 0.0)
    weights[n - 1, 3] = 0.0
    keys[:, 4] = False  # a column without keys stays zero
    weights[:, 4] = 0.0
    dense = undirected_association(graph, weights, keys, AssociationConfig())
    power = undirected_association(
        graph, weights, keys, AssociationConfig(power_dense_max_nodes=0, power_tol=1e-12)
    )
    assert bool((dense[:, 4] == 0).all())
    assert torch.allclose(dense, power, atol=1e-11, rtol=0)
    assert bool(((dense == 0) == (power == 0)).all())  # unreached notes stay exactly 0


def test_default_pipeline_lists_equal_power_iteration() -> None:
    from soulmem_torch.api import SoulMem
    from soulmem_torch.data import sample_memory_path

    mem = SoulMem.from_graph_file(sample_memory_path())
    texts = ["a rainy afternoon at the café", "who lent me an umbrella", "tea with grandma"]

    def cfg(limit: int) -> DefaultPipelineConfig:
        assoc = AssociationConfig(power_dense_max_nodes=limit, power_tol=1e-12)
        return DefaultPipelineConfig(assoc_with_action=AssociateWithActionConfig(association=assoc))

    dense = mem.ask(texts, config=cfg(POWER_DENSE_MAX_NODES))
    power = mem.ask(texts, config=cfg(0))
    assert any(r.association for r in dense)
    for a, b in zip(dense, power):
        assert_same(a.association, b.association)
        assert_same(a.action, b.action)


# ---- the choice depends on the graph's size only -------------------------------------------
def test_graphs_above_the_limit_use_the_power_iteration(monkeypatch) -> None:
    wm, names = small_world()  # 7 notes
    src = [(names["cafe"], 0.7), (names["rainy"], 0.4)]
    calls = _spy(monkeypatch)
    retr = RetrAssociation()
    want = retr.retrieve(AssociationConfig(top_k=7, power_dense_max_nodes=0).into_request(wm, src))
    assert calls == {"dense": 0, "power": 1}
    for limit, used in [(6, "power"), (7, "dense"), (128, "dense"), (1, "power")]:
        calls.update(dense=0, power=0)
        cfg = AssociationConfig(top_k=7, power_dense_max_nodes=limit)
        got = retr.retrieve(cfg.into_request(wm, src))
        assert calls[used] == 1 and sum(calls.values()) == 1, (limit, calls)
        assert_same(got, want)
    # the graph_undirected channel chooses the same way
    graph = wm.graph()
    weights = torch.zeros(7, 2, dtype=torch.float64)
    weights[0, 0] = weights[2, 1] = 1.0
    keys = weights > 0
    for limit, used in [(6, "power"), (7, "dense")]:
        calls.update(dense=0, power=0)
        undirected_association(graph, weights, keys, AssociationConfig(power_dense_max_nodes=limit))
        assert calls[used] == 1 and sum(calls.values()) == 1, (limit, calls)


def test_other_methods_never_use_the_dense_solve(monkeypatch) -> None:
    wm, names = small_world()
    calls = _spy(monkeypatch)
    for method in ("sequential", "push", "auto"):
        cfg = AssociationConfig(method=method)
        RetrAssociation().retrieve(cfg.into_request(wm, [(names["cafe"], 1.0)]))
    assert calls == {"dense": 0, "power": 0}


def test_dense_factors_are_cached_with_the_snapshot() -> None:
    wm, names = small_world()
    cfg = AssociationConfig()
    RetrAssociation().retrieve(cfg.into_request(wm, [(names["cafe"], 1.0)]))
    graph = wm.graph()
    op = operators.transition(graph, cfg)
    assert ("dense_factors", 0.65) in op.cache
    first = op.cache[("dense_factors", 0.65)]
    RetrAssociation().retrieve(cfg.into_request(wm, [(names["rainy"], 1.0)]))
    assert op.cache[("dense_factors", 0.65)] is first
    RetrAssociation().retrieve(
        AssociationConfig(damping_factor=0.5).into_request(wm, [(names["rainy"], 1.0)])
    )
    assert ("dense_factors", 0.5) in op.cache


# ---- the config ----------------------------------------------------------------------------
def test_power_dense_max_nodes_bounds() -> None:
    assert AssociationConfig().power_dense_max_nodes == 128
    assert AssociationConfig(power_dense_max_nodes=0).power_dense_max_nodes == 0
    assert AssociationConfig(power_dense_max_nodes=MAX_DENSE_NODES).power_dense_max_nodes == 4096
    for bad in (-1, MAX_DENSE_NODES + 1, 1.5, "many"):
        with pytest.raises(pydantic.ValidationError, match="power_dense_max_nodes"):
            AssociationConfig(power_dense_max_nodes=bad)
        with pytest.raises(pydantic.ValidationError):
            parse_request_config({"type": "Association", "power_dense_max_nodes": bad})
    cfg = AssociationConfig(power_dense_max_nodes=7)
    assert parse_request_config(cfg.model_dump_json()) == cfg
    with pytest.raises(pydantic.ValidationError):  # frozen
        cfg.power_dense_max_nodes = 3  # type: ignore[misc]
