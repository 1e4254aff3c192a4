"""``soulmem eval``: run a retrieval suite and print its metrics."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from soulmem_torch.cli._args import common_parent, config_parent, device_parent
from soulmem_torch.cli._errors import EXIT_OK, CLIError
from soulmem_torch.cli._memory import _load_pipeline_config, _resolve_device
from soulmem_torch.cli._output import _emit, _info


def cmd_eval(args: argparse.Namespace) -> int:
    """Runs a retrieval suite (question.json) and prints its metric table."""
    if not Path(args.suite).is_file():
        raise CLIError(f"suite {args.suite}: no such file")
    if args.graph is not None and not Path(args.graph).is_file():
        raise CLIError(f"--graph {args.graph}: no such file")
    from soulmem_torch.retrieve.evaluation import evaluate_suite_file, format_report

    config = _load_pipeline_config(args.config)
    device = _resolve_device(args.device)
    if args.ablation:
        return _ablation(args, config, device)
    t0 = time.perf_counter()
    report = evaluate_suite_file(args.suite, graph_path=args.graph, pipeline=config, device=device)
    elapsed = time.perf_counter() - t0
    if args.json:
        out = {
            "suite": report.name,
            "cases": len(report.cases),
            "k_values": list(report.k_values),
            "summary": report.summary(),
            "per_case": [
                {
                    "name": c.name,
                    "passed": c.passed,
                    "combined": [[i, float(s)] for i, s in c.combined],
                    "action_hit": c.action_hit,
                    "mrr": c.combined_metrics.mrr,
                }
                for c in report.cases
            ],
            "elapsed_s": elapsed,
        }
        print(json.dumps(out, ensure_ascii=False, indent=2))
        return EXIT_OK
    _emit([line.rstrip() for line in format_report(report, per_case=args.cases).splitlines()])
    _info(args, f"({len(report.cases)} cases in {elapsed:.2f} s)")
    return EXIT_OK


def _ablation(args: argparse.Namespace, config: Any, device: Any) -> int:
    """``--ablation``: one row per configuration (see ``retrieve.evaluation.ablation_configs``)."""
    from soulmem_torch.retrieve.evaluation import format_ablation, run_ablation

    t0 = time.perf_counter()
    rows = run_ablation(args.suite, graph_path=args.graph, base=config, device=device)
    elapsed = time.perf_counter() - t0
    if args.json:
        out = {
            "suite": rows[0][1].name if rows else None,
            "rows": [{"configuration": label, "summary": r.summary()} for label, r in rows],
            "elapsed_s": elapsed,
        }
        print(json.dumps(out, ensure_ascii=False, indent=2))
        return EXIT_OK
    _emit(format_ablation(rows).splitlines())
    _info(args, f"({len(rows)} configurations in {elapsed:.2f} s)")
    return EXIT_OK


def add_parser(sub: Any) -> None:
    """Registers ``soulmem eval``."""
    common = common_parent()
    device = device_parent()
    config = config_parent()
    p = sub.add_parser(
        "eval",
        parents=[common, device, config],
        help="run a retrieval suite (question.json) and print its metrics",
        description="Loads the suite and its graph (graph_path, relative to the suite, or "
        "--graph), embeds it, runs every sub-query in one batch and prints MRR, hit rate and "
        "recall / precision / nDCG at each k, per sub-query and combined.",
    )
    p.add_argument("suite", metavar="SUITE.json", help="the suite file")
    p.add_argument("--graph", metavar="PATH", help="graph file (overrides graph_path)")
    p.add_argument("--cases", action="store_true", help="also one line per case")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.add_argument(
        "--ablation",
        action="store_true",
        help="one table: the original pipeline, similarity only, the original merge with "
        "association, the fused default and the default without each of its channels",
    )
    p.set_defaults(func=cmd_eval)
