"""``soulmem schema``: the JSON Schema of a note."""

from __future__ import annotations

import argparse
import json
from typing import Any

from soulmem_torch.cli._args import common_parent
from soulmem_torch.cli._errors import EXIT_OK
from soulmem_torch.cli._output import _write_output


def cmd_schema(args: argparse.Namespace) -> int:
    """Writes the JSON Schema of one note (the Rust serde shape)."""
    from soulmem_torch.model import memory_note_json_schema

    text = json.dumps(memory_note_json_schema(), ensure_ascii=False, indent=2) + "\n"
    _write_output(args, text.encode("utf-8"), "wrote the MemoryNote JSON Schema")
    return EXIT_OK


def add_parser(sub: Any) -> None:
    """Registers ``soulmem schema``."""
    common = common_parent()
    p = sub.add_parser(
        "schema",
        parents=[common],
        help="write the JSON Schema of a note (the Rust serde shape)",
        description="The JSON Schema (draft 2020-12) of one MemoryNote as the Rust original "
        "serializes it: externally tagged enums, RFC 3339 times, UUID strings.",
    )
    p.add_argument("file", metavar="FILE", nargs="?", default="-", help="output file (default -)")
    p.set_defaults(func=cmd_schema)
