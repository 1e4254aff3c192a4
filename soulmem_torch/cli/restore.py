"""``soulmem restore``: make a verified version of a store the live one."""

from __future__ import annotations

import argparse
from typing import Any

from soulmem_torch.cli._args import common_parent
from soulmem_torch.cli._errors import EXIT_OK, CLIError
from soulmem_torch.cli._output import _emit
from soulmem_torch.cli.versions import _store_dir


def cmd_restore(args: argparse.Namespace) -> int:
    """Verifies VERSION completely, then points CURRENT at it (deletes nothing)."""
    from soulmem_torch.store import MemoryStore

    store = MemoryStore(_store_dir(args.store))
    if not store.versions():
        raise CLIError(f"store {args.store}: not a memory store (no versions in it)")
    before = store.current_version()
    contents = store.restore(args.version)
    written = contents.manifest.get("written_at", "?")
    was = f"was {before}" if before else "the pointer was unreadable"
    _emit(
        f"restored {args.store} to version {contents.version} ({len(contents.notes)} notes, "
        f"written {written}; {was}); every file verified, nothing deleted"
    )
    return EXIT_OK


def add_parser(sub: Any) -> None:
    """Registers ``soulmem restore``."""
    p = sub.add_parser(
        "restore",
        parents=[common_parent()],
        help="make a verified version of a store the live one",
        description="Reads and verifies every file of VERSION (sizes, sha256, notes, tensors) "
        "and only then points STORE's CURRENT at it, under the store's writer lock. Nothing is "
        "deleted. VERSION is a name from `soulmem versions STORE` (g000007-1a2b3c4d), a unique "
        "prefix of one, or a generation number (7).",
    )
    p.add_argument("store", metavar="STORE", help="store directory")
    p.add_argument("version", metavar="VERSION", help="version name, unique prefix or number")
    p.set_defaults(func=cmd_restore)
