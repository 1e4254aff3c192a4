"""MemoryBank: 1,000 queries from 1,000 different agents in one call vs a per-agent loop.

Run: ``pytest benchmarks/test_bench_bank.py --benchmark-enable --benchmark-only -s``.

Bank: 10,000 agents × 100 notes (1M notes), built from tensors (``MemoryGraph.from_tensors``
per agent, then ``MemoryBank.add_agent_graph``): per agent 40% Semantic, 35% Specific, 20%
Abstract and 5% Procedure notes, 3 random links per note inside the agent (a link into a
Procedure note is a TrigToAction link), a 32-wide tag vector per note (plain single-vector
mode: the queries are vectors, noisy copies of a note of the asking agent). Config: the default
pipeline (rank fusion; PPR by the ``power`` method, which for agents of 100 notes ≤
``power_dense_max_nodes`` is the exact solve from each agent's cached dense inverse — the bank
keeps the asking agents' inverses in one buffer per channel, reported as ``dense_store_mb``).

Reported, side by side in one run, 1 torch thread:

* ``bank``: ``MemoryBank.query`` of 1,000 (agent, vector) pairs, 1,000 distinct agents;
* ``loop``: the per-agent path — ``RetrDefaultPipeline().retrieve`` on each asking agent's own
  snapshot (what ``SoulMem.query`` runs for one agent), measured on the first ``LOOP_SUBSET``
  queries, warm (each agent's operator cached by a first pass, as the bank's union operator is
  by its warm-up call), and extrapolated per query (results checked equal on that subset);
* peak extra memory of the bank call — CPU: resident size sampled every millisecond minus the
  size before the call; CUDA: ``max_memory_allocated`` minus the allocation before it — next
  to the union's size and the candidate block ``batch × largest agent``;
* ``rebuild``: adding one agent and answering one query, median of three such changes (the
  union is spliced — the unchanged agents' tensors copied as slices, no other agent
  re-snapshotted — and the new agent's dense inverses computed when it is first asked).
"""

from __future__ import annotations

import gc
import os
import threading
import time

import pytest
import torch

from benchmarks import _harness
from soulmem_torch.bank import MemoryBank
from soulmem_torch.embedding import HashingEmbedder
from soulmem_torch.functional.codes import (
    LINK_PROC,
    LINK_SEM,
    LINK_SIT_ABSTRACT_TO_SPECIFIC,
    LINK_SIT_SPECIFIC_TO_ABSTRACT,
    NODE_ABSTRACT,
    NODE_PROCEDURE,
    NODE_SEMANTIC,
    NODE_SPECIFIC,
)
from soulmem_torch.graph import MemoryGraph
from soulmem_torch.retrieve import DefaultPipelineConfig, RetrDefaultPipeline

NUM_AGENTS = int(os.environ.get("SOULMEM_BENCH_BANK_AGENTS", "10000"))
NOTES = 100
DIM = 32
BATCH = 1000
LOOP_SUBSET = 100
LINKS_PER_NOTE = 3

_CACHE: dict[str, object] = {}


def agent_graphs(num_agents: int, notes: int, *, seed: int = 0) -> list[MemoryGraph]:
    """The synthetic agents of the module docstring (CPU)."""
    gen = torch.Generator().manual_seed(seed)
    n = num_agents * notes
    u = torch.rand(n, generator=gen)
    node_type = torch.full((n,), NODE_SEMANTIC, dtype=torch.int64)
    node_type[u >= 0.40] = NODE_SPECIFIC
    node_type[u >= 0.75] = NODE_ABSTRACT
    node_type[u >= 0.95] = NODE_PROCEDURE
    e = notes * LINKS_PER_NOTE
    src = torch.randint(0, notes, (num_agents, e), generator=gen)
    dst = torch.randint(0, notes, (num_agents, e), generator=gen)
    kinds = torch.tensor([LINK_SEM, LINK_SIT_ABSTRACT_TO_SPECIFIC, LINK_SIT_SPECIFIC_TO_ABSTRACT])
    kind = kinds[torch.randint(0, 3, (num_agents, e), generator=gen)]
    base = torch.randn(n, DIM, generator=gen)
    tag = base / base.norm(dim=1, keepdim=True)
    intensity = 0.1 + 0.9 * torch.rand(num_agents, e, generator=gen, dtype=torch.float64)
    conf = torch.rand(num_agents, e, generator=gen)
    prob = torch.rand(num_agents, e, generator=gen, dtype=torch.float64)
    graphs = []
    for a in range(num_agents):
        nt = node_type[a * notes : (a + 1) * notes]
        k = torch.where(nt[dst[a]] == NODE_PROCEDURE, LINK_PROC, kind[a])
        graphs.append(
            MemoryGraph.from_tensors(
                torch.stack([src[a], dst[a]]),
                num_nodes=notes,
                edge_kind=k,
                node_type=nt,
                intensity=intensity[a],
                confidence=conf[a],
                prob=prob[a],
                tag_emb=tag[a * notes : (a + 1) * notes],
            )
        )
    return graphs


