"""``soulmem forget``: forgetting over a store."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from soulmem_torch.cli._args import (
    _llm_spec_arg,
    _non_negative_float,
    _positive_float,
    _positive_int,
    _rfc3339_arg,
    common_parent,
)
from soulmem_torch.cli._errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, CLIError, _one_line
from soulmem_torch.cli._forgetting import (
    _changed_notes,
    _days_after,
    _emit_forget_table,
    _forget_json,
    _forget_rows,
    _newest_create_time,
)
from soulmem_torch.cli._llm import _load_llm
from soulmem_torch.cli._memory import _short_id
from soulmem_torch.cli._output import _emit, _info, _quiet_libraries, _show_progress
from soulmem_torch.cli._store import embedder_parent, load_store_memory


def cmd_forget(args: argparse.Namespace) -> int:
    """Forgetting over a store: mask / reconstruct, re-embed, save back atomically."""
    store = Path(args.store)
    if not store.is_dir():
        raise CLIError(
            f"store {args.store}: "
            + ("no such directory" if not store.exists() else "not a store directory")
        )
    if args.write and args.dry_run:
        raise CLIError("--write and --dry-run: give one of them", EXIT_USAGE)
    if args.write and not args.fake:
        raise CLIError(
            "--write only applies to --fake (the other modes save unless --dry-run)", EXIT_USAGE
        )
    # the fake LLM's placeholder text is for trying forgetting out: it reaches the store only
    # when asked twice (--fake --write)
    dry_run = args.dry_run or (args.fake and not args.write)
    if args.llm is not None:
        llm: Any = _load_llm(args.llm)
        llm_name = args.llm
    elif args.fake:
        from soulmem_torch.forget import FakeLLM

        llm, llm_name = FakeLLM(), "the built-in FakeLLM"
    else:
        llm, llm_name = None, "no LLM (mask only)"
    _quiet_libraries(args)
    mem = load_store_memory(args, store)  # the store's embedder (or --embedder), checked
    notes = [e.note for e in mem.cluster]
    now = args.now if args.now is not None else _days_after(_newest_create_time(notes), args.days)
    _info(args, f"forgetting over {len(notes)} notes of {store} at {now} with {llm_name}")
    try:
        report = asyncio.run(
            mem.forget(
                now=now,
                llm=llm,
                progress=_show_progress(args),
                concurrency=args.concurrency,
                timeout=args.timeout,
            )
        )
    except (asyncio.CancelledError, SystemExit, KeyboardInterrupt) as exc:
        # forgetting is all or nothing: an interrupted run changed no note and saved nothing
        detail = f"{type(exc).__name__}" + (f": {exc}" if str(exc) else "")
        raise CLIError(
            f"forgetting was interrupted ({detail}); no note was changed and the store was "
            "not rewritten",
            EXIT_INTERRUPTED,
        ) from None
    llm_failures = [f for f in report.failures if f.stage == "llm"]
    if llm is not None and llm_failures and report.revised == 0:
        first = llm_failures[0].error
        raise CLIError(
            f"all {len(llm_failures)} LLM call(s) failed, so nothing was reconstructed and the "
            f"store was not changed (first error: {first}); fix --llm, or use --mask-only to "
            "mask without an LLM"
        )
    changed = len(_changed_notes(mem, report))
    saved = False
    if not dry_run and changed:
        mem.save(store)
        saved = True
    if args.json:
        print(
            json.dumps(
                _forget_json(mem, report, now=now, saved=saved), ensure_ascii=False, indent=2
            )
        )
        return EXIT_OK
    _emit(report.summary())
    rows, n_changed = _forget_rows(mem, report, limit=args.show, width=30)
    _emit_forget_table(report, rows, n_changed)
    other = [f for f in report.failures if f.stage != "llm" or llm is not None]
    for failure in other[:5]:
        who = _short_id(mem, failure.note_id) if failure.note_id is not None else "(batch)"
        print(
            f"warning: {failure.stage} failed for {who}: {_one_line(failure.error)}",
            file=sys.stderr,
        )
    if len(other) > 5:
        print(f"warning: … and {len(other) - 5} more failures", file=sys.stderr)
    if dry_run:
        why = " (--fake implies it; --fake --write saves)" if not args.dry_run else ""
        _emit(f"dry run{why}: the store was not changed")
    elif saved:
        from soulmem_torch.store import MemoryStore

        _emit(f"saved {store} (version {MemoryStore(store).current_version()})")
    else:
        _emit("nothing changed; the store was not rewritten")
    return EXIT_OK


def add_parser(sub: Any) -> None:
    """Registers ``soulmem forget``."""
    common = common_parent()
    p = sub.add_parser(
        "forget",
        parents=[common, embedder_parent()],
        help="run forgetting over a store (mask, reconstruct with an LLM, re-embed, save)",
        description="Decays every note by the Ebbinghaus curve at the given time, masks "
        "forgotten words, asks the LLM to reconstruct heavily masked text, re-embeds the "
        "changed notes and saves the store back atomically (unless --dry-run; --fake is a "
        "dry run unless --write). If every LLM "
        "call fails the store is left unchanged and the exit status is 1.",
        epilog="--llm takes an async (or plain) callable (system: str, user: str) -> str, "
        "imported as MODULE:FUNCTION (from PYTHONPATH or the current directory) or "
        "path/to/file.py:FUNCTION.",
    )
    p.add_argument("store", metavar="STORE", help="store directory")
    when = p.add_mutually_exclusive_group(required=True)
    when.add_argument(
        "--now",
        type=_rfc3339_arg,
        metavar="TIME",
        help="the time to forget at: RFC 3339 (2026-07-20T12:00:00Z) or 'now'",
    )
    when.add_argument(
        "--days",
        type=_non_negative_float,
        metavar="N",
        help="N days after the newest note's create_time (reproducible)",
    )
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument(
        "--llm",
        type=_llm_spec_arg,
        metavar="MODULE:FUNCTION",
        help="the LLM that reconstructs masked text",
    )
    who.add_argument(
        "--fake", action="store_true", help="the built-in deterministic FakeLLM (offline)"
    )
    who.add_argument(
        "--mask-only", action="store_true", help="no LLM: heavily forgotten notes are masked only"
    )
    p.add_argument(
        "--concurrency",
        type=_positive_int,
        metavar="N",
        default=8,
        help="LLM calls in flight at once (default 8)",
    )
    p.add_argument(
        "--timeout",
        type=_positive_float,
        metavar="S",
        default=60.0,
        help="seconds one LLM call may take (default 60; a blocking plain callable is "
        "abandoned in its worker thread)",
    )
    p.add_argument("--dry-run", action="store_true", help="report only; do not save")
    p.add_argument(
        "--write",
        action="store_true",
        help="with --fake: save the fake LLM's placeholder reconstructions into the store "
        "(--fake alone is a dry run)",
    )
    p.add_argument(
        "--show",
        type=_positive_int,
        metavar="N",
        default=20,
        help="changed notes listed (default 20)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable report on stdout")
    p.set_defaults(func=cmd_forget)
