"""``soulmem consolidate``: the store's window summary into long-term notes, and the plasticity
update of its hot links (docs/spec.md §10)."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from soulmem_torch.cli._args import _llm_spec_arg, _positive_float, _positive_int, common_parent
from soulmem_torch.cli._errors import EXIT_INTERRUPTED, EXIT_OK, CLIError
from soulmem_torch.cli._llm import _load_llm
from soulmem_torch.cli._output import _emit, _info, _quiet_libraries
from soulmem_torch.cli._store import embedder_parent, load_store_memory


def _report_json(mem: Any, report: Any, changes: list[Any], saved: bool) -> dict[str, Any]:
    return {
        "saved": saved,
        "summary_was_empty": report.summary_was_empty,
        "error": report.error,
        "hot_memories_used": report.hot_memories_used,
        "active": [mem.name(i) for i in report.active],
        "notes_added": [{"id": str(i), "name": mem.name(i)} for i in report.notes_added],
        "notes_merged": [str(i) for i in report.notes_merged],
        "links_added": report.links_added,
        "links_changed": [
            {
                "link": str(c.link_id),
                "from": mem.name(c.from_),
                "to": mem.name(c.to),
                "old_intensity": c.old_intensity,
                "new_intensity": c.new_intensity,
            }
            for c in changes
        ],
    }


def cmd_consolidate(args: argparse.Namespace) -> int:
    """Consolidates STORE's summary (or --summary) and updates its hot links; saves first."""
    store = Path(args.store)
    if not store.is_dir():
        raise CLIError(
            f"store {args.store}: "
            + ("no such directory" if not store.exists() else "not a store directory")
        )
    if args.llm is not None:
        llm: Any = _load_llm(args.llm)
    else:
        from soulmem_torch.forget import FakeLLM

        llm = FakeLLM()
    _quiet_libraries(args)
    mem = load_store_memory(args, store)
    if args.summary is not None:
        text = (
            Path(args.summary[1:]).read_text("utf-8")
            if args.summary.startswith("@")
            else args.summary
        )
        mem.working_memory.sliding_window.set_summary(text)
    _info(args, f"consolidating {store} ({len(mem)} notes)")
    try:
        report = asyncio.run(
            mem.consolidate(
                llm=llm, top_k=args.top_k, link_with_llm=args.link_with_llm,
                timeout=args.timeout, save_to=store,
            )
        )  # fmt: skip
        changes = list(report.links_changed)
        saved = report.written
        if report.summary_was_empty:  # nothing to split: the plasticity update alone
            changes = mem.update_plasticity(args.top_k, save_to=store)
            saved = bool(changes)
    except (asyncio.CancelledError, SystemExit, KeyboardInterrupt) as exc:
        raise CLIError(
            f"consolidation was interrupted ({type(exc).__name__}); nothing was changed",
            EXIT_INTERRUPTED,
        ) from None
    if report.error is not None:
        raise CLIError(f"consolidation failed, the store was not changed: {report.error}")
    if args.json:
        print(json.dumps(_report_json(mem, report, changes, saved), ensure_ascii=False, indent=2))
        return EXIT_OK
    if report.summary_was_empty:
        _emit("the summary is empty: no notes to add")
    else:
        _emit(
            f"added {len(report.notes_added)} note(s), merged {len(report.notes_merged)}, "
            f"{report.links_added} new link(s)"
        )
        for i in report.notes_added[: args.show]:
            _emit(f"  + {mem.name(i)}")
    _emit(f"plasticity: {len(changes)} link(s) changed")
    for c in changes[: args.show]:
        _emit(
            f"  {mem.name(c.from_)} -> {mem.name(c.to)}: {c.old_intensity:.3f} -> {c.new_intensity:.3f}"
        )
    _emit(f"saved {store}" if saved else "nothing changed; the store was not rewritten")
    return EXIT_OK


def add_parser(sub: Any) -> None:
    """Registers ``soulmem consolidate``."""
    p = sub.add_parser(
        "consolidate",
        parents=[common_parent(), embedder_parent()],
        help="consolidate a store's window summary into notes; strengthen/weaken hot links",
        description="Splits the store's sliding-window summary (or --summary) into new notes "
        "with the LLM, merges duplicates, links them to the notes retrieved this cycle, runs "
        "the plasticity update of the hot links, and saves the store (first; a failure "
        "changes nothing). With an empty summary only the plasticity update runs.",
        epilog="--llm takes an async (or plain) callable (system: str, user: str) -> str, "
        "imported as MODULE:FUNCTION or path/to/file.py:FUNCTION.",
    )
    p.add_argument("store", metavar="STORE", help="store directory")
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--llm", type=_llm_spec_arg, metavar="MODULE:FUNCTION", help="the LLM")
    who.add_argument("--fake", action="store_true", help="the built-in deterministic FakeLLM")
    p.add_argument(
        "--summary", metavar="TEXT|@FILE", default=None,
        help="consolidate this text (or a file's) instead of the stored summary",
    )  # fmt: skip
    p.add_argument("--top-k", type=_positive_int, default=8, metavar="N", help="hot notes (8)")
    p.add_argument(
        "--link-with-llm", action="store_true",
        help="link new notes by a second LLM call (legality matrix) instead of the minimal rule",
    )  # fmt: skip
    p.add_argument(
        "--timeout", type=_positive_float, metavar="S", default=60.0,
        help="seconds one LLM call may take (default 60)",
    )  # fmt: skip
    p.add_argument("--show", type=_positive_int, metavar="N", default=10, help="lines listed")
    p.add_argument("--json", action="store_true", help="machine-readable report on stdout")
    p.set_defaults(func=cmd_consolidate)
