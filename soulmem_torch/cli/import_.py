"""``soulmem import``: embed a notes file into a store."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from soulmem_torch.cli._args import common_parent
from soulmem_torch.cli._errors import EXIT_OK, EXIT_USAGE, CLIError
from soulmem_torch.cli._memory import (
    _embed_with_progress,
    _new_memory,
    _open_memory,
    _read_notes_file,
)
from soulmem_torch.cli._output import _emit, _show_progress
from soulmem_torch.cli._store import embedder_parent


def _store_arg(args: argparse.Namespace) -> str:
    if args.store and args.store_opt and args.store != args.store_opt:
        raise CLIError(
            f"two different stores given: {args.store!r} and --store {args.store_opt!r}",
            EXIT_USAGE,
        )
    return args.store or args.store_opt or os.environ.get("SOULMEM_STORE") or "soulmem_store"


def cmd_import(args: argparse.Namespace) -> int:
    """Reads notes (serde or graph), embeds them and saves them into a store."""
    store = _store_arg(args)
    if Path(store).exists() and not Path(store).is_dir():
        raise CLIError(f"store {store}: exists and is not a directory")
    notes, readable, fmt = _read_notes_file(
        args.file, args.format, on_duplicate=args.on_duplicate, names=args.names
    )
    if not notes:
        raise CLIError(f"{args.file}: no notes in it")
    from soulmem_torch.store import MemoryStore

    # Read → merge → write under the store's writer lock: concurrent imports each extend the
    # newest version (never overwrite one another); a damaged store is refused by the load
    # (or, with --replace, by the save) with its recovery path.
    with MemoryStore(store).lock():
        return _import_locked(args, store, notes, readable, fmt)


def _import_locked(
    args: argparse.Namespace, store: str, notes: list[Any], readable: dict[Any, str], fmt: str
) -> int:
    from soulmem_torch.store import MemoryStore

    merge = MemoryStore(store).exists() and not args.replace
    mem = _open_memory(store, args) if merge else _new_memory(args)
    if merge:
        taken = {rid: mid for mid, rid in mem.readable_ids.items()}
        clash = [rid for mid, rid in readable.items() if taken.get(rid, mid) != mid]
        if clash:
            raise CLIError(
                f"{args.file}: readable id(s) {', '.join(clash[:5])} already name other notes "
                f"in {store}; import into another store or use --replace"
            )
    t0 = time.perf_counter()
    known = {e.note.id for e in mem.cluster}
    fresh = [n for n in notes if n.id not in known]
    embeddings = _embed_with_progress(fresh, mem.embedder, progress=_show_progress(args))
    mem.working_memory.add_nodes(fresh, embeddings)
    mem.readable_ids.update({mid: rid for mid, rid in readable.items() if mid not in known})
    if merge:
        from soulmem_torch.cli._store import save_new_notes

        manifest = save_new_notes(mem, store, fresh)
    else:  # a new store, or --replace: the whole memory (the old notes stay restorable)
        manifest = mem.save(store, overwrite=True)
    n_links = sum(len(n.mem_links) for n in notes)
    _emit(
        f"imported {len(notes)} notes ({n_links} links, {fmt} format) from {args.file} into "
        f"{store}: {len(fresh)} new, {len(notes) - len(fresh)} already present; the store now "
        f"holds {manifest['counts']['notes']} notes (version {manifest.get('version')}"
        f", {time.perf_counter() - t0:.2f} s)"
    )
    if manifest["counts"].get("pending_links"):
        _emit(
            f"note: {manifest['counts']['pending_links']} link(s) point to notes that are not in "
            "the store (kept as pending links)"
        )
    return EXIT_OK


def add_parser(sub: Any) -> None:
    """Registers ``soulmem import``."""
    common = common_parent()
    p = sub.add_parser(
        "import",
        parents=[common, embedder_parent()],
        help="embed a notes file (serde JSON / JSON Lines, or an evaluation graph) into a store",
        description="Reads Rust serde notes (JSON Lines, one note per line, or a JSON array) or "
        "an evaluation graph (docs/spec.md §9: readable string ids, no times), embeds them (--embedder; "
        "default: the store's own, else the offline hashing embedder) and saves them atomically "
        "into STORE (default: $SOULMEM_STORE, else ./soulmem_store). Graph imports keep their "
        "readable ids. An existing store is extended (notes already in it are skipped) unless "
        "--replace. Imports into one store at once are serialized by the store's lock; each "
        "extends the newest version.",
    )
    p.add_argument("file", metavar="FILE", help="the notes file to import")
    p.add_argument("store", metavar="STORE", nargs="?", help="store directory")
    p.add_argument(
        "--store",
        dest="store_opt",
        metavar="STORE",
        help="store directory (same as the positional STORE)",
    )
    p.add_argument(
        "--format",
        choices=["auto", "serde", "graph"],
        default="auto",
        help="input format (default auto: graph when ids are readable strings and "
        "notes have no create_time)",
    )
    p.add_argument(
        "--replace", action="store_true", help="replace the store's notes instead of adding to them"
    )
    p.add_argument(
        "--on-duplicate",
        choices=["reject", "first", "last"],
        default="reject",
        help="a note id given twice in FILE: reject the file naming both lines (default), or "
        "keep the first / last copy",
    )
    p.add_argument(
        "--names",
        metavar="NAMES",
        help='readable ids of serde notes, {"<note id>": "name"} (default: FILE.names.json '
        "beside FILE when present, as `soulmem export` writes it)",
    )
    p.set_defaults(func=cmd_import)
