"""Similarity top-k: plain cosine banks against faiss, and the fused structured score on congyu.

Run: ``pytest benchmarks/test_bench_similarity.py --benchmark-enable --benchmark-only``.

Banks: 100k x 384 and 1M x 768, float32 and bfloat16, batch 1 / 64 / 1024, top-10. The vectors
lie near a 64-dimensional subspace (plus isotropic noise), as sentence embeddings do, so the
scores have a realistic spread; each query is a noisy copy of a random bank row.

Methods:

============= ==================================================================================
matmul-topk   ``q_unit @ bank_unit.T`` in the bank's dtype + ``torch.topk``: the kernel under
              ``MemoryRetriever.forward``, on a bank normalized once
retriever     ``soulmem_torch.nn.MemoryRetriever(...)(query)`` (float32 buffers)
cosine-topk   ``functional.similarity.cosine_scores`` + ``functional.similarity.topk`` (the
              functional API: renormalizes the bank and stable-sorts every score per call)
faiss         ``faiss.IndexFlatIP.search`` on the same unit vectors (float32, CPU), defaults
              (faiss 1.15 scans the bank once per query below ``distance_compute_blas_threshold``
              = 128000 queries)
faiss-blas    the same with ``distance_compute_blas_threshold = 16`` (blocked sgemm for any
              batch above 16: the peer's best setting for batches here)
bank-read     ``bank.view(int16).amax()``: a reduction that reads every byte of the bank once,
              the target's yardstick (a bfloat16 ``sum`` is 20x slower on CPU than the read)
============= ==================================================================================

``overlap`` is the top-10 overlap with the float64 exact top-10 (first 16 queries); ``ratio`` is
time / bank-read.
"""

from __future__ import annotations

import functools
import gc
import time

import pytest
import torch

from benchmarks import _harness, _peers
from soulmem_torch.functional.similarity import cosine_scores, topk

BANKS = {"100k-384": (100_000, 384), "1M-768": (1_000_000, 768)}
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
BATCHES = [1, 64, 1024]
METHODS = ["matmul-topk", "retriever", "cosine-topk", "faiss", "faiss-blas", "bank-read"]
K = 10
RANK = 64


# ------------------------------------------------------------------------------------------
# data (built outside the timed calls; one bank per device kept at a time)
# ------------------------------------------------------------------------------------------
_CACHE: dict[tuple, object] = {}
_FAISS_DEFAULTS: dict[str, int] = {}


def _cached(kind: str, name: str, device: str, *extra, build):
    """Memoize ``build()``; a new bank name on a device evicts that device's old data."""
    key = (kind, name, device, *extra)
    if key not in _CACHE:
        stale = [k for k in _CACHE if k[2] == device and k[1] != name]
        if stale:
            for k in stale:
                del _CACHE[k]
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        _CACHE[key] = build()
    return _CACHE[key]


def _bank(name: str, device: str) -> torch.Tensor:
    """Unit rows (N, D) float32 on ``device``: low-rank structure plus noise, seeded."""

    def build() -> torch.Tensor:
        n, dim = BANKS[name]
        gen = torch.Generator(device=device).manual_seed(0)
        basis = torch.randn(RANK, dim, generator=gen, device=device) / RANK**0.5
        out = torch.empty(n, dim, device=device)
        for start in range(0, n, 1 << 17):
            stop = min(n, start + (1 << 17))
            z = torch.randn(stop - start, RANK, generator=gen, device=device)
            noise = torch.randn(stop - start, dim, generator=gen, device=device)
            rows = z @ basis + 0.3 * noise
            out[start:stop] = rows / rows.norm(dim=1, keepdim=True)
        return out

    return _cached("bank", name, device, build=build)


def _bank_dtype(name: str, device: str, dtype: str) -> torch.Tensor:
    bank = _bank(name, device)
    if dtype == "f32":
        return bank
    return _cached("bank-dtype", name, device, dtype, build=lambda: bank.to(DTYPES[dtype]))


def _queries(name: str, device: str, batch: int) -> torch.Tensor:
    """(B, D) float32 unit queries: noisy copies of random bank rows."""
    bank = _bank(name, device)

    def build() -> torch.Tensor:
        gen = torch.Generator(device=device).manual_seed(batch)
        rows = torch.randint(0, bank.shape[0], (batch,), generator=gen, device=device)
        noise = torch.randn(batch, bank.shape[1], generator=gen, device=device)
        q = bank[rows] + 0.8 * noise / bank.shape[1] ** 0.5
        return q / q.norm(dim=1, keepdim=True)

    return _cached("queries", name, device, batch, build=build)


