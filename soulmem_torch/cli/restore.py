"""``soulmem restore``: make a verified version of a store the live one."""

from __future__ import annotations

import argparse
from typing import Any

from soulmem_torch.cli._args import common_parent
from soulmem_torch.cli._errors import EXIT_OK, CLIError
from soulmem_torch.cli._output import _emit
from soulmem_torch.cli.versions import _store_dir


def cmd_restore(args: argparse.Namespace) -> int:
    """Verifies VERSION completely, then makes its notes the live ones (deletes nothing)."""
    from soulmem_torch.store import MemoryStore

    store = MemoryStore(_store_dir(args.store))
    if not store.versions():
        raise CLIError(f"store {args.store}: not a memory store (no versions in it)")
    before = store.current_version()
    legacy = store.is_legacy()
    name = store.resolve_version(args.version)
    contents = store.restore(args.version)
    if legacy:
        written = contents.manifest.get("written_at", "?")
        was = f"was {before}" if before else "the pointer was unreadable"
        _emit(
            f"restored {args.store} to version {name} ({len(contents.notes)} notes, "
            f"written {written}; {was}); every file verified, nothing deleted"
        )
    else:
        _emit(
            f"restored {args.store} to version {name} ({len(contents.notes)} notes): they are "
            f"live again as the new version {contents.version}; every row verified, nothing "
            f"deleted (`soulmem restore {args.store} {before}` undoes it)"
        )
    return EXIT_OK


def add_parser(sub: Any) -> None:
    """Registers ``soulmem restore``."""
    p = sub.add_parser(
        "restore",
        parents=[common_parent()],
        help="make a verified version of a store the live one",
        description="Reads and verifies every note of VERSION (row checksums, notes, "
        "embeddings) and only then makes them the live notes, as a new version written in one "
        "transaction under the store's writer lock (so a restore can be undone). Nothing is "
        "deleted. VERSION is a name from `soulmem versions STORE` (g000007) or its number (7); "
        "a store of the old directory format takes its directory names and points CURRENT.",
    )
    p.add_argument("store", metavar="STORE", help="store directory")
    p.add_argument("version", metavar="VERSION", help="version name, unique prefix or number")
    p.set_defaults(func=cmd_restore)
