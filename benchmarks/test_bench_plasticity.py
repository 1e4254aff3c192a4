"""Plasticity benchmark: the batched update of a 10,000-agent × 100-note bank (8 hot notes per
agent) as tensor ops (``plasticity_kernel``) beside a per-link Python loop, same results.

Run: ``OMP_NUM_THREADS=1 pytest benchmarks/test_bench_plasticity.py --benchmark-enable``. The
union-shaped tensors (and their Python-list copies for the loop) are built outside the timed
call; ``test_kernel_equals_the_loop`` checks that both give the same links and values.
``test_bench_bank_update_plasticity`` times the whole ``MemoryBank.update_plasticity`` (records
gathered from the agents' ``Record`` objects, kernel, write-back to the notes, new snapshots) on
a smaller bank of note-backed agents.
"""

from __future__ import annotations

import functools
import struct

import pytest
import torch

from soulmem_torch.consolidate.plasticity import (
    EPSILON,
    LINK_VALUE_MAX,
    LINK_VALUE_MIN,
    plasticity_delta,
    plasticity_kernel,
)
from soulmem_torch.functional.codes import LINK_PROC, LINK_SEM

AGENTS = 10_000
NOTES = 100
DEGREE = 3
HOT = 8
TOP_K = 8


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@functools.lru_cache(maxsize=1)
def bank_tensors(agents: int = AGENTS, notes: int = NOTES) -> dict[str, torch.Tensor]:
    """A union of ``agents`` agents of ``notes`` notes, ``DEGREE`` links out of every note (to
    notes of its own agent, CSR order), Sem / Proc / Situation kinds; every note has a record,
    ``HOT`` per agent were retrieved (counts 1-5 over spans of 0-90 s)."""
    gen = torch.Generator().manual_seed(0)
    n = agents * notes
    ptr = torch.arange(agents + 1, dtype=torch.int64) * notes
    src = torch.arange(n).repeat_interleave(DEGREE)
    agent_of = src // notes
    dst = agent_of * notes + torch.randint(0, notes, (src.numel(),), generator=gen)
    e = src.numel()
    rowptr = torch.arange(n + 1, dtype=torch.int64) * DEGREE
    kind = torch.randint(0, 3, (e,), generator=gen)
    edge_kind = torch.where(kind == 0, LINK_SEM, torch.where(kind == 1, LINK_PROC, 2))
    intensity = torch.rand(e, generator=gen, dtype=torch.float64)
    confidence = torch.where(edge_kind == LINK_SEM, torch.rand(e, generator=gen), 0.0)
    prob = torch.where(
        edge_kind == LINK_PROC, torch.rand(e, generator=gen, dtype=torch.float64), 0.0
    )
    count = torch.zeros(n, dtype=torch.int64)
    span = torch.zeros(n, dtype=torch.int64)
    hot = torch.stack([torch.randperm(notes, generator=gen)[:HOT] for _ in range(agents)])
    hot = (hot + ptr[:-1].unsqueeze(1)).reshape(-1)
    count[hot] = torch.randint(1, 6, (hot.numel(),), generator=gen)
    span[hot] = torch.randint(0, 91, (hot.numel(),), generator=gen)
    id_rank = torch.stack([torch.randperm(notes, generator=gen) for _ in range(agents)]).reshape(-1)
    return {
        "ptr": ptr, "rowptr": rowptr, "dst": dst, "edge_kind": edge_kind,
        "intensity": intensity, "confidence": confidence, "prob": prob,
        "count": count, "span": span, "id_rank": id_rank,
    }  # fmt: skip


def run_kernel(t: dict[str, torch.Tensor]):
    return plasticity_kernel(
        t["ptr"], t["rowptr"], t["dst"], t["edge_kind"], t["intensity"], t["confidence"],
        t["prob"], t["count"], t["span"], t["id_rank"], top_k=TOP_K,
    )  # fmt: skip


@functools.lru_cache(maxsize=1)
def bank_lists() -> dict[str, list]:
    return {k: v.tolist() for k, v in bank_tensors().items()}


