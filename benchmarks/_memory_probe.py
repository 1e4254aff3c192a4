"""Peak memory of one ``retrieve_batch`` call, and resident memory per note of a bank, each
measured in a fresh process.

Run: ``python -m benchmarks._memory_probe --notes 100000 --batch 500 [--dim 32]
[--budget BYTES] [--strategy pipeline|association]``; prints one JSON line.
``python -m benchmarks._memory_probe --bank sample --agents 200`` (or ``--bank longmemeval
--agents 20 --data FILE``): the resident memory per note of a ``MemoryBank`` of structured
notes (``HashingEmbedder``, width 1024) after ``add_agent`` and after the first ``ask``
(:func:`bank_note_memory`).

``tracemalloc`` does not see torch's allocations, so the probe reads the kernel's own
high-water mark of the process's resident set (``VmHWM`` in ``/proc/self/status``), reset
just before the call by writing ``5`` to ``/proc/self/clear_refs`` (Linux). It builds a
synthetic memory (Chung–Lu links, ~5 per note, the pipeline benchmark's note kinds, one
``dim``-wide unit vector per note: plain single-vector mode), warms up with a batch of one
(builds the cached transition operator), then measures the batch of ``--batch`` plain-vector
queries. ``extra_bytes`` = peak RSS during the call − RSS before it: the memory the call
itself needs on top of the memory's tensors (``memory_bytes``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import time
from collections.abc import Sequence
from typing import Any

import torch

from benchmarks import _graphs
from soulmem_torch.graph import MemoryGraph

__all__ = [
    "bank_note_memory",
    "hwm_bytes",
    "reset_hwm",
    "rss_bytes",
    "sample_note_bank",
    "synthetic_plain_memory",
]


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        match = re.search(rf"^{key}:\s+(\d+) kB", f.read(), re.M)
    if match is None:  # pragma: no cover - not Linux
        raise RuntimeError(f"/proc/self/status has no {key}")
    return int(match.group(1)) * 1024


def rss_bytes() -> int:
    return _status("VmRSS")


def hwm_bytes() -> int:
    return _status("VmHWM")


def reset_hwm() -> None:
    """Resets the resident-set high-water mark to the current RSS."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def synthetic_plain_memory(num_notes: int, dim: int, *, seed: int = 0) -> MemoryGraph:

    def tag_emb(gen: torch.Generator) -> torch.Tensor:
        tag = torch.randn(num_notes, dim, generator=gen)
        return tag / tag.norm(dim=1, keepdim=True)

    return _graphs.synthetic_memory_graph(num_notes, tag_emb, seed=seed)


def _tensor_bytes(values: Any) -> int:
    """Bytes of every distinct tensor in ``values`` (nested in tuples / lists / objects)."""
    seen: set[int] = set()
    total = 0
    stack = list(values)
    while stack:
        value = stack.pop()
        if isinstance(value, torch.Tensor):
            if value.layout != torch.strided:
                stack.extend(
                    getattr(value, name)()
                    for name in ("crow_indices", "col_indices", "values")
                    if value.layout == torch.sparse_csr
                )
                continue
            if value.data_ptr() not in seen:
                seen.add(value.data_ptr())
                total += value.untyped_storage().nbytes()
        elif hasattr(value, "crow") and hasattr(value, "val"):  # a SparseRows table
            stack.extend([value.crow, value.col, value.val])
        elif isinstance(value, (tuple, list)):
            stack.extend(value)
        elif hasattr(value, "__dataclass_fields__"):
            stack.extend(getattr(value, f) for f in value.__dataclass_fields__)
    return total