def _exact(name: str, device: str, batch: int) -> torch.Tensor:
    """Float64 exact top-K indices of the first 16 queries, (min(B, 16), K), CPU."""
    bank = _bank(name, device)
    q = _queries(name, device, batch)[:16].to(torch.float64)

    def build() -> torch.Tensor:
        best_v = torch.full((q.shape[0], K), -torch.inf, dtype=torch.float64, device=device)
        best_i = torch.zeros(q.shape[0], K, dtype=torch.int64, device=device)
        for start in range(0, bank.shape[0], 1 << 17):
            chunk = bank[start : start + (1 << 17)].to(torch.float64)
            v, i = torch.topk(q @ chunk.T, min(K, chunk.shape[0]), dim=1)
            best_v, pos = torch.topk(torch.cat([best_v, v], 1), K, dim=1)
            best_i = torch.gather(torch.cat([best_i, i + start], 1), 1, pos)
        return best_i.cpu()

    return _cached("exact", name, device, batch, build=build)


def _retriever(name: str, device: str):
    from soulmem_torch.graph import MemoryGraph
    from soulmem_torch.nn import MemoryRetriever

    bank = _bank(name, device)

    def build():
        n = bank.shape[0]
        graph = MemoryGraph.from_tensors(
            torch.zeros(2, 0, dtype=torch.int64), num_nodes=n,
            edge_kind=torch.zeros(0, dtype=torch.int64),
            node_type=torch.zeros(n, dtype=torch.int64),
        )  # fmt: skip
        return MemoryRetriever(graph, note_embeddings=bank, k=K).to(device)

    return _cached("retriever", name, device, build=build)


def _faiss(name: str):
    bank = _bank(name, "cpu")
    return _cached("faiss", name, "cpu", build=lambda: _peers.faiss_topk(bank.numpy(), K))


def _overlap(indices: torch.Tensor, exact: torch.Tensor) -> float:
    got = indices[: exact.shape[0]].cpu()
    hits = [len(set(a.tolist()) & set(b.tolist())) for a, b in zip(got, exact)]
    return sum(hits) / (K * exact.shape[0])


def _read(bank: torch.Tensor) -> torch.Tensor:
    return bank.view(torch.int16).amax()


def _read_time(bank: torch.Tensor, device: torch.device) -> float:
    """Best of 6 synchronized ``bank.view(int16).amax()``: the time to read the bank once."""
    best = float("inf")
    for _ in range(6):
        _harness.sync(device)
        t0 = time.perf_counter()
        _read(bank)
        _harness.sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def _skip_reason(bank: str, dtype: str, method: str, batch: int, device: torch.device):
    cpu = device.type == "cpu"
    if method.startswith("faiss"):
        if not cpu:
            return "faiss-cpu: the peer runs on the CPU"
        if not _peers.available("faiss"):
            return "peer 'faiss' is not installed (faiss-cpu missing)"
    if method in ("retriever", "cosine-topk", "faiss", "faiss-blas") and dtype != "f32":
        return f"{method} is float32 only"
    if method == "bank-read" and batch != 1:
        return "bank-read does not depend on the batch (see b1)"
    if cpu and bank == "1M-768":
        if batch > 64:
            return "1M x 768 x batch 1024 on one CPU thread: ~1.6 TFLOP per call (GPU size)"
        if method == "cosine-topk" and batch > 1:
            return "cosine-topk stable-sorts all 1M scores per query: batch 1 only on the CPU"
    return None


