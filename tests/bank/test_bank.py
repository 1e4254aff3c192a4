"""MemoryBank: every (agent, query) answered as a SoulMem holding only that agent's notes."""

from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soulmem_torch import HashingEmbedder, MemoryBank, SoulMem
from soulmem_torch.bank import _operators, _union
from soulmem_torch.bank._operators import segment_power_ppr, segment_power_ppr_channels
from soulmem_torch.errors import ConfigError, NotFoundError, SoulMemError, ValidationError
from soulmem_torch.retrieve import (
    AssociateWithActionConfig,
    DefaultPipelineConfig,
    RetrDefaultPipeline,
    SimilarityConfig,
)
from soulmem_torch.retrieve.config import AssociationConfig
from soulmem_torch.retrieve.propagation import run_association

from .helpers import (
    TEXTS,
    assert_same_result,
    config,
    random_agent_graph,
    sample_notes,
)

SETTINGS = settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,
)


def _reference(bank: MemoryBank, agent: str, text: str, cfg: DefaultPipelineConfig):
    """The same question to a fresh SoulMem with only this agent's notes."""
    view = bank.agent(agent)
    entries = list(view.cluster)
    mem = SoulMem(embedder=bank.embedder, device=bank.device)
    mem.working_memory.add_nodes([e.note for e in entries], [e.embedding for e in entries])
    return mem.ask([text], config=cfg)[0]


note_subsets = st.lists(
    st.lists(st.integers(0, 76), min_size=1, max_size=30, unique=True), min_size=1, max_size=4
)
asks = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, len(TEXTS) - 1)), min_size=1, max_size=6
)


@SETTINGS
@given(
    subsets=note_subsets,
    pairs=asks,
    method=st.sampled_from(["power", "auto", "push"]),
    fusion=st.sampled_from(["rank", "max"]),
    units=st.sampled_from([None, "sum"]),
    path=st.sampled_from(["grouped", "gathered"]),
)
def test_ask_equals_per_agent_soulmem(device, subsets, pairs, method, fusion, units, path):
    with _similarity_path(path):
        _ask_equals_per_agent_soulmem(device, subsets, pairs, method, fusion, units)


@contextlib.contextmanager
def _similarity_path(path: str):
    """Forces the structured similarity path: per agent group, or gathered candidate rows."""
    saved = _union._GROUP_SECONDS
    _union._GROUP_SECONDS = 0.0 if path == "grouped" else float("inf")
    try:
        yield
    finally:
        _union._GROUP_SECONDS = saved


def _ask_equals_per_agent_soulmem(device, subsets, pairs, method, fusion, units) -> None:
    bank = MemoryBank(device=device)
    for a, subset in enumerate(subsets):
        bank.add_agent(f"agent-{a}", sample_notes(sorted(subset)))
    cfg = config(method, fusion, similarity_threshold=0.2, max_results=5, situation_units=units)
    agents = [f"agent-{a % len(subsets)}" for a, _ in pairs]
    texts = [TEXTS[t] for _, t in pairs]
    results = bank.ask(agents, texts, config=cfg)
    assert len(results) == len(pairs)
    for agent, text, got in zip(agents, texts, results):
        assert_same_result(got, _reference(bank, agent, text, cfg))


@SETTINGS
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=5),
    queries=st.lists(st.integers(0, 4), min_size=1, max_size=8),
    seed=st.integers(0, 10_000),
    method=st.sampled_from(["power", "auto"]),
    fusion=st.sampled_from(["rank", "max"]),
    dangling=st.booleans(),
)
def test_plain_queries_equal_per_agent_pipeline(
    device, sizes, queries, seed, method, fusion, dangling
):
    dim = 8
    bank = MemoryBank(embedder=HashingEmbedder(dim=dim), device=device)
    graphs = []
    for a, n in enumerate(sizes):
        g = random_agent_graph(n, 3 * n, dim, seed + a, dangling=dangling)
        graphs.append(g)
        bank.add_agent_graph(f"g{a}", g)
    gen = torch.Generator().manual_seed(seed)
    vectors = torch.randn(len(queries), dim, generator=gen)
    cfg = config(method, fusion, similarity_threshold=0.0, max_results=3)
    pairs = [(f"g{q % len(sizes)}", vectors[i]) for i, q in enumerate(queries)]
    got = bank.query(pairs, config=cfg)
    for (agent, vec), result in zip(pairs, got):
        g = graphs[int(agent[1:])].to(device)
        want = RetrDefaultPipeline().retrieve(cfg.into_request(g, vec, device=device))
        assert_same_result(result, want)


