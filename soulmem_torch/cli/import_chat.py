"""``soulmem import-chat``: a chat history into a store (docs/spec.md §11)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from soulmem_torch.cli._args import common_parent
from soulmem_torch.cli._errors import EXIT_OK, CLIError
from soulmem_torch.cli._memory import _new_memory, _open_memory
from soulmem_torch.cli._output import _emit
from soulmem_torch.cli._store import embedder_parent
from soulmem_torch.errors import ValidationError


def read_chat_file(path: str, fmt: str) -> list[Any]:
    """The sessions of a chat file: ``jsonl`` (one turn per line), ``longmemeval`` (every
    question's haystack, each session once) or ``locomo`` (every conversation's sessions, ids
    prefixed with the sample id); ``auto`` picks by the file's start."""
    from soulmem_torch.chat import ChatSession, read_chat_jsonl, read_locomo, read_longmemeval

    p = Path(path)
    if not p.is_file():
        raise CLIError(f"{path}: no such file")
    if fmt == "auto":
        with p.open("rb") as fh:
            head = fh.read(4096).lstrip()
        if not head.startswith(b"["):
            fmt = "jsonl"
        elif b'"haystack_sessions"' in head or b'"question_id"' in head:
            fmt = "longmemeval"
        else:
            fmt = "locomo"
    try:
        if fmt == "jsonl":
            return read_chat_jsonl(p)
        if fmt == "longmemeval":
            seen: dict[str, Any] = {}
            for q in read_longmemeval(p):
                for s in q.sessions:
                    seen.setdefault(s.id, s)
            return list(seen.values())
        out = []
        for sample in read_locomo(p):
            for s in sample.sessions:
                out.append(ChatSession(f"{sample.sample_id}:{s.id}", s.time, s.turns))
        return out
    except ValidationError as exc:
        raise CLIError(str(exc)) from None


def cmd_import_chat(args: argparse.Namespace) -> int:
    """Reads a chat history, maps it onto notes, embeds them and saves them into a store."""
    from soulmem_torch.store import MemoryStore

    store = args.store
    if Path(store).exists() and not Path(store).is_dir():
        raise CLIError(f"store {store}: exists and is not a directory")
    sessions = read_chat_file(args.file, args.format)
    if not sessions:
        raise CLIError(f"{args.file}: no sessions in it")
    roles = args.roles.split(",") if args.roles else None
    t0 = time.perf_counter()
    with MemoryStore(store).lock():
        mem = _open_memory(store, args) if MemoryStore(store).exists() else _new_memory(args)
        before = len(mem)
        try:
            added = mem.add_sessions(sessions, level=args.level, roles=roles)
        except ValidationError as exc:
            raise CLIError(str(exc)) from None
        mem.save(store)
    turns = sum(len(s.turns) for s in sessions)
    _emit(
        f"imported {len(sessions)} sessions ({turns} turns) from {args.file} into {store}: "
        f"{added} new notes, the store now holds {before + added} notes "
        f"({time.perf_counter() - t0:.2f} s)"
    )
    return EXIT_OK


def add_parser(sub: Any) -> None:
    """Registers ``soulmem import-chat``."""
    p = sub.add_parser(
        "import-chat",
        parents=[common_parent(), embedder_parent()],
        help="a chat history (JSON Lines, LongMemEval or LoCoMo) into a store",
        description="Reads a chat history — JSON Lines (one turn per line: session, speaker, "
        "text, optional role / time / id / session_time), a LongMemEval file (every haystack "
        "session once) or a LoCoMo file — and adds it to STORE (created when missing): at "
        "--level turn every turn is a dated situation with its speaker, each session an "
        "episode linked to its turns, neighbouring turns linked and each speaker a concept; "
        "at --level session one situation per session. Every note keeps its session / turn "
        "id in its tags (chat:session=…, chat:turn=…).",
    )
    p.add_argument("file", metavar="FILE", help="the chat file")
    p.add_argument("store", metavar="STORE", help="store directory")
    p.add_argument(
        "--format",
        choices=["auto", "jsonl", "longmemeval", "locomo"],
        default="auto",
        help="input format (default auto: JSON Lines unless the file is a JSON array)",
    )
    p.add_argument(
        "--level", choices=["turn", "session"], default="turn", help="note per turn or per session"
    )
    p.add_argument(
        "--roles",
        metavar="ROLE[,ROLE]",
        help="keep only turns of these roles (e.g. user); default: every turn",
    )
    p.set_defaults(func=cmd_import_chat)
