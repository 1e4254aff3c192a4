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
    if args.format != "suite":
        return _chat_eval(args)
    if args.rankings or args.level:
        raise CLIError("--rankings and --level are for --format longmemeval / locomo")
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


_HEADLINE = {
    "longmemeval": ("recall_any", "recall_all", "ndcg_any"),
    "locomo": ("recall",),
}


def _chat_eval(args: argparse.Namespace) -> int:
    """``--format longmemeval|locomo``: every haystack an agent of one bank, one ``ask``."""
    from soulmem_torch.chat import read_locomo, read_longmemeval
    from soulmem_torch.chat.evaluate import chat_ablation, evaluate_locomo, evaluate_longmemeval
    from soulmem_torch.errors import ValidationError

    if args.graph is not None or args.cases:
        raise CLIError("--graph and --cases are for suites (--format suite)")
    level = args.level or ("session" if args.format == "longmemeval" else "turn")
    config = _load_pipeline_config(args.config)
    device = _resolve_device(args.device)
    t0 = time.perf_counter()
    try:
        data = (
            read_longmemeval(args.suite)
            if args.format == "longmemeval"
            else read_locomo(args.suite)
        )
    except ValidationError as exc:
        raise CLIError(str(exc)) from None
    read_s = time.perf_counter() - t0
    if args.ablation:
        rows = chat_ablation(
            data, format=args.format, level=level, base=config,
            include_assistant=args.include_assistant, device=device, depth=args.depth,
        )  # fmt: skip
        if args.json:
            out = {"format": args.format, "level": level,
                   "rows": [{"configuration": label, "summary": r.summary} for label, r in rows]}  # fmt: skip
            print(json.dumps(out, indent=2))
        else:
            _emit(_chat_table(args.format, level, [(label, r.summary) for label, r in rows]))
        return EXIT_OK
    if args.format == "longmemeval":
        report = evaluate_longmemeval(
            data, level=level, include_assistant=args.include_assistant, config=config,
            device=device, depth=args.depth,
        )  # fmt: skip
    else:
        report = evaluate_locomo(data, level=level, config=config, device=device, depth=args.depth)
    report.timings = {"read_s": read_s, **report.timings}
    if args.rankings:
        _write_rankings(args.rankings, report.rankings)
    if args.json:
        out = {
            "format": report.format,
            "level": report.level,
            "counts": report.counts,
            "summary": report.summary,
            "groups": report.groups,
            "timings_s": report.timings,
        }
        print(json.dumps(out, indent=2))
        return EXIT_OK
    _emit(
        _chat_table(
            args.format, level, [("default" if args.config is None else "config", report.summary)]
        )
    )
    if report.groups:
        _emit(_chat_table(args.format, level, [(g, v) for g, v in report.groups.items()]))
    counts = ", ".join(f"{k} {v}" for k, v in report.counts.items())
    took = ", ".join(f"{k[:-2]} {v:.1f} s" for k, v in report.timings.items())
    _info(args, f"({counts}; {took})")
    return EXIT_OK


def _write_rankings(path: str, rankings: list[tuple[str, list[str]]]) -> None:
    """One JSON line per question: ``{"question_id": …, "ranking": [ids, best first]}``."""
    try:
        with open(path, "w", encoding="utf-8") as fh:
            for qid, ranking in rankings:
                fh.write(json.dumps({"question_id": qid, "ranking": ranking}) + "\n")
    except OSError as exc:
        raise CLIError(f"--rankings {path}: cannot write ({exc.strerror or exc})") from None


def _chat_table(fmt: str, level: str, rows: list[tuple[str, dict[str, float]]]) -> list[str]:
    """A row per configuration: the headline metrics at k = 1, 3, 5, 10."""
    prefix = "paper/" if fmt == "longmemeval" else ""
    names = [f"{prefix}{level}/{m}@{k}" for m in _HEADLINE[fmt] for k in (1, 3, 5, 10)]
    if fmt == "longmemeval":
        names += [f"all/recall_any@{k}" for k in (5, 10)]
        if level == "turn":
            names += [f"paper/session/recall_all@{k}" for k in (5, 10)]
    elif level == "turn":
        names += [f"session/recall@{k}" for k in (5, 10)]
    header = ["configuration", *(n.removeprefix(prefix) for n in names)]
    table = [header] + [
        [label, *(f"{s[n]:.3f}" if isinstance(s.get(n), float) else "-" for n in names)]
        for label, s in rows
    ]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]


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
    p.add_argument("suite", metavar="FILE", help="the suite file (question.json) or benchmark file")
    p.add_argument(
        "--format",
        choices=["suite", "longmemeval", "locomo"],
        default="suite",
        help="suite (the original's retrieval suites, default), longmemeval (a LongMemEval "
        "JSON file) or locomo (locomo10.json): every haystack one agent of one bank",
    )
    p.add_argument(
        "--level",
        choices=["session", "turn"],
        help="benchmarks: a note per session or per turn (default: session for longmemeval, "
        "turn for locomo)",
    )
    p.add_argument(
        "--rankings",
        metavar="OUT.jsonl",
        help="benchmarks: write each question's ranking (the benchmark's own ids, best first)",
    )
    p.add_argument(
        "--include-assistant",
        action="store_true",
        help="longmemeval: index the assistant's turns too (the benchmark's corpus is the user's)",
    )
    p.add_argument(
        "--depth",
        type=int,
        default=50,
        metavar="N",
        help="benchmarks: rankings at least N long (default 50)",
    )
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