@SETTINGS
@given(
    sizes=st.lists(st.integers(1, 30), min_size=1, max_size=4),
    rows=st.lists(st.integers(0, 3), min_size=1, max_size=7),
    seed=st.integers(0, 10_000),
    dtype=st.sampled_from(["float64", "float32"]),
)
def test_union_power_iteration_equals_per_agent_kernel(device, sizes, rows, seed, dtype):
    """The PPR stage alone, from the same seeds: within 1e-9 (float64) / 1e-6 (float32)."""
    bank = MemoryBank(embedder=HashingEmbedder(dim=4), device=device)
    graphs = [random_agent_graph(n, 2 * n, 4, seed + a) for a, n in enumerate(sizes)]
    for a, g in enumerate(graphs):
        bank.add_agent_graph(f"g{a}", g)
    union = bank.union()
    positions = [r % len(sizes) for r in rows]
    agents = torch.tensor(positions, device=device)
    m = max(sizes[p] for p in positions)
    gen = torch.Generator().manual_seed(seed)
    weights = torch.rand(len(rows), m, generator=gen, dtype=torch.float64)
    keys = torch.rand(len(rows), m, generator=gen) < 0.3
    for b, p in enumerate(positions):
        keys[b, sizes[p] :] = False
        keys[b, 0] = True
    weights = torch.where(keys, weights, 0.0).to(device)
    keys = keys.to(device)
    cfg = AssociationConfig(
        method="power", power_dtype=dtype, power_tol=1e-9 if dtype == "float64" else 1e-6
    )
    ok = keys.any(1) & (weights.sum(1) > 0)
    got = segment_power_ppr(union, cfg, agents, weights, keys, ok)
    tol = 1e-9 if dtype == "float64" else 1e-6
    for b, p in enumerate(positions):
        n = sizes[p]
        g = graphs[p].to(device)
        want, _ = run_association(g, weights[b, :n, None], keys[b, :n, None], cfg)
        assert torch.allclose(got[b, :n], want[:, 0], atol=tol, rtol=0)
        assert bool((got[b, n:] == 0).all())


@pytest.mark.parametrize("per_agent", [1, 2])
def test_stacked_channels_equal_separate_runs(device, monkeypatch, per_agent) -> None:
    """graph + graph_undirected as one stacked iteration equal the two separate runs (each
    channel answering only its own rows), and the scipy product equals ``torch.mv``
    (``per_agent`` 1: one column, the matrix-vector path; 2: two columns)."""
    sizes = [7, 12, 1, 9, 15]
    bank = MemoryBank(embedder=HashingEmbedder(dim=4), device=device)
    for a, n in enumerate(sizes):
        bank.add_agent_graph(f"g{a}", random_agent_graph(n, 2 * n, 4, 40 + a))
    union = bank.union()
    positions = [p for p in range(len(sizes)) for _ in range(per_agent)]
    agents = torch.tensor(positions, device=device)
    m = max(sizes)
    gen = torch.Generator().manual_seed(3)
    weights = torch.rand(len(positions), m, generator=gen, dtype=torch.float64)
    keys = torch.rand(len(positions), m, generator=gen) < 0.4
    for b, p in enumerate(positions):
        keys[b, sizes[p] :] = False
        keys[b, 0] = True
    weights = torch.where(keys, weights, 0.0).to(device)
    keys = keys.to(device)
    cfg = AssociationConfig(method="power", power_tol=1e-9)
    ok = keys.any(1) & (weights.sum(1) > 0)
    only_some = ok.clone()
    only_some[1::2] = False  # the directed channel answers every other row only
    runs = {}
    for use_scipy in (False, True):
        monkeypatch.setattr(_operators, "USE_SCIPY", use_scipy)
        runs[use_scipy] = segment_power_ppr_channels(
            union, cfg, agents, weights, keys, [only_some, ok], undirected=[False, True]
        )
        directed = segment_power_ppr(union, cfg, agents, weights, keys, only_some)
        both = segment_power_ppr(union, cfg, agents, weights, keys, ok, undirected=True)
        # (equal up to rounding: a channel run alone may take fewer columns, another kernel)
        assert torch.allclose(runs[use_scipy][0], directed, atol=1e-12, rtol=0)
        assert torch.allclose(runs[use_scipy][1], both, atol=1e-12, rtol=0)
        assert bool((directed[1::2] == 0).all()) and bool((directed[0::2] > 0).any())
        assert not torch.equal(directed[0::2], both[0::2])  # two different operators
    for a, b in zip(runs[False], runs[True]):
        assert torch.allclose(a, b, atol=1e-12, rtol=0)
    with pytest.raises(ValidationError, match="one flag per channel"):
        segment_power_ppr_channels(union, cfg, agents, weights, keys, [ok], undirected=[])


