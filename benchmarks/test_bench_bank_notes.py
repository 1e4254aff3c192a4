"""MemoryBank on real structured notes: free-text questions from many agents in one ``bank.ask``
against a loop of per-agent ``SoulMem.ask`` (issue 17's measurement).

Run: ``pytest benchmarks/test_bench_bank_notes.py --benchmark-enable --benchmark-only -s``.

Agents: ``SOULMEM_BENCH_NOTE_AGENTS`` (default 200) agents, each a seeded random ~80% of the
bundled sample memory's structured notes (``soulmem_torch.data.sample_memory_path()``: concepts,
episodes with places, participants and events, abstractions, actions, typed links; the agents
share note ids, as copies of one memory would). One question per agent: the first words of one
of its episodes' narratives or concepts' descriptions (real text, not a vector). Embedder: the
offline ``HashingEmbedder``; config: ``ask``'s default (``DefaultPipelineConfig.for_questions()``).

Reported side by side in one run, 1 torch thread:

* ``cold``: after a two-agent warm-up of both paths (the process's imports, stemmer and jieba
  dictionary), a new bank (agents added, nothing asked) answering every question in one
  ``bank.ask``, against new ``SoulMem``s answering their question one after another (both
  include their snapshots, operators and text indexes); ``SOULMEM_BENCH_COLD_ROUNDS``
  (default 3) such pairs in turn, the median of each side;
* ``warm``: the same calls again (median of rounds), the loop too;
* the answers checked equal (ids in order, scores within 1e-6).
"""

from __future__ import annotations

import gc
import os
import random
import statistics
import time

import pytest

from benchmarks import _harness
from soulmem_torch import MemoryBank, SoulMem
from soulmem_torch.data import sample_memory_path
from soulmem_torch.embedding import HashingEmbedder
from soulmem_torch.model.soul_tune import load_soul_tune_graph

NUM_AGENTS = int(os.environ.get("SOULMEM_BENCH_NOTE_AGENTS", "200"))
COLD_ROUNDS = int(os.environ.get("SOULMEM_BENCH_COLD_ROUNDS", "3"))
SHARE = 0.8
WORDS = 8


def _agent_notes(num_agents: int, seed: int = 0) -> tuple[list[list], list[str]]:
    notes = load_soul_tune_graph(sample_memory_path()).notes
    rng = random.Random(seed)
    per_agent, questions = [], []
    for _ in range(num_agents):
        chosen = rng.sample(notes, round(SHARE * len(notes)))
        texts = [_text(n) for n in chosen]
        texts = [t for t in texts if t]
        per_agent.append(chosen)
        questions.append(" ".join(rng.choice(texts).split()[:WORDS]))
    return per_agent, questions


def _text(note) -> str:
    mt = note.mem_type
    for name in ("narrative", "description", "content"):
        value = getattr(mt, name, None)
        if isinstance(value, str) and value.strip():
            return value
    return ""


def _same(a, b, tol: float = 1e-6) -> bool:
    if [i for i, _ in a] != [i for i, _ in b]:
        return False
    return all(abs(x[1] - y[1]) <= tol * max(1.0, abs(y[1])) for x, y in zip(a, b))


def _bank(per_agent) -> MemoryBank:
    bank = MemoryBank(embedder=HashingEmbedder())
    bank.add_agents({f"npc-{a}": notes for a, notes in enumerate(per_agent)})
    return bank


def _memories(per_agent) -> list[SoulMem]:
    out = []
    for notes in per_agent:
        mem = SoulMem(embedder=HashingEmbedder())
        mem.add_notes(notes)
        out.append(mem)
    return out


def test_bank_of_structured_notes_vs_soulmem_loop(benchmark):
    benchmark.group = "bank-structured-notes"
    threads = _harness.set_threads()
    per_agent, questions = _agent_notes(NUM_AGENTS)
    agents = [f"npc-{a}" for a in range(NUM_AGENTS)]
    # the process's one-time costs (imports, the stemmer, jieba's dictionary) on two other agents
    warm, warm_questions = _agent_notes(2, seed=99)
    _bank(warm).ask(["npc-0", "npc-1"], warm_questions, record=False)
    for mem, q in zip(_memories(warm), warm_questions):
        mem.ask(q, record=False)

    # cold: a fresh bank, then fresh memories, COLD_ROUNDS times in turn (medians: one first
    # call is one sample of a shared machine's noise)
    bank_colds, loop_colds = [], []
    for _ in range(COLD_ROUNDS):
        bank = _bank(per_agent)
        gc.collect()
        t0 = time.perf_counter()
        cold_out = bank.ask(agents, questions, record=False)
        bank_colds.append(time.perf_counter() - t0)

        memories = _memories(per_agent)
        gc.collect()
        t1 = time.perf_counter()
        loop_cold_out = [m.ask(q, record=False)[0] for m, q in zip(memories, questions)]
        loop_colds.append(time.perf_counter() - t1)
    bank_cold, loop_cold = statistics.median(bank_colds), statistics.median(loop_colds)

    def run():
        return bank.ask(agents, questions, record=False)

    once, _ = _harness.time_call(run)
    rounds = _harness.rounds_for(once, 3.0)
    out = benchmark.pedantic(run, rounds=rounds, iterations=1, warmup_rounds=0)
    stats = getattr(benchmark, "stats", None)
    bank_warm = float(stats.stats.median) if stats is not None else once

    loops = []
    for _ in range(max(1, min(3, rounds))):
        t2 = time.perf_counter()
        loop_out = [m.ask(q, record=False)[0] for m, q in zip(memories, questions)]
        loops.append(time.perf_counter() - t2)
    loop_warm = sorted(loops)[len(loops) // 2]

    equal = sum(
        _same(x.association, y.association) and _same(x.action, y.action)
        for x, y in zip(out, loop_out)
    )
    equal_cold = sum(_same(x.association, y.association) for x, y in zip(cold_out, loop_cold_out))
    row = {
        "group": benchmark.group, "method": "bank.ask", "device": "cpu",
        "agents": NUM_AGENTS, "notes": sum(len(n) for n in per_agent), "questions": len(questions),
        "bank_cold_s": bank_cold, "loop_cold_s": loop_cold, "cold_ratio": loop_cold / bank_cold,
        "bank_warm_ms": bank_warm * 1e3, "loop_warm_ms": loop_warm * 1e3,
        "warm_ratio": loop_warm / bank_warm, "equal": equal, "equal_cold": equal_cold,
        "threads": threads, "rounds": rounds, "cold_rounds": COLD_ROUNDS,
    }  # fmt: skip
    benchmark.extra_info.update({k: v for k, v in row.items() if k != "group"})
    _harness.record(row)
    print(row)
    assert equal == NUM_AGENTS and equal_cold == NUM_AGENTS, "the bank and the loop disagree"


@pytest.fixture(autouse=True)
def _collect():
    yield
    gc.collect()
