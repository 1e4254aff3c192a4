"""Peak memory of one ``retrieve_batch`` call, measured in a fresh process.

Run: ``python -m benchmarks._memory_probe --notes 100000 --batch 500 [--dim 32]
[--budget BYTES] [--strategy pipeline|association]``; prints one JSON line.

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
from typing import Any

import torch

from benchmarks import _graphs
from soulmem_torch.graph import MemoryGraph

__all__ = ["hwm_bytes", "reset_hwm", "rss_bytes", "synthetic_plain_memory"]


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notes", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--strategy", choices=["pipeline", "association"], default="pipeline")
    parser.add_argument("--method", default="power")
    parser.add_argument("--budget", type=int, default=None, help="SOULMEM_MAX_BATCH_BYTES")
    args = parser.parse_args()
    if args.budget is not None:
        os.environ["SOULMEM_MAX_BATCH_BYTES"] = str(args.budget)
    print(json.dumps(measure(args.notes, args.batch, args.dim, args.strategy, args.method)))


if __name__ == "__main__":
    main()