def _f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def run_loop(t: dict[str, list]) -> dict[int, tuple[float, float, float]]:
    """The per-link Python loop: per agent, rank its records, then every out-link of a hot
    note whose target is hot."""
    ptr, rowptr, dst, kind = t["ptr"], t["rowptr"], t["dst"], t["edge_kind"]
    inten, conf, prob = t["intensity"], t["confidence"], t["prob"]
    count, span, id_rank = t["count"], t["span"], t["id_rank"]
    out: dict[int, tuple[float, float, float]] = {}
    for a in range(len(ptr) - 1):
        rows = []
        for u in range(ptr[a], ptr[a + 1]):
            f = count[u] / float(max(span[u], 1))
            rows.append((-f, -count[u], id_rank[u], u, f))
        rows.sort()
        hot = {u: f for _, _, _, u, f in rows[:TOP_K]}
        if len(hot) < 2:
            continue
        max_f = max(hot.values())
        if max_f <= EPSILON:
            continue
        for u, fu in hot.items():
            for e in range(rowptr[u], rowptr[u + 1]):
                v = dst[e]
                if v not in hot:
                    continue
                norm = min(max(min(fu, hot[v]) / max_f, 0.0), 1.0)
                d = plasticity_delta(norm)
                ni = min(max(inten[e] + d, LINK_VALUE_MIN), LINK_VALUE_MAX)
                nc, np_ = conf[e], prob[e]
                if kind[e] == LINK_SEM:
                    nc = _f32(min(max(conf[e] + d, LINK_VALUE_MIN), LINK_VALUE_MAX))
                elif kind[e] == LINK_PROC:
                    np_ = min(max(prob[e] + d, LINK_VALUE_MIN), LINK_VALUE_MAX)
                if ni != inten[e] or nc != conf[e] or np_ != prob[e]:
                    out[e] = (ni, nc, np_)
    return out


def test_kernel_equals_the_loop() -> None:
    plan = run_kernel(bank_tensors())
    got = {
        e: (i, c, p)
        for e, i, c, p in zip(
            plan.edges.tolist(), plan.intensity.tolist(), plan.confidence.tolist(),
            plan.prob.tolist(),
        )
    }  # fmt: skip
    expected = run_loop(bank_lists())
    assert got == expected and len(got) > AGENTS  # every agent changed some links


@pytest.mark.benchmark(group="plasticity-10k-agents")
@pytest.mark.parametrize("method", ["tensor-kernel", "python-loop"])
def test_bench_plasticity(benchmark, method: str) -> None:
    if method == "tensor-kernel":
        t = bank_tensors()
        out = benchmark.pedantic(lambda: run_kernel(t), rounds=10, iterations=1, warmup_rounds=2)
        changed = int(out.edges.numel())
    else:
        lists = bank_lists()
        out = benchmark.pedantic(lambda: run_loop(lists), rounds=2, iterations=1)
        changed = len(out)
    benchmark.extra_info["agents"] = AGENTS
    benchmark.extra_info["links_changed"] = changed


@pytest.mark.benchmark(group="plasticity-bank")
def test_bench_bank_update_plasticity(benchmark) -> None:
    """The whole ``MemoryBank.update_plasticity`` on 300 note-backed agents of the sample
    memory (77 notes each; a 32-wide offline embedder), every agent with new retrievals of the
    same 10 notes since its last update."""
    from soulmem_torch import HashingEmbedder, MemoryBank
    from soulmem_torch.data import sample_memory_path
    from soulmem_torch.embedding import embed_notes
    from soulmem_torch.model.soul_tune import load_soul_tune_graph

    notes = load_soul_tune_graph(sample_memory_path()).notes
    embedder = HashingEmbedder(dim=32)
    embeddings = embed_notes(notes, embedder)
    bank = MemoryBank(embedder=embedder)
    agents = [f"npc-{i}" for i in range(300)]
    for a in agents:
        copies = [n.model_copy(deep=True) for n in notes]
        bank.add_agent(a, copies, embeddings=embeddings)
    bank.union()
    asked = [n.id for n in notes[:10]]

    def setup():
        for a in agents:  # new retrievals for every agent: each round has work to do
            bank.agent(a).working_memory.record_retrieval(asked)
        return (), {}

    benchmark.pedantic(bank.update_plasticity, setup=setup, rounds=3, iterations=1)
    benchmark.extra_info["agents"] = len(agents)
