"""The whole default pipeline (ShortOnly → Similarity → AssociateWithAction → merge), batched.

Run: ``pytest benchmarks/test_bench_pipeline.py --benchmark-enable --benchmark-only``.

Memory: a synthetic 1M-note graph (and a 100k one): 40% Semantic, 35% SpecificSituation, 20%
AbstractSituation and 5% Procedure notes; ~5 links per note drawn Chung–Lu style (Sem and
Situation links; a link into a Procedure note is a TrigToAction link with a random
probability); a 384-wide tag vector per note near a 64-dimensional subspace. Queries are plain
vectors (noisy copies of random notes' vectors), so the Similarity step finds 4 seeds above the
0.35 floor and every query runs association and BayesAction. ``ppr`` = the association method:
``push`` or ``power`` (what the default ``method="auto"`` picks for graphs of more than
4096 notes), with ``power_tol=1e-5``.

Reported: queries per second (``qps``) per batch size, and the mean number of seeds / merged
memories / actions per query (to show each query did the full work).
"""

from __future__ import annotations

import gc
import statistics
import time

import pytest
import torch

from benchmarks import _graphs, _harness
from soulmem_torch.graph import MemoryGraph
from soulmem_torch.retrieve import (
    AssociateWithActionConfig,
    AssociationConfig,
    DefaultPipelineConfig,
    RetrDefaultPipeline,
)
from soulmem_torch.retrieve.config import PprMethod
from soulmem_torch.retrieve.pipeline import DefaultPipelineRequest

SIZES = {"100k": 100_000, "1M": 1_000_000}
BATCHES = [1, 64, 256]
DIM = 384
RANK = 64

_CACHE: dict[tuple, object] = {}


def synthetic_memory(num_notes: int, *, device: torch.device | str = "cpu", seed: int = 0):
    """The synthetic memory graph described in the module docstring, on ``device``."""

    def tag_emb(gen: torch.Generator) -> torch.Tensor:  # low-rank + noise: clustered topics
        basis = torch.randn(RANK, DIM, generator=gen) / RANK**0.5
        tag = torch.empty(num_notes, DIM)
        for start in range(0, num_notes, 1 << 17):
            stop = min(num_notes, start + (1 << 17))
            rows = torch.randn(stop - start, RANK, generator=gen) @ basis
            rows += 0.3 * torch.randn(stop - start, DIM, generator=gen)
            tag[start:stop] = rows / rows.norm(dim=1, keepdim=True)
        return tag

    return _graphs.synthetic_memory_graph(num_notes, tag_emb, device=device, seed=seed)


def _memory(size: str, device: str) -> MemoryGraph:
    key = (size, device)
    if key not in _CACHE:
        for k in [k for k in _CACHE if k[1] == device]:
            del _CACHE[k]
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        _CACHE[key] = synthetic_memory(SIZES[size], device=device)
    return _CACHE[key]


