"""Timing, accuracy calibration, memory-traffic floors and the results registry.

Used by the benchmark modules and by ``notebooks/02_benchmarks.ipynb``.

* CPU threads: every CPU benchmark runs with ``torch.set_num_threads(THREADS)`` (default 1,
  env ``SOULMEM_BENCH_THREADS``; 0 keeps torch's default). The peers (scipy, igraph, networkx,
  PyG's numba loop) are single-threaded, so one thread compares like with like -- and on a
  shared 2-core box, two OpenMP threads fighting a neighbour's process slow small kernels down
  by orders of magnitude, which would make the numbers irreproducible.
* Rounds: a first (warm-up) call is timed; the benchmark then runs
  ``clamp(TARGET_SECONDS / t, 1, MAX_ROUNDS)`` rounds (env ``SOULMEM_BENCH_SECONDS``).
* Equal accuracy: :func:`calibrate` picks, per (graph, method), the loosest setting of the
  method's knob (steps, threshold, tol, eps) whose max L1 error on a separate calibration batch
  is ``<= TARGET_L1``; the error reported is then measured on the timed output itself.
* Floors: :func:`ppr_floor` -- bytes a weighted power iteration must move, over the measured
  device-to-device copy bandwidth (:func:`copy_bandwidth`).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

__all__ = [
    "MAX_ROUNDS",
    "ROWS",
    "TARGET_L1",
    "TARGET_SECONDS",
    "THREADS",
    "calibrate",
    "copy_bandwidth",
    "markdown",
    "mean_seconds",
    "ppr_floor",
    "record",
    "rounds_for",
    "set_threads",
    "sync",
    "time_call",
]

TARGET_L1 = float(os.environ.get("SOULMEM_BENCH_L1", "1e-5"))
"""Accuracy every PPR method is calibrated to (max L1 over the calibration queries)."""
TARGET_SECONDS = float(os.environ.get("SOULMEM_BENCH_SECONDS", "1.0"))
"""Approximate timed seconds per benchmark case."""
MAX_ROUNDS = int(os.environ.get("SOULMEM_BENCH_MAX_ROUNDS", "50"))
THREADS = int(os.environ.get("SOULMEM_BENCH_THREADS", "1"))

ROWS: list[dict[str, Any]] = []
"""Every result recorded in this process (printed and saved by ``benchmarks/conftest.py``)."""


def set_threads() -> int:
    """Apply :data:`THREADS` to torch (and faiss when imported); return the count in use."""
    if THREADS > 0:
        torch.set_num_threads(THREADS)
    return torch.get_num_threads()


def sync(device: torch.device | str) -> None:
    """Waits for queued CUDA work so a timed call measures it."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_call(fn: Callable[[], Any], device: torch.device | str = "cpu") -> tuple[float, Any]:
    """Wall seconds of one synchronized call, and its result."""
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t0, out


def rounds_for(seconds: float, target: float | None = None) -> int:
    """Rounds so that the case takes about ``target`` seconds (at least 1)."""
    target = TARGET_SECONDS if target is None else target
    return int(min(MAX_ROUNDS, max(1, math.ceil(target / max(seconds, 1e-9)))))


def mean_seconds(benchmark: Any, fallback: float) -> float:
    """The benchmark's mean time, or ``fallback`` when pytest-benchmark is disabled (the
    default ``--benchmark-disable`` runs each case once, as a smoke test, without stats)."""
    stats = getattr(benchmark, "stats", None)
    return float(stats.stats.mean) if stats is not None else fallback


def calibrate(
    run: Callable[[Any], torch.Tensor],
    knobs: Iterable[Any],
    error: Callable[[torch.Tensor], float],
    *,
    target: float = TARGET_L1,
    time_cap: float = 60.0,
) -> tuple[Any, float]:
    """The first knob (loosest first) whose ``error(run(knob)) <= target``.

    Stops early (returning the last knob tried and its error) when one call takes longer
    than ``time_cap`` seconds; returns the tightest knob if none reaches the target.
    """
    knob, err = None, math.inf
    for knob in knobs:
        t0 = time.perf_counter()
        err = float(error(run(knob)))
        if err <= target or time.perf_counter() - t0 > time_cap:
            break
    return knob, err


