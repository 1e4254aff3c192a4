"""The bank's exact dense PPR of small agents (``bank._dense``): bit for bit the per-agent
``power`` method, the factor store carried across union splices (a changed agent refilled,
the others kept) and compacted, and a batch mixing agents below and above
``power_dense_max_nodes``."""

from __future__ import annotations

import itertools

import pytest
import torch

from soulmem_torch import HashingEmbedder, MemoryBank
from soulmem_torch.bank import _dense
from soulmem_torch.bank._dense import DenseStore
from soulmem_torch.bank._pipeline import _association
from soulmem_torch.errors import ValidationError
from soulmem_torch.retrieve import (
    AssociateWithActionConfig,
    AssociationConfig,
    DefaultPipelineConfig,
    RetrDefaultPipeline,
    SimilarityConfig,
)
from soulmem_torch.retrieve.pipeline import undirected_association
from soulmem_torch.retrieve.propagation import run_association

from .helpers import TEXTS, assert_same_result, random_agent_graph, sample_notes

F64 = torch.float64


def pipeline(fusion: str = "rank", **association) -> DefaultPipelineConfig:
    return DefaultPipelineConfig(
        similarity=SimilarityConfig(similarity_threshold=0.0, max_results=3),
        assoc_with_action=AssociateWithActionConfig(association=AssociationConfig(**association)),
        fusion=fusion,
    )


def seeds(sizes: list[int], positions: list[int], seed: int, device: torch.device):
    """Random personalization on candidate rows ``(B, M)``: a few keys per row (one of them
    with weight 0), nothing past the agent's notes."""
    gen = torch.Generator().manual_seed(seed)
    m = max(sizes[p] for p in positions)
    weights = torch.rand(len(positions), m, generator=gen, dtype=F64)
    keys = torch.rand(len(positions), m, generator=gen) < 0.3
    for b, p in enumerate(positions):
        keys[b, sizes[p] :] = False
        keys[b, 0] = True
        keys[b, sizes[p] - 1] = True
    weights = torch.where(keys, weights, 0.0)
    weights[:, 0] += 0.1
    for b, p in enumerate(positions):
        if sizes[p] > 1:
            weights[b, sizes[p] - 1] = 0.0  # a zero-weight key
    return weights.to(device), keys.to(device)


def stage(bank: MemoryBank, positions: list[int], weights, keys, cfg: AssociationConfig):
    """The bank's PPR stage (directed and graph_undirected channels) on the union."""
    union = bank.union()
    agents = torch.tensor(positions, device=bank.device)
    scores, ok, both = _association(union, positions, agents, weights, keys, cfg, undirected=True)
    assert bool(ok.all())
    return scores, both


def per_agent(graph, weights, keys, cfg: AssociationConfig):
    """The retrieve layer's PPR of the columns ``weights`` (n, B) on one agent's snapshot."""
    directed, _ = run_association(graph, weights, keys, cfg)
    return directed, undirected_association(graph, weights, keys, cfg)


def assert_rows_equal(bank, names, positions, weights, keys, cfg, exact: set[int]) -> None:
    """Every row equals the per-agent computation: bit for bit (on the CPU) for the agents
    ``exact`` (dense), within 1e-9 for the others (the union's power iteration)."""
    scores, both = stage(bank, positions, weights, keys, cfg)
    for b, p in enumerate(positions):
        graph = bank.graph(names[p]).to(bank.device)
        n = int(graph.num_nodes)
        w, k = weights[b, :n, None].contiguous(), keys[b, :n, None].contiguous()
        directed, undirected = per_agent(graph, w, k, cfg)
        assert bool((scores[b, n:] == 0).all()) and bool((both[b, n:] == 0).all())
        if p in exact and bank.device.type == "cpu":
            assert torch.equal(scores[b, :n], directed[:, 0]), (p, b)
            assert torch.equal(both[b, :n], undirected[:, 0]), (p, b)
        else:
            assert torch.allclose(scores[b, :n], directed[:, 0], atol=1e-9, rtol=0), (p, b)
            assert torch.allclose(both[b, :n], undirected[:, 0], atol=1e-9, rtol=0), (p, b)
    # the agent's rows as one per-agent batch: the same bits again (batch invariance)
    if bank.device.type == "cpu":
        for p in exact & set(positions):
            rows = [b for b, q in enumerate(positions) if q == p]
            n = int(bank.graph(names[p]).num_nodes)
            w = weights[rows, :n].T.contiguous()
            k = keys[rows, :n].T.contiguous()
            directed, undirected = per_agent(bank.graph(names[p]), w, k, cfg)
            assert torch.equal(scores[rows, :n], directed.T)
            assert torch.equal(both[rows, :n], undirected.T)