def test_one_sparse_product_for_many_agents_shares_columns(device) -> None:
    """k queries per agent need k columns: 3 agents × 2 queries run as 2 columns."""
    bank = MemoryBank(embedder=HashingEmbedder(dim=4), device=device)
    for a in range(3):
        bank.add_agent_graph(f"g{a}", random_agent_graph(10, 30, 4, a))
    cfg = config("power", "max", similarity_threshold=-1.0, max_results=10)
    gen = torch.Generator().manual_seed(0)
    pairs = [(f"g{a}", torch.randn(4, generator=gen)) for a in (0, 1, 2, 0, 1, 2)]
    # negative similarity seeds under a negative floor: an error, as for one agent

    def raises(fn) -> bool:
        try:
            fn()
        except ValidationError as exc:
            assert "personalization" in str(exc)
            return True
        return False

    alone = [
        raises(lambda a=a, v=v: RetrDefaultPipeline().retrieve(cfg.into_request(bank.graph(a), v)))
        for a, v in pairs
    ]
    assert any(alone)
    assert raises(lambda: bank.query(pairs, config=cfg))
    fine = [p for p, bad in zip(pairs, alone) if not bad]
    assert not raises(lambda: bank.query(fine, config=cfg))
    cfg = config("power", similarity_threshold=0.0, max_results=2)
    results = bank.query(pairs, config=cfg)
    for (agent, vec), got in zip(pairs, results):
        g = bank.graph(agent).to(device)
        want = RetrDefaultPipeline().retrieve(cfg.into_request(g, vec, device=device))
        assert_same_result(got, want)


def test_add_notes_to_one_agent(device) -> None:
    bank = MemoryBank(device=device)
    bank.add_agent("a", sample_notes(list(range(0, 30))))
    bank.add_agent("b", sample_notes(list(range(20, 50))))
    cfg = config("power", similarity_threshold=0.2)
    bank.ask(["a", "b"], TEXTS[:2], config=cfg)
    other = bank.graph("b")
    assert bank.add_notes("a", sample_notes(list(range(30, 77)))) == 47
    assert len(bank.agent("a")) == 77
    assert bank.graph("b") is other  # the other agent is not re-snapshotted
    got = bank.ask(["a", "b"], TEXTS[:2], config=cfg)
    assert_same_result(got[0], _reference(bank, "a", TEXTS[0], cfg))
    assert_same_result(got[1], _reference(bank, "b", TEXTS[1], cfg))
    # a change through the SoulMem view reaches the bank too
    bank.agent("b").add_notes(sample_notes(list(range(50, 77))))
    got = bank.ask(["b"], [TEXTS[2]], config=cfg)[0]
    assert_same_result(got, _reference(bank, "b", TEXTS[2], cfg))


def test_same_note_in_two_agents_is_scoped(device) -> None:
    notes = sample_notes()
    bank = MemoryBank(device=device)
    bank.add_agent("x", sample_notes())
    bank.add_agent("y", sample_notes())
    cfg = config("power")
    rx, ry = bank.ask(["x", "y"], [TEXTS[0], TEXTS[0]], config=cfg)
    assert rx.association == ry.association and rx.association
    assert {i for i, _ in rx.association} <= {n.id for n in notes}