def _bank(device: torch.device) -> tuple[MemoryBank, list[MemoryGraph]]:
    if _CACHE.get("device") != device:
        _CACHE.clear()
        gc.collect()
        graphs = agent_graphs(NUM_AGENTS, NOTES)
        bank = MemoryBank(embedder=HashingEmbedder(dim=DIM), device=device)
        for a, g in enumerate(graphs):
            bank.add_agent_graph(f"npc-{a}", g)
        bank.union()
        _CACHE.update(bank=bank, graphs=graphs, device=device)
        gc.collect()
    return _CACHE["bank"], _CACHE["graphs"]  # type: ignore[return-value]


def _requests(graphs: list[MemoryGraph]) -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    agents = torch.randperm(len(graphs), generator=gen)[:BATCH].tolist()
    notes = torch.randint(0, NOTES, (len(agents),), generator=gen).tolist()
    noise = 0.5 * torch.randn(len(agents), DIM, generator=gen) / DIM**0.5
    return [
        (f"npc-{a}", graphs[a].tag_emb[i] + noise[j]) for j, (a, i) in enumerate(zip(agents, notes))
    ]


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _PeakRss:
    """Samples the resident set size every millisecond while active."""

    def __enter__(self) -> _PeakRss:
        self.base = _rss()
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss())
            time.sleep(0.001)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())