# ------------------------------------------------------------------------------------------
# memory-traffic floor
# ------------------------------------------------------------------------------------------
_BANDWIDTH: dict[str, float] = {}


def copy_bandwidth(device: torch.device | str, nbytes: int = 1 << 30, repeats: int = 10) -> float:
    """Measured device-to-device copy bandwidth in bytes/s, counting read + write (cached)."""
    device = torch.device(device)
    key = str(device)
    if key not in _BANDWIDTH:
        if device.type == "cpu":
            nbytes = min(nbytes, 1 << 28)
        src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
        dst = torch.empty_like(src)
        dst.copy_(src)
        sync(device)
        t0 = time.perf_counter()
        for _ in range(repeats):
            dst.copy_(src)
        sync(device)
        _BANDWIDTH[key] = 2 * nbytes * repeats / (time.perf_counter() - t0)
        del src, dst
    return _BANDWIDTH[key]


def ppr_floor(
    *,
    num_nodes: int,
    nnz: int,
    batch: int,
    steps: int,
    dangling: int,
    keys: int,
    bandwidth: float,
    value_bytes: int = 8,
) -> dict[str, float]:
    """Minimum bytes (and seconds at ``bandwidth``) of ``steps`` weighted power-iteration steps.

    Per step, with ``v = value_bytes`` (8 for float64, 4 for float32): the ``P^T`` CSR once
    (``v nnz`` values + ``4 nnz`` int32 columns + ``4 (N + 1)`` row pointers), the iterate read
    once and the next one written once (``2 v N B``), plus the dangling gather (``v D B``) and
    the key scatter (``2 v keys B``). For float64 and ``B = 1`` this is the issue's "about
    ``8 E + 16 N`` bytes" plus the index bytes. ``gather_bytes`` is the extra worst-case traffic
    when the ``X`` rows gathered by the sparse product miss the cache (``v B`` bytes per
    nonzero instead of one read of ``X``).
    """
    v = int(value_bytes)
    per_step = (v + 4) * nnz + 4 * (num_nodes + 1) + 2 * v * num_nodes * batch
    per_step += v * dangling * batch + 2 * v * keys * batch
    total = steps * per_step
    gather = steps * v * max(nnz - num_nodes, 0) * batch
    return {
        "floor_bytes": float(total),
        "floor_s": total / bandwidth,
        "gather_bytes": float(gather),
        "gather_bound_s": (total + gather) / bandwidth,
    }


# ------------------------------------------------------------------------------------------
# registry and tables
# ------------------------------------------------------------------------------------------
def record(row: dict[str, Any]) -> dict[str, Any]:
    """Add one result row (a flat dict) to :data:`ROWS`; with ``SOULMEM_BENCH_ROWS=path`` also
    append it to that JSON-lines file at once (so a run cut short by a time limit keeps it)."""
    ROWS.append(dict(row))
    path = os.environ.get("SOULMEM_BENCH_ROWS")
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row, default=str) + "\n")
    return row


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if value == 0:
            return "0"
        if math.isinf(value) or math.isnan(value):
            return str(value)
        if abs(value) >= 1e4 or abs(value) < 1e-2:
            return f"{value:.2e}"
        return f"{value:.3g}"
    return str(value)


def markdown(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Rows grouped by their ``group`` key, one markdown table per group."""
    out: list[str] = []
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(str(row.get("group", "")), []).append(row)
    for name, items in groups.items():
        cols = list(columns) if columns else _columns(items)
        out.append(f"\n#### {name}\n")
        out.append("| " + " | ".join(cols) + " |")
        out.append("|" + "|".join("---" for _ in cols) + "|")
        for row in items:
            out.append("| " + " | ".join(_fmt(row.get(c)) for c in cols) + " |")
    return "\n".join(out) + "\n"


_PREFERRED = (
    "method", "device", "n", "e", "dtype", "batch", "knob", "mean_ms", "us_per_query",
    "qps", "l1_max", "l1_mean", "top20", "overlap", "err_own", "floor_ms", "ratio",
    "gather_bound_ms", "note",
)  # fmt: skip


def _columns(items: Sequence[dict[str, Any]]) -> list[str]:
    present = {k for row in items for k in row if k != "group"}
    return [c for c in _PREFERRED if c in present] + sorted(present - set(_PREFERRED))