def measure(
    notes: int, batch: int, dim: int, strategy: str, method: str, seed: int = 0
) -> dict[str, Any]:
    from soulmem_torch.retrieve import (
        AssociateWithActionConfig,
        AssociationConfig,
        DefaultPipelineConfig,
        RetrAssociation,
        RetrDefaultPipeline,
    )
    from soulmem_torch.retrieve.batches import batch_chunk_size, max_batch_bytes
    from soulmem_torch.retrieve.pipeline import DefaultPipelineRequest

    torch.set_num_threads(1)
    graph = synthetic_plain_memory(notes, dim, seed=seed)
    assoc = AssociationConfig(method=method, power_tol=1e-5)
    gen = torch.Generator().manual_seed(batch)
    rows = torch.randint(0, notes, (batch,), generator=gen)
    if strategy == "pipeline":
        config = DefaultPipelineConfig(
            assoc_with_action=AssociateWithActionConfig(association=assoc)
        )
        q = graph.tag_emb[rows] + 0.3 * torch.randn(batch, dim, generator=gen) / dim**0.5
        requests = [DefaultPipelineRequest(graph, v, config=config) for v in q]
        runner: Any = RetrDefaultPipeline()
    else:
        requests = [assoc.into_request(graph, [(graph.ids[int(r)], 0.9)]) for r in rows]
        runner = RetrAssociation()
    runner.retrieve_batch(requests[:1])  # warm-up: cached weights / operator
    gc.collect()
    before = rss_bytes()
    reset_hwm()
    start = time.perf_counter()
    out = runner.retrieve_batch(requests)
    seconds = time.perf_counter() - start
    peak = hwm_bytes()
    found = sum(len(getattr(r, "association", r)) for r in out) / batch
    return {
        "strategy": strategy,
        "method": method,
        "notes": notes,
        "edges": int(graph.edge_index.shape[1]),
        "dim": dim,
        "batch": batch,
        "budget_bytes": max_batch_bytes(),
        "chunk": batch_chunk_size(notes, batch),
        "memory_bytes": _tensor_bytes(value for _, value in graph),
        "cache_bytes": _tensor_bytes(graph.cache.values()),
        "rss_before": before,
        "peak_rss": peak,
        "extra_bytes": peak - before,
        "extra_per_query": (peak - before) / batch,
        "seconds": seconds,
        "found_per_query": found,
    }


def _trimmed_rss() -> int:
    """RSS after a garbage collection and ``malloc_trim`` (freed heap pages given back), so
    that what is counted is what the process holds."""
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        pass
    return rss_bytes()


def sample_note_bank(num_agents: int, *, seed: int = 0) -> list[tuple[str, list[Any]]]:
    """``num_agents`` agents of 50–75 notes each drawn from the bundled sample memory (77
    structured notes, deep copies: each agent's notes are its own)."""
    import random

    from soulmem_torch.data import sample_memory_path
    from soulmem_torch.model.soul_tune import load_soul_tune_graph

    notes = load_soul_tune_graph(sample_memory_path()).notes
    rng = random.Random(seed)
    return [
        (f"npc-{a}", [n.model_copy(deep=True) for n in rng.sample(notes, rng.randint(50, 75))])
        for a in range(num_agents)
    ]


def longmemeval_note_bank(
    path: str, num_agents: int
) -> tuple[list[tuple[str, list[Any]]], list[str]]:
    """The turn-level notes of the first ``num_agents`` LongMemEval haystacks (user turns, as
    ``soulmem eval --format longmemeval --level turn``) and their questions."""
    from soulmem_torch.chat import read_longmemeval, sessions_to_notes

    questions = read_longmemeval(path)[:num_agents]
    agents = [
        (f"haystack-{i}", sessions_to_notes(q.sessions, level="turn", roles=("user",)).notes)
        for i, q in enumerate(questions)
    ]
    return agents, [q.question for q in questions]


def _live_bytes(bank: Any) -> dict[str, int]:
    """Bytes of the distinct tensor memory the bank holds: the notes' vectors (shared with
    the snapshots' compact tables), the snapshots' other tensors and caches, the union and
    its caches."""
    seen: set[int] = set()

    def count(values: Any) -> int:
        total = 0
        stack = [values]
        while stack:
            value = stack.pop()
            if isinstance(value, torch.Tensor):
                if value.layout == torch.sparse_csr:
                    stack.extend([value.crow_indices(), value.col_indices(), value.values()])
                    continue
                if value.layout != torch.strided:
                    continue
                storage = value.untyped_storage()
                if storage.data_ptr() not in seen:
                    seen.add(storage.data_ptr())
                    total += storage.nbytes()
            elif hasattr(value, "crow") and hasattr(value, "val"):  # a SparseRows table
                stack.extend([value.crow, value.col, value.val])
            elif isinstance(value, (tuple, list)):
                stack.extend(value)
            elif isinstance(value, dict):
                stack.extend(value.values())
            elif hasattr(value, "__dataclass_fields__"):
                stack.extend(getattr(value, f) for f in value.__dataclass_fields__ if f != "graphs")
        return total

    from soulmem_torch.embedding.compact import compact_ref

    agents = bank.agents()
    mems = [bank.agent(a) for a in agents]
    held: list[Any] = []
    tables: dict[int, Any] = {}
    for m in mems:
        for e in m.cluster:
            if e.embedding is None:
                continue
            ref = compact_ref(e.embedding)
            if ref is not None:  # compact: the table, not the dense copies a read makes
                tables.setdefault(id(ref.table), ref.table)
            else:
                held.append([e.embedding.tag, list(e.embedding.fields.values())])
    held.extend([t.tag, t.rows, t.pos] for t in tables.values())
    vectors = count(held)
    graphs = [bank.graph(a) for a in agents]
    snapshots = count(
        [[v for _, v in g] + list((g.__dict__.get("_raw") or {}).values()) for g in graphs]
    )
    snapshot_caches = count([list(bank.graph(a).cache.values()) for a in agents])
    union = bank.union()
    return {
        "vectors": vectors,
        "snapshots": snapshots,
        "snapshot_caches": snapshot_caches,
        "union": count(union),
        "union_caches": count(list(union.cache.values())),
    }