def _same(a, b, tol: float = 1e-6) -> bool:
    if len(a) != len(b):
        return False
    return all(abs(x[1] - y[1]) <= tol * max(1.0, abs(y[1])) for x, y in zip(a, b))


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc (RSS sampler)")
def test_bank_vs_per_agent_loop(benchmark, bench_device):
    """1,000 queries from 1,000 agents: one bank call vs the per-agent loop (1 thread on CPU)."""
    benchmark.group = "bank-10k-agents"
    threads = _harness.set_threads()
    cuda = bench_device.type == "cuda"
    t0 = time.perf_counter()
    bank, graphs = _bank(bench_device)
    build_s = time.perf_counter() - t0
    requests = _requests(graphs)
    config = DefaultPipelineConfig()
    for a, _ in requests:  # the ids of the asking agents, made once outside the timed calls
        _ = bank.graph(a).ids

    def run():
        out = bank.query(requests, config=config)
        _harness.sync(bench_device)
        return out

    first, _ = _harness.time_call(run, bench_device)  # warm-up: the union operator is built
    gc.collect()
    if cuda:
        torch.cuda.reset_peak_memory_stats(bench_device)
        base_cuda = torch.cuda.memory_allocated(bench_device)
    with _PeakRss() as peak:
        t1 = time.perf_counter()
        out = run()
        once = time.perf_counter() - t1
    peak_extra = (
        torch.cuda.max_memory_allocated(bench_device) - base_cuda if cuda else peak.peak - peak.base
    )
    rounds = _harness.rounds_for(once, 3.0)
    out = benchmark.pedantic(run, rounds=rounds, iterations=1, warmup_rounds=0)
    mean = _harness.mean_seconds(benchmark, once)
    stats = getattr(benchmark, "stats", None)
    median = float(stats.stats.median) if stats is not None else once

    pipeline = RetrDefaultPipeline()
    subset = requests[: LOOP_SUBSET // (5 if cuda else 1)]
    graphs_on = {a: bank.graph(a).to(bench_device) for a, _ in subset}
    for agent, vec in subset:  # warm: each agent's transition operator cached, as the bank's
        pipeline.retrieve(config.into_request(graphs_on[agent], vec, device=bench_device))
    loop_out = []
    _harness.sync(bench_device)
    t2 = time.perf_counter()
    for agent, vec in subset:
        req = config.into_request(graphs_on[agent], vec, device=bench_device)
        loop_out.append(pipeline.retrieve(req))
    _harness.sync(bench_device)
    loop_s = time.perf_counter() - t2
    loop_per_query = loop_s / len(subset)
    equal = all(
        _same(x.association, y.association) and _same(x.action, y.action)
        and [i for i, _ in x.association] == [i for i, _ in y.association]
        for x, y in zip(out[: len(subset)], loop_out)
    )  # fmt: skip
    assert equal, "the bank and the per-agent loop disagree"

    union = bank.union()
    union_bytes = sum(
        t.numel() * t.element_size()
        for t in (union.node_type, union.edge_index, union.edge_kind, union.intensity,
                  union.confidence, union.prob, union.tag_mask, union.agent,
                  union.cache["tag_normalized_padded"])  # the vectors it holds: normalized
    )  # fmt: skip
    # a change: add one agent, answer one query (median of three changes)
    changes = []
    for extra in agent_graphs(3, NOTES, seed=7):
        gc.collect()
        t3 = time.perf_counter()
        bank.add_agent_graph(f"new-{time.perf_counter_ns()}", extra)
        bank.query(requests[:1], config=config)
        changes.append(time.perf_counter() - t3)
    rebuild_s = sorted(changes)[1]

    row = {
        "group": benchmark.group, "method": "bank", "device": str(bench_device),
        "agents": len(bank), "n": int(union.num_nodes), "e": int(union.edge_index.shape[1]),
        "batch": len(requests), "mean_ms": mean * 1e3, "us_per_query": mean * 1e6 / BATCH,
        "qps": BATCH / mean, "loop_us_per_query": loop_per_query * 1e6,
        "loop_subset": len(subset), "speedup": loop_per_query * BATCH / mean,
        "median_ms": median * 1e3, "speedup_median": loop_per_query * BATCH / median,
        "peak_extra_mb": peak_extra / 2**20, "rss_mb": peak.peak / 2**20,
        "union_mb": union_bytes / 2**20,
        "dense_store_mb": sum(
            v.data.numel() * v.data.element_size() for k, v in union.cache.items()
            if isinstance(k, tuple) and k and k[0] == "dense"
        ) / 2**20,
        "candidates_mb": BATCH * NOTES * DIM * 4 / 2**20,
        "build_s": build_s, "first_call_s": first, "rebuild_add_agent_s": rebuild_s,
        "merged": sum(len(r.association) for r in out) / BATCH,
        "actions": sum(len(r.action) for r in out) / BATCH,
        "threads": None if cuda else threads, "rounds": rounds,
    }  # fmt: skip
    benchmark.extra_info.update({k: v for k, v in row.items() if k != "group"})
    _harness.record(row)
    print(row)
    assert row["merged"] > 0


# ------------------------------------------------------------------------------------------
# structured similarity on a bank of real notes (issue 17)
# ------------------------------------------------------------------------------------------
REAL_AGENTS = 200
REAL_TEXTS = ["a rainy afternoon at the café", "谁教我做桂花糕？", "who lent me an umbrella",
              "the market square at noon", "coffee with an old friend"]  # fmt: skip


def real_note_bank(num_agents: int = REAL_AGENTS) -> tuple[MemoryBank, list[str], list[str]]:
    """``num_agents`` agents of 50–75 notes of the bundled sample memory (~62 structured notes
    each, deep copies), the offline ``HashingEmbedder`` (width 1024), one question each."""
    from benchmarks._memory_probe import sample_note_bank

    bank = MemoryBank(embedder=HashingEmbedder())
    agents = sample_note_bank(num_agents)
    for agent_id, notes in agents:
        bank.add_agent(agent_id, notes)
    ids = [a for a, _ in agents]
    return bank, ids, [REAL_TEXTS[i % len(REAL_TEXTS)] for i in range(len(ids))]


@pytest.mark.parametrize("stage", ["gathered", "grouped", "ask"])
def test_structured_similarity_real_notes(benchmark, stage: str) -> None:
    """The structured similarity of 400 queries (each question's concept and episode query)
    against their agents' notes on the union — the gathered candidate rows or one call per
    agent — and the whole warm ``bank.ask`` (1 thread)."""
    from soulmem_torch.api import text_queries
    from soulmem_torch.bank import _union
    from soulmem_torch.embedding import embed_queries

    benchmark.group = "bank-structured-real-notes"
    _harness.set_threads()
    bank, ids, texts = real_note_bank()
    bank.ask(ids, texts)  # warm: snapshots, union, operators
    union = bank.union()
    positions = [bank.agents().index(a) for a in ids for _ in (0, 1)]
    queries = [q for t in texts for q in text_queries(t)]
    batch = embed_queries(queries, bank.embedder)
    idx, valid, m = _union.candidates(union, torch.tensor(positions))
    if stage == "gathered":

        def run():
            return _union.structured_similarity(union, batch, idx, valid, string=None, weights=None)
    elif stage == "grouped":

        def run():
            return _union.grouped_structured_similarity(
                union, batch, positions, m, string=None, weights=None
            )
    else:

        def run():
            return bank.ask(ids, texts, record=False)

    benchmark.pedantic(run, rounds=3, iterations=1, warmup_rounds=1)
    mean = _harness.mean_seconds(benchmark, float("nan"))
    row = {"group": benchmark.group, "method": stage, "device": "cpu", "agents": len(ids),
           "n": union.num_nodes, "batch": len(queries), "mean_ms": mean * 1e3}  # fmt: skip
    benchmark.extra_info.update({k: v for k, v in row.items() if k != "group"})
    _harness.record(row)
