"""``soulmem query``: ask a store (texts and/or structured queries)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from soulmem_torch.cli._args import _positive_int, common_parent, config_parent, device_parent
from soulmem_torch.cli._errors import EXIT_OK, EXIT_USAGE, CLIError
from soulmem_torch.cli._memory import (
    _describe_query,
    _load_pipeline_config,
    _open_memory,
    _read_text,
    _resolve_device,
    _scored_json,
    _scored_rows,
)
from soulmem_torch.cli._output import _clip, _emit, _table
from soulmem_torch.cli._store import embedder_parent


def _read_queries_file(path: str) -> list[tuple[str, Any, int]]:
    """Items ``("text", str, 0)`` or ``("query", MemoryRetrieveQuery, priority)``.

    Accepted: one text per line (blank lines and ``#`` comments skipped); or JSON — an array
    whose items are strings, ``MemoryRetrieveQuery`` objects ``{tag, variant}``,
    question.json-style sub-queries ``{priority, tag, variant}`` or ``{priority, query}``; a
    single such object; a test case ``{sub_queries: [...]}`` or a whole suite
    ``{test_cases: [...]}`` (every sub-query of every case); or JSON Lines of such items.
    """
    import pydantic

    from soulmem_torch.model.describe import describe_validation_error
    from soulmem_torch.model.query import MemoryRetrieveQuery

    text = _read_text(path, "--file")
    stripped = text.strip()
    if not stripped:
        raise CLIError(f"--file {path}: the file is empty")
    if stripped[0] not in "[{":
        lines = [ln.strip() for ln in text.splitlines()]
        return [("text", ln, 0) for ln in lines if ln and not ln.startswith("#")]
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        try:  # JSON Lines?
            data = [json.loads(ln) for ln in text.splitlines() if ln.strip()]
        except json.JSONDecodeError:
            raise CLIError(f"--file {path}: not valid JSON ({exc})") from None
    if isinstance(data, dict):
        if isinstance(data.get("test_cases"), list):
            data = [
                sq
                for case in data["test_cases"]
                if isinstance(case, dict)
                for sq in case.get("sub_queries", [])
            ]
        elif isinstance(data.get("sub_queries"), list):
            data = data["sub_queries"]
        else:
            data = [data]
    if not isinstance(data, list) or not data:
        raise CLIError(f"--file {path}: expected a non-empty JSON array of queries")
    out: list[tuple[str, Any, int]] = []
    for i, item in enumerate(data):
        if isinstance(item, str):
            if not item.strip():
                raise CLIError(f"--file {path}: item {i}: an empty text")
            out.append(("text", item, 0))
            continue
        if not isinstance(item, dict):
            raise CLIError(
                f"--file {path}: item {i}: expected a text or a query object, "
                f"found {type(item).__name__}"
            )
        priority = item.get("priority", 0)
        if isinstance(priority, bool) or not isinstance(priority, int) or priority < 0:
            raise CLIError(f"--file {path}: item {i}: priority must be an integer >= 0")
        body = item["query"] if isinstance(item.get("query"), dict) else item
        try:
            query = MemoryRetrieveQuery.model_validate(
                {"tag": body.get("tag", []), "variant": body.get("variant")}
            )
        except pydantic.ValidationError as exc:
            raise CLIError(
                f"--file {path}: item {i}: not a query: {describe_validation_error(exc)}"
            ) from None
        out.append(("query", query, priority))
    return out


def _positive(scored: list[tuple[Any, float]]) -> list[tuple[Any, float]]:
    """The rows with a score > 0: a zero score is no evidence, so it is not shown as a rank."""
    return [(mid, score) for mid, score in scored if float(score) > 0.0]


def cmd_query(args: argparse.Namespace) -> int:
    """Answers texts and/or structured queries against a store, in one batch per kind."""
    if not args.text and args.file is None:
        raise CLIError("give a TEXT to ask, or --file QUERIES", EXIT_USAGE)
    for n, text in enumerate(args.text, start=1):
        if not text.strip():
            which = "TEXT" if len(args.text) == 1 else f"TEXT {n}"
            raise CLIError(f"{which}: expected a non-empty text", EXIT_USAGE)
    items: list[tuple[str, Any, int]] = [("text", text, 0) for text in args.text]
    if args.file is not None:
        items.extend(_read_queries_file(args.file))
    if not items:
        raise CLIError(f"--file {args.file}: no queries in it")
    config = _load_pipeline_config(args.config)
    device = _resolve_device(args.device)
    mem = _open_memory(args.store, args, device=device)

    texts = [(i, payload) for i, (kind, payload, _) in enumerate(items) if kind == "text"]
    structured = [(i, payload, p) for i, (kind, payload, p) in enumerate(items) if kind == "query"]
    answers: list[Any] = [None] * len(items)
    t0 = time.perf_counter()
    if texts:
        asked = mem.ask([t for _, t in texts], config=config, only_matching=not args.all)
        for (i, _), res in zip(texts, asked):
            answers[i] = res
    if structured:
        results = mem.query(
            [q for _, q, _ in structured], config=config, priorities=[p for _, _, p in structured]
        )
        for (i, _, _), res in zip(structured, results):
            answers[i] = res
    elapsed = time.perf_counter() - t0

    if args.json:
        out = []
        for (kind, payload, priority), res in zip(items, answers):
            out.append(
                {
                    "query": payload if kind == "text" else json.loads(payload.to_json()),
                    "priority": priority,
                    "memories": _scored_json(mem, _positive(res.association)[: args.top]),
                    "actions": _scored_json(mem, _positive(res.action)),
                }
            )
        print(json.dumps(out, ensure_ascii=False, indent=2))
        return EXIT_OK
    _emit(
        f"{len(items)} quer{'y' if len(items) == 1 else 'ies'} against {len(mem)} notes "
        f"({args.store}) in {elapsed:.2f} s"
    )
    for n, ((kind, payload, priority), res) in enumerate(zip(items, answers), start=1):
        title = _clip(payload, 80) if kind == "text" else _describe_query(payload)
        extra = f"  (priority {priority})" if kind == "query" and priority else ""
        _emit()
        _emit(f"[{n}] {title}{extra}")
        memories, actions = _positive(res.association), _positive(res.action)
        if not memories:
            _emit(
                "  no memory found"
                + (
                    ""
                    if args.all or kind != "text"
                    else " that matches the question (--all: every fused result)"
                )
            )
        else:
            rows = _scored_rows(mem, memories[: args.top], 60)
            _emit(_table(["#", "memory", "kind", "score", "label"], rows, right=(0, 3)))
        if actions:
            _emit("  recommended actions:")
            _emit(
                _table(
                    ["#", "action", "kind", "score", "label"],
                    _scored_rows(mem, actions, 60),
                    right=(0, 3),
                    indent="    ",
                )
            )
    return EXIT_OK


def add_parser(sub: Any) -> None:
    """Registers ``soulmem query``."""
    common = common_parent()
    device = device_parent()
    config = config_parent()
    p = sub.add_parser(
        "query",
        parents=[common, device, config, embedder_parent()],
        help="ask a store: one or more texts, or a file of texts / structured queries",
        description="Answers free-text questions (each a concept query and an episode query, "
        "mixed) and/or every query of --file, in one batch, through the default pipeline. "
        "Rows with score 0 (no evidence) are not listed. STORE is a store directory, or a "
        "notes / graph file (embedded on the fly).",
        epilog="--file accepts one text per line, or JSON: an array of texts, "
        "MemoryRetrieveQuery objects {tag, variant}, question.json sub-queries "
        "{priority, tag, variant}, a test case {sub_queries} or a whole suite {test_cases}.",
    )
    p.add_argument("store", metavar="STORE", help="store directory (or a notes/graph file)")
    p.add_argument(
        "text",
        metavar="TEXT",
        nargs="*",
        help="questions in free text (several texts are answered in one batch)",
    )
    p.add_argument("--file", metavar="QUERIES", help="a file of queries (see below)")
    p.add_argument(
        "--top",
        type=_positive_int,
        metavar="N",
        default=10,
        help="memories shown per query (default 10)",
    )
    p.add_argument(
        "--all",
        action="store_true",
        help="texts: also list results that matched nothing the question said (by default a "
        "memory is listed when it shares a word with the question or is linked to one that "
        "does)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.set_defaults(func=cmd_query)
