"""Batch memory: a large batch runs in chunks from a memory budget, with identical results.

Before issue 11 a ``retrieve_batch`` call held about 13 float64 ``(N, B)`` matrices at once
(1,000 queries on 200k notes peaked above 19 GB); now every strategy runs in chunks of
``batch_chunk_size(N, B)`` requests (env ``SOULMEM_MAX_BATCH_BYTES``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from soulmem_torch import SoulMem
from soulmem_torch.data import sample_memory_path
from soulmem_torch.errors import ValidationError
from soulmem_torch.graph import MemoryGraph
from soulmem_torch.retrieve import (
    AssociateWithActionConfig,
    AssociationConfig,
    DefaultPipelineConfig,
    RetrAssociateWithAction,
    RetrAssociation,
    RetrDefaultPipeline,
    RetrSimilarity,
    SimilarityConfig,
    batches,
)
from soulmem_torch.retrieve.batches import (
    BATCH_BYTES_PER_NOTE,
    DEFAULT_MAX_BATCH_BYTES,
    batch_chunk_size,
    max_batch_bytes,
)
from soulmem_torch.retrieve.pipeline import DefaultPipelineRequest

ROOT = Path(__file__).resolve().parents[2]
ENV = "SOULMEM_MAX_BATCH_BYTES"


# ---- the budget ------------------------------------------------------------------------------
def test_budget_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert max_batch_bytes() == DEFAULT_MAX_BATCH_BYTES == 512 * 2**20
    monkeypatch.setenv(ENV, "1_000_000")
    assert max_batch_bytes() == 1_000_000
    for bad in ["-5", "0", "lots", "1.5"]:
        monkeypatch.setenv(ENV, bad)
        with pytest.raises(ValidationError, match=ENV):
            max_batch_bytes()


def test_chunk_size() -> None:
    per_query = 1000 * BATCH_BYTES_PER_NOTE
    assert batch_chunk_size(1000, 500, budget=10 * per_query) == 10
    assert batch_chunk_size(1000, 5, budget=10 * per_query) == 5  # never above the batch
    assert batch_chunk_size(1000, 500, budget=1) == 1  # never below one
    assert batch_chunk_size(0, 7, budget=1) == 1
    # 100k notes, default budget: a chunk of 500 queries is cut to a few dozen
    assert 8 <= batch_chunk_size(100_000, 500, budget=DEFAULT_MAX_BATCH_BYTES) <= 64


def test_run_grouped_runs_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    graph = _graph(50)
    monkeypatch.setenv(ENV, str(3 * 50 * BATCH_BYTES_PER_NOTE))
    sizes: list[int] = []

    def run(group: list[Any]) -> list[int]:
        sizes.append(len(group))
        return [r for r, _ in group]

    requests = [(i, graph) for i in range(10)]
    assert batches.run_grouped(requests, key=lambda rg: 0, run=run) == list(range(10))
    assert sizes == [3, 3, 3, 1]


# ---- identical results for any chunk size ----------------------------------------------------
def _graph(n: int, seed: int = 0, dim: int = 8) -> MemoryGraph:
    from benchmarks._memory_probe import synthetic_plain_memory

    return synthetic_plain_memory(n, dim, seed=seed)


def _plain_queries(graph: MemoryGraph, batch: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(batch)
    rows = torch.randint(0, int(graph.num_nodes), (batch,), generator=gen)
    dim = graph.tag_emb.shape[1]
    return list(graph.tag_emb[rows] + 0.3 * torch.randn(batch, dim, generator=gen) / dim**0.5)


def _with_budget(monkeypatch: pytest.MonkeyPatch, budget: int | None, fn: Any) -> Any:
    if budget is None:
        monkeypatch.setenv(ENV, str(2**62))  # one chunk: the unchunked path
    else:
        monkeypatch.setenv(ENV, str(budget))
    return fn()


def _same_lists(a: list[Any], b: list[Any]) -> bool:
    """Same ids in the same order; scores equal up to float32 rounding of the similarity."""
    return [i for i, _ in a] == [i for i, _ in b] and all(
        abs(x - y) <= 1e-6 * max(abs(x), 1e-3) for (_, x), (_, y) in zip(a, b)
    )


def _same_pipeline(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(
        _same_lists(x.seeds, y.seeds)
        and _same_lists(x.association, y.association)
        and _same_lists(x.action, y.action)
        for x, y in zip(a, b)
    )


@pytest.mark.parametrize("method", ["power", "push", "sequential"])
def test_pipeline_identical_for_any_chunk_size(
    monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    """Same notes in the same order for any chunk size; the scores agree to the last float32
    bit of the similarity stage (a BLAS matmul picks its blocking by the batch's shape, so a
    plain-cosine score may move by one ulp between batch sizes — with or without chunking)."""
    graph = _graph(600)
    assoc = AssociationConfig(method=method, power_tol=1e-6)
    config = DefaultPipelineConfig(assoc_with_action=AssociateWithActionConfig(association=assoc))
    requests = [DefaultPipelineRequest(graph, q, config=config) for q in _plain_queries(graph, 24)]
    pipeline = RetrDefaultPipeline()
    whole = _with_budget(monkeypatch, None, lambda: pipeline.retrieve_batch(requests))
    per_note = 600 * BATCH_BYTES_PER_NOTE
    for chunk in (1, 5):  # many chunks; a last partial one
        chunked = _with_budget(
            monkeypatch, chunk * per_note, lambda: pipeline.retrieve_batch(requests)
        )
        assert _same_pipeline(chunked, whole)
    one_by_one = [pipeline.retrieve(r) for r in requests]  # B = 1 each
    assert _same_pipeline(one_by_one, whole)
    assert sum(len(r.association) for r in whole) > 0 and sum(len(r.action) for r in whole) > 0


def test_association_identical_for_any_chunk_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """From given sources, chunking changes no note and no order; the push changes no bit."""
    graph = _graph(400, seed=1)
    ids = graph.ids
    sources = [[(ids[i], 0.9), (ids[(7 * i + 3) % 400], 0.4)] for i in range(17)]
    for method in ("power", "push"):
        assoc = AssociationConfig(method=method, power_tol=1e-6)
        calls = {
            "association": lambda a=assoc: [
                (r,)
                for r in RetrAssociation().retrieve_batch(
                    [a.into_request(graph, s) for s in sources]
                )
            ],
            "assoc_with_action": lambda a=assoc: [
                (r.memory, r.action)
                for r in RetrAssociateWithAction().retrieve_batch(
                    [AssociateWithActionConfig(association=a).into_request(graph, s)
                     for s in sources]
                )
            ],
        }  # fmt: skip
        for name, call in calls.items():
            whole = _with_budget(monkeypatch, None, call)
            for chunk in (1, 2, 5):
                chunked = _with_budget(monkeypatch, 400 * BATCH_BYTES_PER_NOTE * chunk, call)
                if (method, name) == ("push", "association"):  # bit for bit
                    assert chunked == whole, (method, name, chunk)
                else:  # vectorized kernels (sparse product, softmax) pick SIMD lanes by B
                    flat = zip([x for pair in chunked for x in pair], [x for p in whole for x in p])
                    assert all(_same_lists(a, b) for a, b in flat), (method, name, chunk)
            assert any(len(x) for pair in whole for x in pair), name


def test_similarity_same_notes_for_any_chunk_size(monkeypatch: pytest.MonkeyPatch) -> None:
    graph = _graph(400, seed=1)
    queries = _plain_queries(graph, 17)

    def call() -> Any:
        return RetrSimilarity().retrieve_batch(
            [SimilarityConfig().into_request(graph, q) for q in queries]
        )

    whole = _with_budget(monkeypatch, None, call)
    chunked = _with_budget(monkeypatch, 400 * BATCH_BYTES_PER_NOTE * 2, call)
    assert all(_same_lists(a, b) for a, b in zip(chunked, whole)) and any(whole)


def test_structured_queries_on_the_sample_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    mem = SoulMem.from_graph_file(sample_memory_path())
    texts = ["a rainy afternoon at the café", "谁教我做桂花糕？", "research notes", "tea"]
    whole = _with_budget(monkeypatch, None, lambda: mem.ask(texts))
    chunked = _with_budget(monkeypatch, 1, lambda: mem.ask(texts))  # chunks of one
    assert len(chunked) == len(whole)
    for a, b in zip(chunked, whole):
        assert _same_lists(a.association, b.association) and _same_lists(a.action, b.action)


# ---- peak memory -----------------------------------------------------------------------------
def _probe(*args: str, budget: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks._memory_probe", *args, "--budget", str(budget)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_peak_memory_stays_within_the_budget() -> None:
    """256 association queries on 20k notes with a 16 MiB budget: the call's extra resident
    memory stays far below the ~0.7 GB the unchunked batch needs (256 x 20k x ~130 bytes)."""
    budget = 16 * 2**20
    row = _probe(
        "--notes", "20000", "--batch", "256", "--dim", "8", "--strategy", "association",
        budget=budget,
    )  # fmt: skip
    assert row["chunk"] == batch_chunk_size(20_000, 256, budget=budget) < 256
    assert row["found_per_query"] > 0
    assert row["extra_bytes"] < 4 * budget + 32 * 2**20, row