def test_precomputed_embeddings_and_bookkeeping(tmp_path) -> None:
    from soulmem_torch import embed_notes

    notes = sample_notes(list(range(40)))
    embs = embed_notes(notes, HashingEmbedder())
    bank = MemoryBank(embedder=HashingEmbedder())
    assert bank.add_agent("npc-17", notes) == 40
    assert bank.add_agent("npc-18", sample_notes(list(range(40))), embeddings=embs) == 40
    assert len(bank) == 2 and bank.agents() == ["npc-17", "npc-18"] and "npc-17" in bank
    a, b = bank.ask(["npc-17", "npc-18"], ["text a", "text a"])
    assert a.association == b.association
    width = HashingEmbedder().dim
    with pytest.raises(ValidationError, match=f"expected embeddings of width {width}"):
        bank.add_agent_graph("g", random_agent_graph(5, 5, width + 1, 0))
    bank.add_agent_graph("g", random_agent_graph(5, 5, width, 0))
    bank.save(tmp_path / "bank")
    loaded = MemoryBank.load(tmp_path / "bank")
    assert loaded.agents() == bank.agents()
    cfg = config("power")
    for agent in ("npc-17", "npc-18"):
        want = bank.ask([agent], [TEXTS[0]], config=cfg)[0]
        assert_same_result(loaded.ask([agent], [TEXTS[0]], config=cfg)[0], want)
    vec = torch.ones(width)
    want = bank.query([("g", vec)], config=cfg)[0]
    assert_same_result(loaded.query([("g", vec)], config=cfg)[0], want)


@pytest.mark.parametrize("which", ["default", "original", "dispersion", "family"])
def test_default_and_original_configs(which) -> None:
    bank = MemoryBank()
    bank.add_agent("a", sample_notes())
    bank.add_agent("b", sample_notes(list(range(0, 77, 2))))
    cfg = {
        "default": DefaultPipelineConfig.for_questions(),  # ask's default
        "original": DefaultPipelineConfig.original(),
        "dispersion": DefaultPipelineConfig(channel_weights="dispersion"),
        "family": DefaultPipelineConfig(channel_weights="family"),
    }[which]
    got = bank.ask(["a", "b"], TEXTS[:2], config=None if which == "default" else cfg)
    if which in ("dispersion", "family"):  # the weights change the lists (else: says nothing)
        plain = bank.ask(["a", "b"], TEXTS[:2])
        assert [r.association for r in got] != [r.association for r in plain]
    assert_same_result(got[0], _reference(bank, "a", TEXTS[0], cfg))
    assert_same_result(got[1], _reference(bank, "b", TEXTS[1], cfg))


def test_structured_dict_queries_and_priorities() -> None:
    bank = MemoryBank()
    bank.add_agent("a", sample_notes())
    q = {"variant": {"Situation": [{"narrative": "rain at the café"}]}, "tag": []}
    cfg = config("power")
    got = bank.query([("a", q), ("a", q)], config=cfg, priorities=[3, 1])
    want = bank.agent("a").query([q], config=cfg, priorities=[3])[0]
    assert_same_result(got[0], want)
    assert got[1].priority == 1


def test_errors() -> None:
    bank = MemoryBank()
    bank.add_agent("a", sample_notes(list(range(10))))
    with pytest.raises(NotFoundError, match="'nobody' is not in the bank"):
        bank.ask(["nobody"], ["hi"])
    with pytest.raises(ValidationError, match="texts: expected 2"):
        bank.ask(["a", "a"], ["hi"])
    with pytest.raises(ValidationError, match="already in the bank"):
        bank.add_agent("a", [])
    with pytest.raises(ValidationError, match="agent_id: expected a non-empty string"):
        bank.add_agent("", [])
    with pytest.raises(ValidationError, match="embeddings: expected 1"):
        bank.add_agent("b", sample_notes([0]), embeddings=[])
    with pytest.raises(ValidationError, match=r"requests\[0\]: expected an \(agent_id, query\)"):
        bank.query(["a"])
    with pytest.raises(ConfigError, match="config: expected a DefaultPipelineConfig"):
        bank.query([("a", "x")], config={"merge_top_k": 3})
    with pytest.raises(ValidationError, match="all structured .* or all plain"):
        bank.query([("a", "plain text"), ("a", {"variant": {"Semantic": []}, "tag": []})])
    with pytest.raises(ValidationError, match="texts\\[0\\]"):
        bank.ask(["a"], [""])
    with pytest.raises(NotFoundError):
        bank.add_notes("zz", [])
    assert bank.query([]) == []
    with pytest.raises(SoulMemError):
        MemoryBank.load("/nonexistent/bank")


