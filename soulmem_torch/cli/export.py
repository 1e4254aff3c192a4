"""``soulmem export``: a store's notes as serde JSON Lines or an evaluation graph."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from soulmem_torch.cli._args import common_parent
from soulmem_torch.cli._errors import EXIT_OK, CLIError
from soulmem_torch.cli._memory import _read_notes_file, names_json, names_path
from soulmem_torch.cli._output import _atomic_write, _info, _write_output


def cmd_export(args: argparse.Namespace) -> int:
    """Writes a store's notes as serde JSON Lines or as an evaluation graph."""
    from soulmem_torch.model.serde_io import dump_notes_json
    from soulmem_torch.model.soul_tune import dump_soul_tune_graph
    from soulmem_torch.store import MemoryStore

    p = Path(args.store)
    if p.is_file():
        notes, readable, _ = _read_notes_file(p)
    elif not p.exists():
        raise CLIError(f"store {args.store}: no such directory")
    else:
        contents = MemoryStore(p).load()
        notes, readable = contents.notes, contents.readable_ids
    if args.format == "graph":
        graph = dump_soul_tune_graph(notes, readable)
        text = json.dumps(graph, ensure_ascii=False, indent=2) + "\n"
    else:
        text = dump_notes_json(notes)
    _write_output(args, text.encode("utf-8"), f"exported {len(notes)} notes ({args.format} format)")
    if args.format == "serde" and readable:
        # serde notes have no field for readable ids: they go to a names file, read back by
        # `soulmem import FILE` / `soulmem add --notes FILE` (or --names)
        target = args.names or (None if args.file == "-" else str(names_path(args.file)))
        if target is not None:
            _atomic_write(target, names_json(readable, notes))
            _info(args, f"readable ids of {len(readable)} notes to {target}")
        else:
            _info(
                args,
                f"note: the {len(readable)} readable ids are not in serde JSON; "
                "--names FILE writes them",
            )
    elif args.names:
        _atomic_write(args.names, names_json(readable, notes))
    return EXIT_OK


def add_parser(sub: Any) -> None:
    """Registers ``soulmem export``."""
    common = common_parent()
    p = sub.add_parser(
        "export",
        parents=[common],
        help="write a store's notes as serde JSON Lines or an evaluation graph",
        description="serde: one note per line exactly as the Rust original writes it "
        "(byte-identical round trip); graph: the evaluation-graph format with readable ids "
        "(times and link ids are not part of that format). FILE '-' writes to stdout.",
    )
    p.add_argument("store", metavar="STORE", help="store directory (or a notes/graph file)")
    p.add_argument("file", metavar="FILE", help="output file, or - for stdout")
    p.add_argument(
        "--format",
        choices=["serde", "graph"],
        default="serde",
        help="output format (default serde)",
    )
    p.add_argument(
        "--names",
        metavar="NAMES",
        help="serde: write the readable ids to NAMES (default FILE.names.json beside FILE, when "
        "the store has readable ids; serde notes have no field for them)",
    )
    p.set_defaults(func=cmd_export)
