"""Ten thousand agents of structured notes, a thousand of them asked in one ``bank.ask``
(issue 17's second figure), against a loop of per-agent ``SoulMem.ask`` over the asked agents.

Run: ``pytest benchmarks/test_bench_bank_many.py --benchmark-enable --benchmark-only -s``.

Scale (env): ``SOULMEM_BENCH_MANY_AGENTS`` agents (default 10,000) of
``SOULMEM_BENCH_MANY_NOTES`` structured notes each (default 100), ``SOULMEM_BENCH_MANY_ASKED``
of them asked one question each (default 1,000; every ``agents / asked``-th agent). The issue's
scale is the default; 1M structured notes need a machine with room for them (on the shared
24 GiB box run it at ``SOULMEM_BENCH_MANY_AGENTS=1000``: the ratios are per asked agent).

Notes: each agent holds every note of the bundled sample memory
(``soulmem_torch.data.sample_memory_path()``: concepts, episodes with places, participants and
events, abstractions, actions, typed links) and, up to ``NOTES``, copies of a seeded random
choice of them under their own ids (a copy's links point where the note's do, with their own
link ids), in a seeded order per agent. Questions: the first words of one of the agent's
episodes' narratives or concepts' descriptions (real text). Embedder: the offline
``HashingEmbedder``; config: ``ask``'s default.

Reported side by side in one run, 1 torch thread: the bank's first ``ask`` of the asked agents
(``cold``: their snapshots, operators and text indexes built in the call), the same call again
(``warm``, median of rounds), and a loop of ``SoulMem.ask`` over the asked agents' own memories
(warm: each asked once before; the loop's cold call is the same work as the bank's one agent at
a time). The answers are checked equal (ids in order, scores within 1e-6).
"""

from __future__ import annotations

import gc
import os
import random
import time
import uuid

import pytest

from benchmarks import _harness
from soulmem_torch import MemoryBank, SoulMem
from soulmem_torch.data import sample_memory_path
from soulmem_torch.embedding import HashingEmbedder
from soulmem_torch.model import LinkId, MemoryId, MemoryNote
from soulmem_torch.model.soul_tune import load_soul_tune_graph

NUM_AGENTS = int(os.environ.get("SOULMEM_BENCH_MANY_AGENTS", "10000"))
NOTES = int(os.environ.get("SOULMEM_BENCH_MANY_NOTES", "100"))
ASKED = int(os.environ.get("SOULMEM_BENCH_MANY_ASKED", "1000"))
WORDS = 8
_NAMESPACE = uuid.UUID("6f1c2f44-3a53-4d0e-9a57-0c1d2e3f4a5b")


def _copy(note: MemoryNote, k: int) -> MemoryNote:
    """Copy ``k`` of ``note`` under its own (deterministic) id and link ids."""
    nid = MemoryId(uuid.uuid5(_NAMESPACE, f"{note.id}/{k}"))
    links = [
        link.model_copy(
            update={"id": LinkId(uuid.uuid5(_NAMESPACE, f"{link.id}/{k}")), "from_": nid}
        )
        for link in note.mem_links
    ]
    return note.model_copy(update={"id": nid, "mem_links": links})


def _text(note: MemoryNote) -> str:
    mt = note.mem_type
    for name in ("narrative", "description", "content"):
        value = getattr(mt, name, None)
        if isinstance(value, str) and value.strip():
            return value
    return ""


def agent_notes(
    num_agents: int, notes: int, seed: int = 0
) -> tuple[list[list[MemoryNote]], list[str]]:
    """Each agent's notes (the sample memory, topped up with copies to ``notes``) and one
    question per agent."""
    base = load_soul_tune_graph(sample_memory_path()).notes
    extra = max(0, notes - len(base))
    copies: dict[tuple[int, int], MemoryNote] = {}
    rng = random.Random(seed)
    per_agent, questions = [], []
    for _ in range(num_agents):
        chosen = list(base[:notes])
        for k, i in enumerate(rng.choices(range(len(base)), k=extra), start=1):
            key = (i, k)
            if key not in copies:
                copies[key] = _copy(base[i], k)
            chosen.append(copies[key])
        rng.shuffle(chosen)
        texts = [t for t in map(_text, chosen) if t]
        per_agent.append(chosen)
        questions.append(" ".join(rng.choice(texts).split()[:WORDS]))
    return per_agent, questions