# one changed value of every DefaultPipelineConfig field (``type`` tags are constants)
_FIELD_CHANGES = {
    "short_mem_with_history.clipping_length": 2,
    "short_mem_with_history.include_summary": False,
    "similarity.similarity_threshold": 0.5,
    "similarity.max_results": 2,
    "similarity.situation_units": "sum",
    "assoc_with_action.association.intensity_factor": 0.5,
    "assoc_with_action.association.confidence_factor": 0.7,
    "assoc_with_action.association.damping_factor": 0.5,
    "assoc_with_action.association.residue_threshold": 1e-3,
    "assoc_with_action.association.preference": "Semantic",
    "assoc_with_action.association.top_k": 3,
    "assoc_with_action.association.method": "push",
    "assoc_with_action.association.power_tol": 1e-6,
    "assoc_with_action.association.power_dtype": "float32",
    "assoc_with_action.association.power_dense_max_nodes": 0,
    "assoc_with_action.association.power_local": False,
    "assoc_with_action.action_top_k": 1,
    "assoc_with_action.abstract_source_priority": 1.0,
    "merge_top_k": 3,
    "fusion": "max",
    "channels": ("seeds", "text", "time"),
    "rank_constant": 1.0,
    "channel_weights": "dispersion",
    "seed_source": "fused",
    "personalization": "first_stage",
    "seed_ratio": 0.5,
}


def _field_paths(model: type, prefix: str = "") -> list[str]:
    paths = []
    for name, info in model.model_fields.items():
        if name == "type":
            continue
        sub = info.annotation
        if isinstance(sub, type) and hasattr(sub, "model_fields"):
            paths += _field_paths(sub, f"{prefix}{name}.")
        else:
            paths.append(prefix + name)
    return paths


def _changed(path: str, value) -> DefaultPipelineConfig:
    data = DefaultPipelineConfig().model_dump()
    node = data
    *parents, leaf = path.split(".")
    for part in parents:
        node = node[part]
    node[leaf] = value
    return DefaultPipelineConfig.model_validate(data)


def test_every_config_field_is_covered() -> None:
    """A new pipeline setting must join the parity test below (the bank has no whitelist)."""
    assert sorted(_field_paths(DefaultPipelineConfig)) == sorted(_FIELD_CHANGES)


@pytest.mark.parametrize("path", sorted(_FIELD_CHANGES))
def test_every_config_field_works_in_the_bank(path) -> None:
    """Each setting changed alone: the bank answers as a SoulMem with only that agent's notes."""
    cfg = _changed(path, _FIELD_CHANGES[path])
    assert cfg != DefaultPipelineConfig()
    bank = MemoryBank()
    bank.add_agent("a", sample_notes(list(range(0, 77, 2))))
    bank.add_agent("b", sample_notes(list(range(30, 77))))
    summary = "it rained all day at the café"  # the short-term window's summary, both sides
    bank.agent("a").working_memory.sliding_window.set_summary(summary)
    got = bank.ask(["a", "b"], TEXTS[:2], config=cfg)
    for r, agent, text in ((got[0], "a", TEXTS[0]), (got[1], "b", TEXTS[1])):
        entries = list(bank.agent(agent).cluster)
        mem = SoulMem(embedder=bank.embedder, device=bank.device)
        mem.working_memory.add_nodes([e.note for e in entries], [e.embedding for e in entries])
        if agent == "a":
            mem.working_memory.sliding_window.set_summary(summary)
        assert_same_result(r, mem.ask([text], config=cfg)[0])