def _queries(graph: MemoryGraph, batch: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(batch)
    rows = torch.randint(0, int(graph.num_nodes), (batch,), generator=gen)
    tag = graph.tag_emb[rows.to(graph.tag_emb.device)].cpu()
    q = tag + 0.5 * torch.randn(batch, DIM, generator=gen) / DIM**0.5
    return list(q.to(graph.tag_emb.device))


def _config(ppr: str) -> DefaultPipelineConfig:
    method = PprMethod.PUSH if ppr == "push" else PprMethod.POWER
    assoc = AssociationConfig(method=method, power_tol=1e-5)
    return DefaultPipelineConfig(assoc_with_action=AssociateWithActionConfig(association=assoc))


@pytest.mark.parametrize("batch", BATCHES, ids=[f"b{b}" for b in BATCHES])
@pytest.mark.parametrize("ppr", ["push", "power"])
@pytest.mark.parametrize("size", list(SIZES))
def test_default_pipeline(benchmark, bench_device, size, ppr, batch):
    """Queries per second of ``RetrDefaultPipeline.retrieve_batch`` on a synthetic memory."""
    if bench_device.type == "cpu" and size == "1M" and batch > 64:
        pytest.skip("1M notes x batch 256 needs ~15 GB of (N, B) float64 work tensors on CPU")
    benchmark.group = f"pipeline-{size}"
    threads = _harness.set_threads()
    dev = str(bench_device)
    graph = _memory(size, dev)
    config = _config(ppr)
    requests = [
        DefaultPipelineRequest(graph, q, config=config, device=bench_device)
        for q in _queries(graph, batch)
    ]
    pipeline = RetrDefaultPipeline()

    def run():
        out = pipeline.retrieve_batch(requests)
        _harness.sync(bench_device)
        return out

    first, _ = _harness.time_call(run, bench_device)  # warm-up: builds the cached operator
    rounds = _harness.rounds_for(first)
    out = benchmark.pedantic(run, rounds=rounds, iterations=1, warmup_rounds=0)
    mean = _harness.mean_seconds(benchmark, first)
    row = {
        "group": benchmark.group, "method": f"pipeline/{ppr}", "device": dev,
        "n": int(graph.num_nodes), "e": int(graph.edge_index.shape[1]), "batch": batch,
        "mean_ms": mean * 1e3, "us_per_query": mean * 1e6 / batch, "qps": batch / mean,
        "seeds": sum(len(r.seeds) for r in out) / batch,
        "merged": sum(len(r.association) for r in out) / batch,
        "actions": sum(len(r.action) for r in out) / batch,
        "threads": threads if bench_device.type == "cpu" else None, "rounds": rounds,
    }  # fmt: skip
    assert row["seeds"] > 0, "the synthetic queries should find seeds"
    benchmark.extra_info.update({k: v for k, v in row.items() if k != "group"})
    _harness.record(row)


# ---- SoulMem.ask on the bundled sample memory: the vectorized default vs the sequential push -----
ASK_BATCH = 256
ASK_MIN_ROUNDS = 15
_ASK: dict[str, object] = {}


def _sample_memory_and_texts() -> tuple[object, list[str]]:
    """The bundled sample memory and 256 questions (the sample suite's query strings, cycled)."""
    if not _ASK:
        from soulmem_torch.api import SoulMem
        from soulmem_torch.data import sample_memory_path, sample_queries_path
        from soulmem_torch.retrieve.evaluation import load_suite
        from soulmem_torch.retrieve.text import query_strings

        mem = SoulMem.from_graph_file(sample_memory_path())
        suite = load_suite(sample_queries_path())
        pool = [
            s
            for case in suite.test_cases
            for sq in case.sub_queries
            for s in query_strings(sq.query())
            if s.strip()
        ]
        _ASK["mem"] = mem
        _ASK["texts"] = [pool[i % len(pool)] for i in range(ASK_BATCH)]
    return _ASK["mem"], _ASK["texts"]  # type: ignore[return-value]


def _ask_config(ppr: str) -> DefaultPipelineConfig:
    config = DefaultPipelineConfig()
    if ppr == "sequential":
        assoc = AssociationConfig(method=PprMethod.SEQUENTIAL)
        config = config.model_copy(
            update={"assoc_with_action": AssociateWithActionConfig(association=assoc)}
        )
    return config


@pytest.mark.parametrize("ppr", ["default", "sequential"])
def test_ask_sample_memory(benchmark, ppr):
    """``SoulMem.ask`` at batch 256 on the sample memory: the default (rank fusion, batched
    power iteration) and the same call with ``method="sequential"`` (the original's push, one
    Python loop per query), side by side, 1 torch thread."""
    benchmark.group = "ask-sample-b256"
    torch.set_num_threads(1)
    mem, texts = _sample_memory_and_texts()
    config = _ask_config(ppr)

    def run():
        return mem.ask(texts, config=config)

    first, _ = _harness.time_call(run)  # warm-up: builds the cached operator and text index
    # at least ASK_MIN_ROUNDS: on a shared box a handful of rounds makes the mean a lottery
    rounds = max(ASK_MIN_ROUNDS, _harness.rounds_for(first))
    out = benchmark.pedantic(run, rounds=rounds, iterations=1, warmup_rounds=0)
    mean = _harness.mean_seconds(benchmark, first)
    stats = getattr(benchmark, "stats", None)
    median = float(stats.stats.median) if stats is not None else first
    row = {
        "group": benchmark.group, "method": f"ask/{ppr}", "device": "cpu",
        "n": len(mem), "batch": ASK_BATCH, "mean_ms": mean * 1e3, "median_ms": median * 1e3,
        "us_per_query": mean * 1e6 / ASK_BATCH, "qps": ASK_BATCH / mean,
        "merged": sum(len(r.association) for r in out) / ASK_BATCH,
        "threads": torch.get_num_threads(), "rounds": rounds,
    }  # fmt: skip
    assert row["merged"] > 0
    benchmark.extra_info.update({k: v for k, v in row.items() if k != "group"})
    _harness.record(row)


def test_ask_sample_memory_interleaved(benchmark):
    """The same two ``ask`` calls alternated round by round (default, sequential, default, …),
    so a neighbour's load lands on both: the ratio of their medians is the side-by-side figure.
    The benchmark's own time is one (default + sequential) pair."""
    benchmark.group = "ask-sample-b256-interleaved"
    torch.set_num_threads(1)
    mem, texts = _sample_memory_and_texts()
    configs = {ppr: _ask_config(ppr) for ppr in ("default", "sequential")}
    times: dict[str, list[float]] = {ppr: [] for ppr in configs}

    def run():
        for ppr, config in configs.items():
            start = time.perf_counter()
            mem.ask(texts, config=config)
            times[ppr].append(time.perf_counter() - start)

    first, _ = _harness.time_call(run)  # warm-up
    for t in times.values():
        t.clear()
    rounds = max(ASK_MIN_ROUNDS, _harness.rounds_for(first))
    benchmark.pedantic(run, rounds=rounds, iterations=1, warmup_rounds=0)
    median = {ppr: statistics.median(t) for ppr, t in times.items()}
    for ppr, t in times.items():
        row = {
            "group": benchmark.group, "method": f"ask/{ppr}", "device": "cpu",
            "n": len(mem), "batch": ASK_BATCH, "mean_ms": statistics.mean(t) * 1e3,
            "median_ms": median[ppr] * 1e3, "us_per_query": median[ppr] * 1e6 / ASK_BATCH,
            "qps": ASK_BATCH / median[ppr], "threads": torch.get_num_threads(),
            "rounds": rounds,
            "ratio_of_medians": median["sequential"] / median["default"],
        }  # fmt: skip
        _harness.record(row)
    benchmark.extra_info["ratio_of_medians"] = median["sequential"] / median["default"]