def _same(a, b, tol: float = 1e-6) -> bool:
    if [i for i, _ in a] != [i for i, _ in b]:
        return False
    return all(abs(x[1] - y[1]) <= tol * max(1.0, abs(y[1])) for x, y in zip(a, b))


def test_ten_thousand_agents_thousand_asked(benchmark):
    benchmark.group = "bank-many-structured-agents"
    threads = _harness.set_threads()
    asked_every = max(1, NUM_AGENTS // max(1, ASKED))
    per_agent, questions = agent_notes(NUM_AGENTS, NOTES)
    asked = list(range(0, NUM_AGENTS, asked_every))[:ASKED]
    names = [f"npc-{a}" for a in asked]
    texts = [questions[a] for a in asked]
    # the process's one-time costs (imports, the stemmer, jieba's dictionary) on other agents
    warm_notes, warm_questions = agent_notes(2, NOTES, seed=99)
    warm_bank = MemoryBank(embedder=HashingEmbedder())
    warm_bank.add_agents({f"w{a}": notes for a, notes in enumerate(warm_notes)})
    warm_bank.ask(["w0", "w1"], warm_questions, record=False)

    t0 = time.perf_counter()
    bank = MemoryBank(embedder=HashingEmbedder())
    bank.add_agents({f"npc-{a}": notes for a, notes in enumerate(per_agent)})
    build_s = time.perf_counter() - t0
    gc.collect()
    t1 = time.perf_counter()
    cold_out = bank.ask(names, texts, record=False)
    bank_cold = time.perf_counter() - t1

    def run():
        return bank.ask(names, texts, record=False)

    once, _ = _harness.time_call(run)
    rounds = _harness.rounds_for(once, 3.0)
    out = benchmark.pedantic(run, rounds=rounds, iterations=1, warmup_rounds=0)
    stats = getattr(benchmark, "stats", None)
    bank_warm = float(stats.stats.median) if stats is not None else once

    memories = []
    for a in asked:
        mem = SoulMem(embedder=HashingEmbedder())
        mem.add_notes(per_agent[a])
        memories.append(mem)
    t2 = time.perf_counter()
    loop_cold_out = [m.ask(q, record=False)[0] for m, q in zip(memories, texts)]
    loop_cold = time.perf_counter() - t2
    loops = []
    for _ in range(max(1, min(3, rounds))):
        t3 = time.perf_counter()
        loop_out = [m.ask(q, record=False)[0] for m, q in zip(memories, texts)]
        loops.append(time.perf_counter() - t3)
    loop_warm = sorted(loops)[len(loops) // 2]

    equal = sum(
        _same(x.association, y.association) and _same(x.action, y.action)
        for x, y in zip(out, loop_out)
    )
    equal_cold = sum(_same(x.association, y.association) for x, y in zip(cold_out, loop_cold_out))
    row = {
        "group": benchmark.group, "method": "bank.ask", "device": "cpu",
        "agents": NUM_AGENTS, "notes": sum(len(n) for n in per_agent), "asked": len(names),
        "build_s": build_s, "bank_cold_s": bank_cold, "bank_warm_ms": bank_warm * 1e3,
        "cold_over_warm": bank_cold / bank_warm, "loop_cold_s": loop_cold,
        "loop_warm_ms": loop_warm * 1e3, "warm_ratio": loop_warm / bank_warm,
        "cold_ratio": loop_cold / bank_cold, "equal": equal, "equal_cold": equal_cold,
        "threads": threads, "rounds": rounds,
    }  # fmt: skip
    benchmark.extra_info.update({k: v for k, v in row.items() if k != "group"})
    _harness.record(row)
    print(row)
    assert equal == len(names) and equal_cold == len(names), "the bank and the loop disagree"


@pytest.fixture(autouse=True)
def _collect():
    yield
    gc.collect()