def test_threads_may_share_a_bank() -> None:
    import threading

    bank = MemoryBank()
    bank.add_agent("a", sample_notes(list(range(0, 40))))
    bank.add_agent("b", sample_notes(list(range(20, 60))))
    cfg = config("power")
    want = bank.ask(["b"], [TEXTS[1]], config=cfg)[0]
    errors: list[BaseException] = []
    results: list[object] = []

    def reader() -> None:
        try:
            for _ in range(5):
                results.append(bank.ask(["b"], [TEXTS[1]], config=cfg)[0])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def writer() -> None:
        try:
            for i in range(40, 77, 8):
                bank.add_notes("a", sample_notes(list(range(i, min(i + 8, 77)))))
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(3)] + [
        threading.Thread(target=writer)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(results) == 15 and len(bank.agent("a")) == 77
    for got in results:  # agent b never changed: the same answer every time
        assert_same_result(got, want)


def test_a_change_splices_the_union_operator() -> None:
    """After a change only the changed agents are re-read: the spliced union and operator
    equal ones built from scratch."""
    from soulmem_torch.bank._operators import union_transition
    from soulmem_torch.bank._union import build_union

    bank = MemoryBank(embedder=HashingEmbedder(dim=4))
    for a in range(5):
        bank.add_agent_graph(f"g{a}", random_agent_graph(6 + a, 15, 4, a))
    bank.add_agent("notes", sample_notes(list(range(10))))
    # agents up to power_dense_max_nodes get the dense solve, not the union operators: off
    assoc = AssociationConfig(method="power", power_dense_max_nodes=0)
    cfg = DefaultPipelineConfig(assoc_with_action=AssociateWithActionConfig(association=assoc))
    bank.query([("g1", torch.ones(4))], config=cfg)  # builds (and caches) both operators
    bank.add_notes("notes", sample_notes(list(range(10, 30))))
    bank.add_agent_graph("g9", random_agent_graph(7, 20, 4, 9))
    union = bank.union()
    carried = {k[0] for k in union.cache["previous"][0]}
    assert carried == {"transition", "transition_undirected"}
    full = build_union(union.graphs, union.device)
    for name in ("ptr", "eptr", "sizes", "agent", "node_type", "edge_index", "edge_kind",
                 "intensity", "confidence", "prob", "tag_emb", "tag_mask", "field_emb",
                 "field_mask"):  # fmt: skip
        assert torch.equal(getattr(union, name), getattr(full, name)), name
    for undirected in (False, True):
        spliced = union_transition(union, assoc, undirected=undirected)
        fresh = union_transition(full, assoc, undirected=undirected)
        dense = spliced.transpose.to_dense()
        assert torch.allclose(dense, fresh.transpose.to_dense(), atol=1e-15)
        assert torch.equal(spliced.out_degree, fresh.out_degree)
    for agent in ("g0", "g4", "g9"):
        got = bank.query([(agent, torch.ones(4))], config=cfg)[0]
        want = RetrDefaultPipeline().retrieve(cfg.into_request(bank.graph(agent), torch.ones(4)))
        assert_same_result(got, want)


def test_short_term_window_is_each_agents_own() -> None:
    import asyncio

    from soulmem_torch.runtime import User

    bank = MemoryBank()
    bank.add_agent("a", sample_notes(list(range(20))))
    bank.add_agent("b", sample_notes(list(range(20))))
    for t in ("hello", "it is raining"):
        asyncio.run(bank.agent("a").working_memory.push(User(t)))
    cfg = config("power")
    got_a, got_b, got_a2 = bank.ask(["a", "b", "a"], [TEXTS[0], TEXTS[0], TEXTS[1]], config=cfg)
    want = bank.agent("a").ask([TEXTS[0]], config=cfg)[0]
    assert [str(m) for m in got_a.short_history] == [str(m) for m in want.short_history]
    assert len(got_a.short_history) == 2 and got_b.short_history == []
    assert got_a2.short_history == got_a.short_history
    assert got_a2.short_history is not got_a.short_history  # each result owns its list


def test_channels_without_scores_give_the_per_agent_lists() -> None:
    """Agents built from tensors have no note texts: a text-only fusion scores nothing (empty
    lists, as a per-agent pipeline gives) and the text channel adds nothing to the others."""
    graphs = [random_agent_graph(12, 30, 4, s) for s in range(3)]
    bank = MemoryBank(embedder=HashingEmbedder(dim=4))
    for i, g in enumerate(graphs):
        bank.add_agent_graph(f"t{i}", g)
    gen = torch.Generator().manual_seed(5)
    queries = [("t0", torch.randn(4, generator=gen)), ("t2", torch.randn(4, generator=gen))]
    for channels in (["text"], ["seeds", "text", "graph"], ["seeds", "graph"]):
        cfg = DefaultPipelineConfig(
            similarity=SimilarityConfig(similarity_threshold=-1.0), channels=channels
        )
        got = bank.query(queries, config=cfg)
        for (agent, vec), result in zip(queries, got):
            want = RetrDefaultPipeline().retrieve(cfg.into_request(bank.graph(agent), vec))
            assert_same_result(result, want)
            if channels == ["text"]:
                assert result.association == []