def dense_stores(bank: MemoryBank) -> dict:
    return {k: v for k, v in bank.union().cache.items() if isinstance(k, tuple) and k[0] == "dense"}


# ---- (a) bit for bit the per-agent path ----------------------------------------------------
def test_dense_stage_equals_per_agent_bit_for_bit(device) -> None:
    sizes = [9, 30, 1, 17, 64]
    names = [f"g{a}" for a in range(len(sizes))]
    bank = MemoryBank(embedder=HashingEmbedder(dim=4), device=device)
    for a, n in enumerate(sizes):
        bank.add_agent_graph(names[a], random_agent_graph(n, 3 * n, 4, 70 + a))
    positions = [0, 1, 4, 1, 3, 2, 0, 4, 4]
    weights, keys = seeds(sizes, positions, 0, device)
    cfg = AssociationConfig()  # the default: power, dense up to 128 notes
    assert_rows_equal(bank, names, positions, weights, keys, cfg, exact=set(range(5)))
    assert len(dense_stores(bank)) == 2  # one per channel
    # another damping and preference: other stores, the same bits
    cfg = AssociationConfig(damping_factor=0.9, preference="Semantic")
    assert_rows_equal(bank, names, positions, weights, keys, cfg, exact=set(range(5)))
    assert len(dense_stores(bank)) == 4


def test_ask_equals_per_agent_soulmem_with_the_default_config() -> None:
    """The whole pipeline on sample-note agents (all under 128 notes): the association lists
    are equal exactly; seeds and actions inherit the float32 rounding of the similarity
    matmuls (their accumulation order depends on the batch shape), so 1e-6 there."""
    from soulmem_torch import SoulMem

    bank = MemoryBank()
    subsets = [list(range(0, 30)), list(range(20, 60)), list(range(0, 77, 2)), list(range(77))]
    for a, subset in enumerate(subsets):
        bank.add_agent(f"a{a}", sample_notes(subset))
    agents = [f"a{i % 4}" for i in range(8)]
    texts = [TEXTS[i % len(TEXTS)] for i in range(8)]
    cfg = DefaultPipelineConfig.for_questions()  # ask's default
    got = bank.ask(agents, texts)
    for agent, text, result in zip(agents, texts, got):
        entries = list(bank.agent(agent).cluster)
        mem = SoulMem(embedder=bank.embedder)
        mem.working_memory.add_nodes([e.note for e in entries], [e.embedding for e in entries])
        want = mem.ask([text], config=cfg)[0]
        assert_same_result(result, want)
        if result.seeds == want.seeds:  # identical seeds: identical PPR, identical lists
            assert result.association == want.association
            assert result.action == want.action