def bank_note_memory(
    agents: Sequence[tuple[str, list[Any]]], questions: Sequence[str], *, dim: int = 1024
) -> dict[str, Any]:
    """Resident memory per note of a ``MemoryBank`` of ``agents`` (one ``HashingEmbedder`` of
    width ``dim``): RSS (after ``gc`` and ``malloc_trim``) before the bank, after every
    ``add_agent``, and after the first ``ask`` (one question per agent; a tiny bank answers
    one question first, so that imports and one-off set-up are not counted), plus the live
    tensor bytes by owner."""
    from soulmem_torch import HashingEmbedder, MemoryBank

    torch.set_num_threads(1)
    embedder = HashingEmbedder(dim=dim)
    warm = MemoryBank(embedder=embedder)
    warm.add_agent("warm", [n.model_copy(deep=True) for n in agents[0][1][:20]])
    warm.ask(["warm"], [questions[0]])
    del warm
    before = _trimmed_rss()
    bank = MemoryBank(embedder=embedder)
    for agent_id, notes in agents:
        bank.add_agent(agent_id, notes)
    num_notes = sum(len(bank.agent(a)) for a, _ in agents)
    added = _trimmed_rss()
    reset_hwm()
    start = time.perf_counter()
    bank.ask([a for a, _ in agents], list(questions))
    first_ask_s = time.perf_counter() - start
    peak = hwm_bytes()
    asked = _trimmed_rss()
    live = _live_bytes(bank)
    kib = 1024 * num_notes
    return {
        "agents": len(agents),
        "notes": num_notes,
        "dim": dim,
        "kib_per_note_add": (added - before) / kib,
        "kib_per_note_ask": (asked - before) / kib,
        "peak_kib_per_note_ask": (peak - before) / kib,
        "first_ask_s": first_ask_s,
        **{f"live_kib_per_note_{k}": v / kib for k, v in live.items()},
        "live_kib_per_note": sum(live.values()) / kib,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bank", choices=["sample", "longmemeval"], default=None)
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--data", default=None, help="the LongMemEval file (--bank longmemeval)")
    parser.add_argument("--notes", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--strategy", choices=["pipeline", "association"], default="pipeline")
    parser.add_argument("--method", default="power")
    parser.add_argument("--budget", type=int, default=None, help="SOULMEM_MAX_BATCH_BYTES")
    args = parser.parse_args()
    if args.bank == "sample":
        agents = sample_note_bank(args.agents)
        texts = ["a rainy afternoon at the café", "谁教我做桂花糕？", "who lent me an umbrella"]
        questions = [texts[i % len(texts)] for i in range(len(agents))]
        print(json.dumps({"bank": "sample", **bank_note_memory(agents, questions)}))
        return
    if args.bank == "longmemeval":
        agents, questions = longmemeval_note_bank(args.data, args.agents)
        print(json.dumps({"bank": "longmemeval", **bank_note_memory(agents, questions)}))
        return
    if args.budget is not None:
        os.environ["SOULMEM_MAX_BATCH_BYTES"] = str(args.budget)
    print(json.dumps(measure(args.notes, args.batch, args.dim, args.strategy, args.method)))


if __name__ == "__main__":
    main()