@pytest.mark.parametrize("batch", BATCHES, ids=[f"b{b}" for b in BATCHES])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("bank", list(BANKS))
def test_similarity_topk(benchmark, bench_device, bank, dtype, method, batch):
    """Top-10 of B queries against a bank of unit vectors."""
    reason = _skip_reason(bank, dtype, method, batch, bench_device)
    if reason:
        pytest.skip(reason)
    benchmark.group = f"similarity-{bank}-{dtype}"
    threads = _harness.set_threads()
    dev = str(bench_device)
    x = _bank_dtype(bank, dev, dtype)
    q = _queries(bank, dev, batch)
    if method == "matmul-topk":
        qd = q.to(x.dtype)
        fn = lambda: torch.topk(qd @ x.T, K, dim=1)  # noqa: E731
    elif method == "retriever":
        module = _retriever(bank, dev)
        fn = lambda: module(q)[::-1]  # noqa: E731  (values, indices) like topk
    elif method == "cosine-topk":
        fn = lambda: topk(cosine_scores(q, x), K, dim=1)  # noqa: E731
    elif method.startswith("faiss"):
        import faiss

        faiss.omp_set_num_threads(threads)
        default = _FAISS_DEFAULTS.setdefault("blas", faiss.cvar.distance_compute_blas_threshold)
        faiss.cvar.distance_compute_blas_threshold = 16 if method == "faiss-blas" else default
        search = _faiss(bank)
        qn = q.cpu().numpy()
        fn = lambda: tuple(torch.from_numpy(a) for a in search(qn))  # noqa: E731
    else:
        fn = lambda: _read(x)  # noqa: E731

    def run():
        out = fn()
        _harness.sync(bench_device)
        return out

    first, _ = _harness.time_call(run, bench_device)
    rounds = _harness.rounds_for(first)
    out = benchmark.pedantic(run, rounds=rounds, iterations=1, warmup_rounds=1)
    mean = _harness.mean_seconds(benchmark, first)
    read = _read_time(x, bench_device)
    n, dim = BANKS[bank]
    row = {
        "group": benchmark.group, "method": method, "device": dev, "dtype": dtype, "n": n,
        "dim": dim, "batch": batch, "mean_ms": mean * 1e3, "us_per_query": mean * 1e6 / batch,
        "qps": batch / mean, "read_ms": read * 1e3, "ratio": mean / read,
        "threads": threads if bench_device.type == "cpu" else None,
    }  # fmt: skip
    if method != "bank-read":
        row["overlap"] = _overlap(out[1], _exact(bank, dev, batch))
    benchmark.extra_info.update({k: v for k, v in row.items() if k != "group"})
    _harness.record(row)


# ------------------------------------------------------------------------------------------
# the fused structured score on the congyu graph
# ------------------------------------------------------------------------------------------
@functools.cache
def _congyu(device: str):
    from soulmem_torch.embedding import HashingEmbedder, embed_notes
    from soulmem_torch.model.soul_tune import load_soul_tune_graph
    from soulmem_torch.retrieve.evaluation import load_suite
    from soulmem_torch.runtime import WorkingMemory
    from tests.conftest import fixture_path

    graph = load_soul_tune_graph(fixture_path("soul_tune", "congyu", "graph.json"))
    suite = load_suite(fixture_path("soul_tune", "congyu", "question.json"))
    embedder = HashingEmbedder()
    wm = WorkingMemory()
    wm.add_nodes(graph.notes, embed_notes(graph.notes, embedder))
    queries = [sq.query() for case in suite.test_cases for sq in case.sub_queries]
    return wm, wm.graph(device), queries, embedder


@pytest.mark.benchmark(group="similarity-fused-congyu")
@pytest.mark.parametrize("batch", BATCHES, ids=[f"b{b}" for b in BATCHES])
@pytest.mark.parametrize("stage", ["scores", "embed+scores"])
def test_similarity_fused_congyu(benchmark, bench_device, stage, batch):
    """The fused structured score (SPEC §4) of the congyu suite's sub-queries (repeated to B).

    ``scores``: queries embedded and string channel computed beforehand, only the tensor
    scoring is timed. ``embed+scores``: ``similarity_scores`` as the Similarity strategy calls
    it (HashingEmbedder query embedding + exact-identifier string channel + scoring).
    """
    from soulmem_torch.embedding import embed_queries
    from soulmem_torch.retrieve.similarity import identifier_index, similarity_scores

    threads = _harness.set_threads()
    dev = str(bench_device)
    wm, graph, base, embedder = _congyu(dev)
    queries = [base[i % len(base)] for i in range(batch)]
    if stage == "scores":
        from soulmem_torch.embedding.identifiers import string_scores

        emb = embed_queries(queries, embedder, device=bench_device)
        string = string_scores(queries, identifier_index(graph, wm), device=bench_device)
        fn = lambda: emb.score(graph, string_scores=string)  # noqa: E731
    else:
        fn = lambda: similarity_scores(graph, wm, queries, embedder=embedder)  # noqa: E731

    def run():
        out = fn()
        _harness.sync(bench_device)
        return out

    first, _ = _harness.time_call(run, bench_device)
    out = benchmark.pedantic(run, rounds=_harness.rounds_for(first), iterations=1, warmup_rounds=1)
    assert out.shape == (batch, int(graph.num_nodes))
    mean = _harness.mean_seconds(benchmark, first)
    row = {
        "group": "similarity-fused-congyu", "method": stage, "device": dev,
        "n": int(graph.num_nodes), "batch": batch, "mean_ms": mean * 1e3,
        "us_per_query": mean * 1e6 / batch, "qps": batch / mean,
        "threads": threads if bench_device.type == "cpu" else None,
    }  # fmt: skip
    benchmark.extra_info.update({k: v for k, v in row.items() if k != "group"})
    _harness.record(row)