# ---- (b) a change refills only the changed agent ------------------------------------------
def test_add_notes_refills_only_the_changed_agent(monkeypatch) -> None:
    bank = MemoryBank()
    names = ["a", "b", "c"]
    bank.add_agent("a", sample_notes(list(range(0, 10))))
    bank.add_agent("b", sample_notes(list(range(10, 50))))
    bank.add_agent("c", sample_notes(list(range(40, 70))))
    cfg = AssociationConfig()
    sizes = [10, 40, 30]
    positions = [0, 1, 2, 1]
    weights, keys = seeds(sizes, positions, 1, torch.device("cpu"))
    assert_rows_equal(bank, names, positions, weights, keys, cfg, exact={0, 1, 2})
    before = {k: (list(s.start), list(s.length), s.data.clone()) for k, s in
              dense_stores(bank).items()}  # fmt: skip
    assert len(before) == 2
    for start, length, _ in before.values():
        assert min(start) >= 0 and length == [n * n + n for n in sizes]

    calls = []
    real = _dense._dense_blocks

    def spy(union, op, missing, d):
        calls.extend(int(union.sizes[p]) for p in missing)
        return real(union, op, missing, d)

    monkeypatch.setattr(_dense, "_dense_blocks", spy)
    assert bank.add_notes("a", sample_notes(list(range(70, 77)))) == 7
    sizes = [17, 40, 30]
    weights, keys = seeds(sizes, [*positions, 0, 0], 2, torch.device("cpu"))
    assert_rows_equal(bank, names, [*positions, 0, 0], weights, keys, cfg, exact={0, 1, 2})
    assert calls == [17, 17]  # only agent a, once per channel
    after = dense_stores(bank)
    assert set(after) == set(before)
    for key, store in after.items():
        start, length, data = before[key]
        for p in (1, 2):  # kept: same place, same bits
            assert store.start[p] == start[p] and store.length[p] == length[p]
            s, n = start[p], length[p]
            assert torch.equal(store.data[s : s + n], data[s : s + n])
        assert store.start[0] >= 0 and store.start[0] != start[0]
        assert store.length[0] == 17 * 17 + 17
        assert store.live == sum(n * n + n for n in sizes)
    # a new agent is appended; the others keep their blocks
    calls.clear()
    bank.add_agent("d", sample_notes(list(range(5, 25))))
    names.append("d")
    sizes.append(20)
    positions = [3, 0, 1, 2, 3]
    weights, keys = seeds(sizes, positions, 3, torch.device("cpu"))
    assert_rows_equal(bank, names, positions, weights, keys, cfg, exact={0, 1, 2, 3})
    assert calls == [20, 20]


def test_repeated_changes_compact_the_store() -> None:
    """An agent changed again and again leaves garbage blocks; the store compacts them away
    and the results stay those of the per-agent path."""
    bank = MemoryBank(embedder=HashingEmbedder(dim=4))
    graphs = [random_agent_graph(6, 15, 4, 0), random_agent_graph(40, 100, 4, 1)]
    bank.add_agent_graph("small", graphs[0])
    bank.add_agent("big", sample_notes(list(range(0, 20))))
    names = ["small", "big"]
    cfg = AssociationConfig()
    key = ("dense", False, 0.65)
    compacted = False
    for step, end in enumerate(range(20, 78, 8)):
        if step:
            bank.add_notes("big", sample_notes(list(range(end - 8, min(end, 77)))))
        sizes = [6, min(end, 77)]
        weights, keys = seeds(sizes, [0, 1, 1], step, torch.device("cpu"))
        assert_rows_equal(bank, names, [0, 1, 1], weights, keys, cfg, exact={0, 1})
        (store,) = [s for k, s in dense_stores(bank).items() if k[:3] == key]
        assert store.used <= store.data.numel()
        assert store.live == sum(n * n + n for n in sizes)
        if store.used == store.live and step:  # no garbage left: it was compacted
            compacted = True
    assert compacted


# ---- (c) the store itself --------------------------------------------------------------
def test_dense_store_append_carry_and_compaction() -> None:
    """Blocks survive appends (growth), carries (the old store untouched) and compactions;
    compaction happens once dropped blocks pile up. (Capacities are the store's business:
    only what it promises is checked.)"""
    gen = torch.Generator().manual_seed(0)
    cpu = torch.device("cpu")

    def block(n: int) -> torch.Tensor:
        return torch.rand(n, generator=gen, dtype=F64)

    def check(store: DenseStore, blocks: dict[int, torch.Tensor]) -> None:
        for p, b in blocks.items():
            s = store.start[p]
            assert s >= 0 and store.length[p] == b.numel()
            assert torch.equal(store.data[s : s + b.numel()], b)
        for p in range(len(store.start)):
            if p not in blocks:
                assert store.start[p] == -1 and store.length[p] == 0
        assert store.live == sum(b.numel() for b in blocks.values())
        assert store.live <= store.used <= store.data.numel()
        ends = sorted((store.start[p], store.start[p] + b.numel()) for p, b in blocks.items())
        assert all(e <= s for (_, e), (s, _) in itertools.pairwise(ends))  # no overlap
        assert store.start_tensor(cpu).tolist() == store.start

    store = DenseStore.empty(3, cpu)
    check(store, {})
    assert store.used == 0
    b0, b1 = block(100), block(10)
    store.append([b0, b1], [0, 1])
    check(store, {0: b0, 1: b1})
    assert store.start[:2] == [0, 100] and store.used == 110
    big = block(50_000)
    store.append([big], [2])  # grows, the blocks move along
    check(store, {0: b0, 1: b1, 2: big})
    assert store.start == [0, 100, 110] and store.used == 50_110

    # agent 2 changed, agents 3 and 4 are new: kept blocks stay where they are
    carried = store.carried(5, {2})
    check(carried, {0: b0, 1: b1})
    assert carried.start[:2] == [0, 100] and carried.used == 50_110
    b3 = block(7)
    carried.append([b3], [3])
    check(carried, {0: b0, 1: b1, 3: b3})
    check(store, {0: b0, 1: b1, 2: big})  # the store it came from is untouched

    # agent 4 changes again and again: the dropped blocks are compacted away
    blocks = {0: b0, 1: b1, 3: b3}
    current = carried
    compacted = 0
    for _ in range(12):
        current = current.carried(5, {4})
        blocks.pop(4, None)
        used = current.used
        blocks[4] = block(3_000)
        current.append([blocks[4]], [4])
        check(current, blocks)
        if current.used < used + 3_000:  # garbage was dropped: compacted
            compacted += 1
            assert current.used == current.live
    assert compacted >= 1
    assert current.used < 50_117 + 12 * 3_000  # not every dropped block is kept
    check(carried, {0: b0, 1: b1, 3: b3})  # earlier stores still read their blocks
    check(store, {0: b0, 1: b1, 2: big})


