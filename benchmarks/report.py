"""Turn saved benchmark rows (``SOULMEM_BENCH_ROWS`` JSON-lines files) into markdown tables.

Usage::

    python -m benchmarks.report rows-ppr.jsonl rows-similarity.jsonl > summary.md

Prints one table per group (time, error against the float64 reference, top-k overlap, and for
CUDA PPR runs the memory-traffic floor and measured / floor), then the target checks that can be
computed from the rows present.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from benchmarks._harness import markdown

__all__ = ["floor_table", "load", "main", "targets"]


def load(paths: Sequence[str]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            text = fh.read().strip()
        if text.startswith("["):
            rows.extend(json.loads(text))
        else:
            rows.extend(json.loads(line) for line in text.splitlines() if line.strip())
    return rows


def floor_table(rows: Sequence[dict[str, Any]]) -> str:
    """The CUDA PPR rows that carry a floor: time, floor, gather-bound estimate, ratio."""
    keep = [r for r in rows if r.get("floor_ms") is not None]
    if not keep:
        return ""
    cols = ["group", "method", "batch", "knob", "mean_ms", "floor_ms", "gather_bound_ms",
            "ratio", "copy_GBps"]  # fmt: skip
    flat = [{**r, "group": "floors"} for r in keep]
    for r, orig in zip(flat, keep):
        r["method"] = f"{orig['group']}:{orig['method']}"
    return markdown(flat, [c for c in cols if c != "group"])


def _find(rows, **match) -> list[dict[str, Any]]:
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def targets(rows: Sequence[dict[str, Any]]) -> str:
    """The issue's targets, evaluated on whatever rows are present."""
    out = ["\n#### targets\n"]

    def line(text: str) -> None:
        out.append(f"- {text}")

    settings = sorted(
        {(r.get("device"), r.get("threads")) for r in rows if r.get("device") in ("cpu", "cuda")},
        key=str,
    )
    for dev, threads in settings:
        sel = [r for r in rows if r.get("device") == dev and r.get("threads") == threads]
        tag = dev if threads is None else f"{dev} ({threads} thread{'s' if threads != 1 else ''})"
        power = _find(sel, group="ppr-ba100k", method="power", batch=64)
        bare = _find(sel, group="ppr-ba100k", method="csr-addmm", batch=64)
        spmm = _find(sel, group="ppr-ba100k", method="csr-spmm", batch=64)
        cold = _find(sel, group="ppr-ba100k", method="power+build", batch=64)
        ig = _find(sel, group="ppr-ba100k", method="igraph")
        if power and bare:
            p, b = power[0], bare[0]
            text = (
                f"{tag} BA 100k, b64: power {p['mean_ms']:.1f} ms (L1 {p.get('l1_max', 0):.1e}) "
                f"/ bare addmm loop {b['mean_ms']:.1f} ms = {p['mean_ms'] / b['mean_ms']:.2f}x "
                "(target <= 1.2x)"
            )
            if spmm:
                text += f"; / sparse.mm loop = {p['mean_ms'] / spmm[0]['mean_ms']:.2f}x"
            if cold:
                text += (
                    f"; with weights + operator build every call {cold[0]['mean_ms']:.1f} ms "
                    f"= {cold[0]['mean_ms'] / b['mean_ms']:.2f}x"
                )
            line(text)
        if power and ig:
            p = power[0]
            best = min(ig, key=lambda r: r["us_per_query"])
            line(
                f"{tag} BA 100k: power b64 {p['us_per_query']:.0f} us/query vs igraph "
                f"{best['us_per_query']:.0f} us/query = {best['us_per_query'] / p['us_per_query']:.1f}x "
                "faster (target >= 4x)"
            )
        orig = [
            r for r in _find(sel, group="ppr-original-n3000")
            if r["batch"] >= 64 and r["method"] in ("push", "push@1e-5", "power")
        ]  # fmt: skip
        if orig:
            best = min(orig, key=lambda r: r["us_per_query"])
            line(
                f"{tag} original graph n=3000: best {best['method']} b{best['batch']} "
                f"{best['us_per_query']:.1f} us/query (L1 {best.get('l1_max', 0):.1e}; "
                "target <= 28 us; the Rust push reports 281 us)"
            )
    floors = [r for r in rows if r.get("ratio") is not None and r.get("floor_ms") is not None]
    for r in floors:
        if r["method"] == "power" and r["batch"] >= 64 and "chunglu-1M" in r["group"]:
            line(
                f"cuda {r['group']} power b{r['batch']}: {r['mean_ms']:.2f} ms = "
                f"{r['ratio']:.2f}x its floor {r['floor_ms']:.2f} ms (target <= 2x)"
            )
    for r in _find(rows, device="cuda"):
        if r["group"] == "pipeline-1M":
            line(
                f"cuda pipeline 1M notes {r['method']} b{r['batch']}: {r['qps']:.0f} q/s "
                "(target >= 1000)"
            )
        if (
            r["group"].startswith("similarity-")
            and r["method"] == "matmul-topk"
            and r["batch"] <= 64
        ):
            line(
                f"cuda {r['group']} b{r['batch']}: {r['ratio']:.2f}x the bank read (target <= 1.5x)"
            )
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    paths = list(sys.argv[1:] if argv is None else argv)
    if not paths:
        print(__doc__)
        return 2
    rows = load(paths)
    print(markdown(rows))
    floors = floor_table(rows)
    if floors:
        print("\n### memory-traffic floors (CUDA PPR)\n" + floors)
    print(targets(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
