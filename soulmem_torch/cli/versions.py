"""``soulmem versions``: every version of a store, with note counts, dates and validity."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from soulmem_torch.cli._args import common_parent
from soulmem_torch.cli._errors import EXIT_OK, CLIError
from soulmem_torch.cli._output import _clip, _emit, _table


def _store_dir(path: str) -> Path:
    p = Path(path)
    if not p.exists():
        raise CLIError(f"store {path}: no such directory")
    if not p.is_dir():
        raise CLIError(f"store {path}: is a file, expected a store directory")
    return p


def cmd_versions(args: argparse.Namespace) -> int:
    """Lists the versions of a store (works on a damaged store: that is what it is for)."""
    from soulmem_torch.store import CURRENT_FILE, MemoryStore

    store = MemoryStore(_store_dir(args.store))
    infos = store.versions()
    if not infos:
        raise CLIError(f"store {args.store}: not a memory store (no versions in it)")
    try:
        live: str | None = store.check()
        pointer = None
    except Exception as exc:  # StoreDamagedError: shown, not fatal here
        live, pointer = None, str(exc)
    if args.json:
        data = {
            "store": str(args.store),
            "current": live,
            "pointer_problem": pointer,
            "versions": [
                {
                    "name": v.name,
                    "generation": v.generation,
                    "current": v.current,
                    "valid": v.valid,
                    "problem": v.problem,
                    "written_at": v.written_at,
                    "notes": v.notes,
                    "embedder": v.embedder,
                }
                for v in infos
            ],
        }
        print(json.dumps(data, ensure_ascii=False, indent=2))
        return EXIT_OK
    rows = [
        [
            ("* " if v.current else "  ") + v.name,
            "-" if v.notes is None else str(v.notes),
            v.written_at or "-",
            _clip(v.embedder or "-", 28),
            "ok" if v.valid else "BAD: " + _clip(v.problem or "", 70),
        ]
        for v in reversed(infos)  # newest first
    ]
    _emit(f"{len(infos)} version(s) of {args.store}, newest first (* = live):")
    _emit(_table(["version", "notes", "written", "embedder", "status"], rows, right=[1]))
    if pointer is not None:
        newest = next((v.name for v in reversed(infos) if v.valid), None)
        hint = (
            f"; `soulmem restore {args.store} {newest}` makes the newest valid version live"
            if newest
            else "; no version verifies"
        )
        _emit(f"{CURRENT_FILE} is unreadable: {pointer.split(' — ')[0].split('; ')[0]}{hint}")
    return EXIT_OK


def add_parser(sub: Any) -> None:
    """Registers ``soulmem versions``."""
    p = sub.add_parser(
        "versions",
        parents=[common_parent()],
        help="list a store's versions (note counts, dates, whether each verifies)",
        description="Lists every version STORE keeps (its change log; $SOULMEM_KEEP_VERSIONS, "
        "default 50), newest first: its note count, when it was written, the embedder of its "
        "vectors and whether every row of it verifies (checksums). Works on a damaged store; "
        "pick a valid version and `soulmem restore STORE VERSION` to make it live again.",
    )
    p.add_argument("store", metavar="STORE", help="store directory")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.set_defaults(func=cmd_versions)