# ---- (d) agents on both sides of the limit ----------------------------------------------
@pytest.mark.parametrize("limit", [5, 12])
def test_mixed_sizes_around_the_limit(device, limit) -> None:
    sizes = [3, 5, 6, 12, 1, 25]
    names = [f"g{a}" for a in range(len(sizes))]
    graphs = [random_agent_graph(n, 2 * n + 1, 4, 90 + a) for a, n in enumerate(sizes)]
    bank = MemoryBank(embedder=HashingEmbedder(dim=4), device=device)
    for name, g in zip(names, graphs):
        bank.add_agent_graph(name, g)
    positions = [0, 5, 2, 1, 3, 4, 5, 0, 2]
    weights, keys = seeds(sizes, positions, 4, device)
    cfg = AssociationConfig(power_dense_max_nodes=limit)
    small = {p for p, n in enumerate(sizes) if n <= limit}
    assert_rows_equal(bank, names, positions, weights, keys, cfg, exact=small)
    for key, store in dense_stores(bank).items():
        assert [store.start[p] >= 0 for p in range(len(sizes))] == [
            p in small for p in range(len(sizes))
        ], key
    # the whole pipeline, plain queries
    gen = torch.Generator().manual_seed(5)
    vectors = torch.randn(len(positions), 4, generator=gen)
    pairs = [(names[p], vectors[i]) for i, p in enumerate(positions)]
    for fusion in ("rank", "max"):
        config = pipeline(fusion, power_dense_max_nodes=limit)
        got = bank.query(pairs, config=config)
        for (name, vec), result in zip(pairs, got):
            g = graphs[names.index(name)].to(device)
            want = RetrDefaultPipeline().retrieve(config.into_request(g, vec, device=device))
            assert_same_result(result, want)


def test_cache_limit_drops_the_least_recently_asked(monkeypatch) -> None:
    """Past ``SOULMEM_DENSE_CACHE_BYTES`` the least recently asked agents' blocks are dropped
    (never those of the call at hand) and recomputed, to the same bits, when asked again."""
    bank = MemoryBank()
    names = ["a", "b", "c", "d"]
    for i, name in enumerate(names):
        bank.add_agent(name, sample_notes(list(range(10 * i, 10 * i + 20))))
    cfg = AssociationConfig()
    sizes = [20, 20, 20, 20]
    block = (20 * 20 + 20) * 8
    monkeypatch.setenv("SOULMEM_DENSE_CACHE_BYTES", str(2 * block))  # two agents per store
    for step, positions in enumerate([[0, 1], [2], [3, 0], [1, 1, 2]]):
        weights, keys = seeds(sizes, positions, step, torch.device("cpu"))
        assert_rows_equal(bank, names, positions, weights, keys, cfg, exact={0, 1, 2, 3})
        for store in dense_stores(bank).values():
            held = {p for p, s in enumerate(store.start) if s >= 0}
            assert set(positions) <= held  # the call's own agents are kept
            assert store.live * 8 <= max(2 * block, len(set(positions)) * block)
    # step 2 asked d and a: b and c (asked before them) were dropped, then b and c refilled
    last = dense_stores(bank)
    for store in last.values():
        assert {p for p, s in enumerate(store.start) if s >= 0} == {1, 2}


