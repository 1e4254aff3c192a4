"""Where the peak resident memory of ``soulmem eval --format longmemeval FILE --level turn``
happens: the evaluation's stages run one after another in this process, the resident-set
high-water mark (``VmHWM``) read and reset between them (Linux).

Run: ``python -m benchmarks._eval_peak FILE [--level turn|session]``; prints one JSON line:
per stage the peak RSS during it and the RSS after it (MiB), and the stage's seconds.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from benchmarks._memory_probe import hwm_bytes, reset_hwm, rss_bytes

__all__ = ["eval_peak"]

_MIB = 1 << 20


def eval_peak(path: str, level: str = "turn") -> dict[str, Any]:
    """Stages: ``import`` (the package), ``read`` (the JSON file), ``notes`` (the haystacks'
    notes), ``embed_add`` (embedding and ``add_agent``, a group of haystacks at a time),
    ``union`` (every agent's snapshot and the bank's union, the first time a question needs
    them), ``ask`` (the rest of the one ``bank.ask``: text indexes, similarity, PPR, fusion)."""
    import torch

    torch.set_num_threads(1)
    stages: dict[str, dict[str, float]] = {}

    def stage(name: str, start: float) -> None:
        stages[name] = {
            "peak_mib": hwm_bytes() / _MIB,
            "rss_after_mib": rss_bytes() / _MIB,
            "seconds": time.perf_counter() - start,
        }
        reset_hwm()

    reset_hwm()
    t0 = time.perf_counter()
    import soulmem_torch.bank  # noqa: F401
    from soulmem_torch.chat import evaluate as chat_eval
    from soulmem_torch.chat import read_longmemeval, sessions_to_notes

    stage("import", t0)
    t0 = time.perf_counter()
    questions = read_longmemeval(path)
    stage("read", t0)
    t0 = time.perf_counter()
    made = [sessions_to_notes(q.sessions, level=level, roles=("user",)) for q in questions]
    stage("notes", t0)
    original = chat_eval.sessions_to_notes
    it = iter(made)
    chat_eval.sessions_to_notes = lambda *a, **k: next(it)  # type: ignore[assignment]
    try:
        t0 = time.perf_counter()
        hb = chat_eval.HaystackBank.build(
            [q.sessions for q in questions],
            level=level,
            roles=("user",),  # type: ignore[arg-type]
        )
        stage("embed_add", t0)
    finally:
        chat_eval.sessions_to_notes = original
    t0 = time.perf_counter()
    hb.bank.union()
    stage("union", t0)
    t0 = time.perf_counter()
    try:
        report = chat_eval.evaluate_longmemeval(questions, level=level, prepared=hb)
    except RuntimeError as exc:
        print("ask failed:", str(exc)[:80])
        report = None
    stage("ask", t0)
    notes = sum(len(m.notes) for m in made)
    return {
        "level": level,
        "notes": notes,
        "stages": stages,
        "peak_mib": max(s["peak_mib"] for s in stages.values()),
        "recall_all@5": None if report is None else report.summary.get(f"{level}_recall_all@5"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--level", choices=["session", "turn"], default="turn")
    args = parser.parse_args()
    print(json.dumps(eval_peak(args.path, args.level)))


if __name__ == "__main__":
    main()