def test_cache_limit_must_be_a_byte_count(monkeypatch) -> None:
    monkeypatch.setenv("SOULMEM_DENSE_CACHE_BYTES", "lots")
    with pytest.raises(ValidationError, match="SOULMEM_DENSE_CACHE_BYTES"):
        _dense.cache_limit()
    monkeypatch.setenv("SOULMEM_DENSE_CACHE_BYTES", "-1")
    with pytest.raises(ValidationError, match=">= 0"):
        _dense.cache_limit()


def test_dense_blocks_read_off_the_union_equal_each_agents_own_factors(monkeypatch) -> None:
    """The batched fill (every missing agent's dense ``P^T`` scattered from the union's
    transition, one batched inverse per size, chunked) has the bits of ``dense_factors`` on
    each agent's own operator, both channels, same-sized and lone agents."""
    from soulmem_torch.bank._union import agent_graph
    from soulmem_torch.functional.ppr_dense import dense_factors_many
    from soulmem_torch.retrieve.operators import transition, undirected_transition

    bank = MemoryBank()
    spans = [(0, 10), (10, 20), (20, 50), (40, 70), (5, 15), (30, 60)]
    for a, (lo, hi) in enumerate(spans):
        bank.add_agent(f"a{a}", sample_notes(list(range(lo, hi))))
    union = bank.union()
    cfg = AssociationConfig(preference="Semantic")
    missing = [5, 0, 2, 1, 4, 3]
    from soulmem_torch.bank._operators import union_transition

    monkeypatch.setattr(_dense, "_BATCH_FLOATS", 250)  # chunks of at most 2
    for undirected in (False, True):
        op = union_transition(union, cfg, undirected=undirected)
        chunks = _dense._dense_blocks(union, op, missing, 0.7)
        assert sorted(p for ps, _, _ in chunks for p in ps) == sorted(missing)
        store = _dense.DenseStore.empty(len(spans), torch.device("cpu"))
        store.append_chunks(chunks)  # (written straight from the batched inverses)
        build = undirected_transition if undirected else transition
        operators = [build(agent_graph(union, p), cfg) for p in missing]
        want = dense_factors_many(operators, 0.7, cache=False)
        for p, f in zip(missing, want):
            block = store.data[store.start[p] : store.start[p] + store.length[p]]
            assert torch.equal(block, torch.cat([f.inverse_t.reshape(-1), f.dangling_mass]))
        assert bool((store.data[store.used :] == 0).all())  # zero past the blocks


def test_a_failed_append_changes_nothing_the_store_reads() -> None:
    """A write that fails midway (a chunk whose mass does not fit, a block of the wrong
    dtype) records no block, keeps the earlier ones, and leaves the buffer zero past them —
    grown or not."""
    store = DenseStore.empty(4, torch.device("cpu"))
    good = torch.arange(1.0, 7.0, dtype=torch.float64)  # an agent of 2 notes: 4 + 2 floats
    store.append([good], [0])
    before = (list(store.start), list(store.length), store.used)
    inverses = torch.ones(2, 3, 3, dtype=torch.float64)
    bad_mass = torch.ones(2, 4, dtype=torch.float64)  # (k, n + 1): does not fit its rows
    for chunks in (
        [
            ([1, 2], inverses, torch.ones(2, 3, dtype=torch.float64)),
            ([3], inverses[:1], bad_mass[:1]),
        ],
        [([1, 2, 3], torch.ones(3, 200, 200, dtype=torch.float64), bad_mass[:1].expand(3, 4))],
    ):  # (the second grows the buffer first)
        with pytest.raises(RuntimeError):
            store.append_chunks(chunks)
        assert (list(store.start), list(store.length), store.used) == before
        assert torch.equal(store.data[: store.used], good)
        assert bool((store.data[store.used :] == 0).all())
    store.append_chunks([([1], inverses[:1], torch.full((1, 3), 2.0, dtype=torch.float64))])
    assert store.data[store.start[1] : store.start[1] + 12].tolist() == [1.0] * 9 + [2.0] * 3
