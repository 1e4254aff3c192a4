"""``soulmem add``: write one note from flags, or serde notes from a file / stdin, into a store.

One note per call from flags — exactly one of ``--semantic TEXT`` (a concept),
``--situation NARRATIVE`` (an episode) or ``--action TEXT`` (a procedure) — with optional
``--tag``, a readable ``--name`` and one outgoing link (``--link-to ID`` plus ``--verb`` /
``--trigger PROB`` / ``--situation-link``). Or ``--notes FILE`` (``-`` = stdin): notes in the
Rust serde shape, one JSON object per line or a JSON array, exactly what ``soulmem export``
writes. The store is created when it does not exist yet; every note is embedded with the
store's embedder and saved atomically as a new version.

Errors: a malformed flag combination is a usage error (exit 2); an unknown ``--link-to``
target, a taken ``--name`` or a bad notes file is a runtime error (exit 1); either way one line
on stderr and nothing is written.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from soulmem_torch.cli._args import _non_negative_float, _rfc3339_arg, common_parent
from soulmem_torch.cli._errors import EXIT_OK, EXIT_USAGE, CLIError
from soulmem_torch.cli._memory import (
    _embed_with_progress,
    _kind,
    _label,
    _new_memory,
    _open_memory,
)
from soulmem_torch.cli._output import _clip, _emit, _show_progress
from soulmem_torch.cli._store import embedder_parent

_NAME = re.compile(r"^\S+$")
_HEX_PREFIX = re.compile(r"^[0-9a-fA-F-]{8,36}$")


def _unit_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], found {text!r}")
    return value


def _name_arg(text: str) -> str:
    if not _NAME.match(text):
        raise argparse.ArgumentTypeError(f"expected a name without spaces, found {text!r}")
    return text


def _text_arg(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a non-empty text")
    return text


def _participant_arg(text: str) -> tuple[str, str]:
    name, _, role = text.partition(":")
    if not name.strip():
        raise argparse.ArgumentTypeError(f"expected NAME or NAME:ROLE, found {text!r}")
    return name.strip(), role.strip()


# -------------------------------------------------------------------------------------------
# checking the flag combination (usage errors, before the store is touched)
# -------------------------------------------------------------------------------------------
_KIND_FLAGS = ("semantic", "situation", "action", "notes")
_ONLY = {
    "alias": "semantic",
    "description": "semantic",
    "abstract": "semantic",
    "location": "situation",
    "participant": "situation",
    "time": "situation",
    "action_type": "action",
}


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _check_flags(args: argparse.Namespace) -> str:
    """The kind chosen (``semantic`` / ``situation`` / ``action`` / ``notes``)."""
    chosen = [k for k in _KIND_FLAGS if getattr(args, k) is not None]
    if not chosen:
        raise CLIError(
            "give one note: --semantic TEXT, --situation NARRATIVE, --action TEXT, "
            "or --notes FILE (- for stdin)",
            EXIT_USAGE,
        )
    if len(chosen) > 1:
        raise CLIError(
            f"{' and '.join(_flag(k) for k in chosen)}: give one kind of note per call "
            "(several notes: --notes FILE)",
            EXIT_USAGE,
        )
    kind = chosen[0]
    for dest, owner in _ONLY.items():
        value = getattr(args, dest)
        if value not in (None, False, []) and owner != kind:
            raise CLIError(f"{_flag(dest)} only applies to {_flag(owner)} notes", EXIT_USAGE)
    if kind == "notes":
        for dest in ("tag", "name", "link_to"):
            if getattr(args, dest):
                raise CLIError(
                    f"{_flag(dest)} does not apply to --notes (the notes carry their own tags "
                    "and links)",
                    EXIT_USAGE,
                )
    link_kinds = [
        f
        for f, v in (
            ("--verb", args.verb),
            ("--trigger", args.trigger),
            ("--situation-link", args.situation_link),
        )
        if v is not None
    ]
    if args.link_to is None:
        for dest in ("verb", "trigger", "situation_link", "confidence", "intensity"):
            if getattr(args, dest) is not None:
                raise CLIError(f"{_flag(dest)} needs --link-to ID", EXIT_USAGE)
    else:
        if len(link_kinds) != 1:
            raise CLIError(
                "--link-to needs exactly one link kind: --verb VERB (a semantic link), "
                "--trigger PROB (this note triggers the action ID) or --situation-link "
                "to-abstract|to-specific"
                + (f"; found {' and '.join(link_kinds)}" if link_kinds else ""),
                EXIT_USAGE,
            )
        if args.confidence is not None and args.verb is None:
            raise CLIError("--confidence only applies to --verb links", EXIT_USAGE)
    return kind


# -------------------------------------------------------------------------------------------
# building the note
# -------------------------------------------------------------------------------------------
def _mem_type(args: argparse.Namespace, kind: str, now: Any) -> Any:
    from soulmem_torch.model import (
        Action,
        ActionType,
        ConceptType,
        Context,
        Location,
        Participant,
        ProcMemory,
        SemMemory,
        SpecificSituation,
    )

    if kind == "semantic":
        return SemMemory(
            content=args.semantic,
            aliases=list(args.alias),
            concept_type=ConceptType.ABSTRACT if args.abstract else ConceptType.ENTITY,
            description=args.description or "",
        )
    if kind == "situation":
        context = Context.new(
            location=None
            if args.location is None
            else Location(name=args.location, coordinates=""),
            participants=[Participant(name=n, role=r) for n, r in args.participant],
        )
        return SpecificSituation(
            narrative=args.situation,
            time_span=args.time if args.time is not None else now,
            context=context,
        )
    action_type = {"speak": ActionType.SPEAK, "think": ActionType.THINK, "skill": ActionType.SKILL}
    return ProcMemory(
        action=Action(content=args.action, action_type=action_type[args.action_type or "speak"])
    )


def _resolve_target(mem: Any, text: str, store: str) -> Any:
    """A note id from a readable id, a full UUID or a unique UUID prefix (>= 8 hex digits)."""
    by_name = {rid: mid for mid, rid in mem.readable_ids.items()}
    if text in by_name:
        return by_name[text]
    if _HEX_PREFIX.match(text):
        matches = [e.note.id for e in mem.cluster if str(e.note.id).startswith(text.lower())]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise CLIError(
                f"--link-to {text}: the prefix matches {len(matches)} notes in {store}; "
                "give more digits"
            )
    raise CLIError(
        f"--link-to {text}: no note in {store} has that readable id, id or id prefix "
        "(see `soulmem export STORE - --format graph` for the readable ids)"
    )


def _link_type(args: argparse.Namespace) -> Any:
    from soulmem_torch.model import (
        AbstractToSpecific,
        SemMemLink,
        SpecificToAbstract,
        TrigToAction,
    )

    if args.verb is not None:
        confidence = 1.0 if args.confidence is None else args.confidence
        return SemMemLink(verb=args.verb, confidence=confidence)
    if args.trigger is not None:
        return TrigToAction(prob=args.trigger)
    return AbstractToSpecific() if args.situation_link == "to-specific" else SpecificToAbstract()


def _notes_from_input(source: str, names: str | None = None) -> tuple[list[Any], dict[Any, str]]:
    """The notes of ``--notes`` and their readable ids (``--names``, else ``FILE.names.json``
    beside a notes file)."""
    from soulmem_torch.cli._memory import names_path, read_names
    from soulmem_torch.model.serde_io import parse_notes_text

    if source == "-":
        text = sys.stdin.read()
        name = "stdin"
    else:
        from soulmem_torch.cli._memory import _read_text

        text, name = _read_text(source, "--notes"), f"--notes {source}"
    if not text.strip():
        raise CLIError(f"{name}: no notes in it (expected serde JSON Lines or a JSON array)")
    notes = parse_notes_text(text, source=name)
    if names is not None:
        return notes, read_names(names, notes, required=True)
    return notes, ({} if source == "-" else read_names(names_path(source), notes))


# -------------------------------------------------------------------------------------------
# the command
# -------------------------------------------------------------------------------------------
def cmd_add(args: argparse.Namespace) -> int:
    """Adds one note (from flags) or serde notes (``--notes``) to a store."""
    kind = _check_flags(args)
    store = args.store
    p = Path(store)
    if p.exists() and not p.is_dir():
        raise CLIError(f"store {store}: exists and is not a directory")
    from soulmem_torch.store import MemoryStore

    notes: list[Any] = []
    names: dict[Any, str] = {}
    if kind == "notes":
        notes, names = _notes_from_input(args.notes, args.names)
    elif args.names is not None:
        raise CLIError("--names only applies to --notes", EXIT_USAGE)
    # read → add → write under the store's writer lock: concurrent adds / imports all land
    with MemoryStore(store).lock():
        return _add_locked(args, kind, store, notes, names)


def _add_locked(
    args: argparse.Namespace, kind: str, store: str, notes: list[Any], names: dict[Any, str]
) -> int:
    from soulmem_torch.model import MemoryLink, MemoryNote
    from soulmem_torch.model.timestamp import Timestamp
    from soulmem_torch.store import MemoryStore

    mem = _open_memory(store, args) if MemoryStore(store).exists() else _new_memory(args)
    if names:
        taken = {rid: mid for mid, rid in mem.readable_ids.items()}
        clash = sorted(rid for mid, rid in names.items() if taken.get(rid, mid) != mid)
        if clash:
            raise CLIError(
                f"--notes: readable id(s) {', '.join(clash[:5])} already name other notes in "
                f"{store}"
            )
    if kind != "notes":
        if args.name is not None and args.name in mem.readable_ids.values():
            raise CLIError(f"--name {args.name}: already names another note in {store}")
        now = Timestamp.now()
        note = MemoryNote.build(_mem_type(args, kind, now), tags=list(args.tag), create_time=now)
        if args.link_to is not None:
            target = _resolve_target(mem, args.link_to, store)
            intensity = 1.0 if args.intensity is None else args.intensity
            note.mem_links.append(
                MemoryLink.new(note.id, target, _link_type(args), intensity=intensity)
            )
        notes = [note]
        if args.name is not None:
            names[note.id] = args.name
    t0 = time.perf_counter()
    known = {e.note.id for e in mem.cluster}
    fresh = [n for n in notes if n.id not in known]
    embeddings = _embed_with_progress(fresh, mem.embedder, progress=_show_progress(args))
    mem.working_memory.add_nodes(fresh, embeddings)
    known_names = {mid: rid for mid, rid in names.items() if mid not in known}
    mem.readable_ids.update(known_names)
    version = None
    if fresh:
        from soulmem_torch.cli._store import save_new_notes

        version = save_new_notes(mem, store, fresh)["version"]
    rows = [
        {
            "id": str(n.id),
            "readable_id": mem.readable_ids.get(n.id),
            "kind": _kind(n),
            "label": _label(n, 10_000),
            "links": len(n.mem_links),
        }
        for n in fresh
    ]
    if args.json:
        out = {
            "added": rows,
            "skipped": [str(n.id) for n in notes if n.id in known],
            "store": store,
            "notes": len(mem),
            "version": version,
        }
        print(json.dumps(out, ensure_ascii=False, indent=2))
        return EXIT_OK
    for row in rows[:20]:
        who = row["readable_id"] or row["id"][:8]
        _emit(f"added {who} ({row['kind']}, {row['links']} link(s)): {_clip(row['label'], 60)}")
    if len(rows) > 20:
        _emit(f"… and {len(rows) - 20} more")
    skipped = len(notes) - len(fresh)
    if skipped:
        _emit(f"{skipped} note(s) already in {store}, skipped")
    if fresh:
        _emit(
            f"{store} now holds {len(mem)} notes (version {version}, "
            f"{time.perf_counter() - t0:.2f} s)"
        )
    else:
        _emit(f"nothing new; {store} was not rewritten")
    return EXIT_OK


_EPILOG = """\
examples:
  soulmem add STORE --semantic "osmanthus cake" --alias 桂花糕 --description "Grandma's recipe" \\
      --name sem_osmanthus --tag food
  soulmem add STORE --situation "Baked osmanthus cake with Grandma" --location "Grandma's kitchen" \\
      --participant 外婆:teacher --link-to sem_osmanthus --verb about
  soulmem add STORE --action "Offer a slice of osmanthus cake" --action-type speak
  soulmem export OLD - | soulmem add STORE --notes -

--link-to takes a readable id (as `soulmem query` shows them), a note id or a unique id prefix
of at least 8 hex digits. Link kinds: --verb VERB [--confidence C] (a semantic link, C default
1), --trigger PROB (this note triggers the action ID with probability PROB), --situation-link
to-abstract|to-specific; --intensity X (default 1) for any of them.
"""


def add_parser(sub: Any) -> None:
    """Registers ``soulmem add``."""
    p = sub.add_parser(
        "add",
        parents=[common_parent(), embedder_parent()],
        help="add a note (from flags, or serde JSON notes from a file / stdin) to a store",
        description="Adds one note from flags, or serde notes from --notes FILE (- for "
        "stdin), embeds it with the store's embedder and saves the store atomically (it is "
        "created when missing). Notes already in the store (same id) are skipped.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("store", metavar="STORE", help="store directory (created when missing)")
    kind = p.add_argument_group("the note (exactly one)")
    kind.add_argument("--semantic", type=_text_arg, metavar="TEXT", help="a concept")
    kind.add_argument("--situation", type=_text_arg, metavar="NARRATIVE", help="an episode")
    kind.add_argument("--action", type=_text_arg, metavar="TEXT", help="an action (procedure)")
    kind.add_argument(
        "--notes",
        metavar="FILE",
        help="serde notes (JSON Lines or a JSON array, as `soulmem export` writes); - = stdin",
    )
    sem = p.add_argument_group("--semantic options")
    sem.add_argument(
        "--alias", action="append", default=[], metavar="TEXT", help="another name (repeatable)"
    )
    sem.add_argument("--description", metavar="TEXT", help="what the concept is")
    sem.add_argument(
        "--abstract", action="store_true", help="an abstract idea (default: a concrete entity)"
    )
    sit = p.add_argument_group("--situation options")
    sit.add_argument("--location", metavar="NAME", help="where it happened")
    sit.add_argument(
        "--participant",
        action="append",
        default=[],
        type=_participant_arg,
        metavar="NAME[:ROLE]",
        help="who took part (repeatable)",
    )
    sit.add_argument(
        "--time",
        type=_rfc3339_arg,
        metavar="TIME",
        help="when it happened: RFC 3339 or 'now' (default now)",
    )
    act = p.add_argument_group("--action options")
    act.add_argument(
        "--action-type",
        choices=["speak", "think", "skill"],
        help="speak (default), think or skill",
    )
    common = p.add_argument_group("any note")
    common.add_argument(
        "--tag", action="append", default=[], metavar="TAG", help="a tag (repeatable)"
    )
    common.add_argument(
        "--name", type=_name_arg, metavar="NAME", help="a readable id, e.g. sem_osmanthus"
    )
    link = p.add_argument_group("one outgoing link")
    link.add_argument("--link-to", metavar="ID", help="the target note (see below)")
    link.add_argument("--verb", metavar="VERB", help="a semantic link with this verb")
    link.add_argument(
        "--confidence", type=_unit_float, metavar="C", help="semantic link confidence in [0, 1]"
    )
    link.add_argument(
        "--trigger",
        type=_unit_float,
        metavar="PROB",
        help="this note triggers the action ID with probability PROB in [0, 1]",
    )
    link.add_argument(
        "--situation-link",
        choices=["to-abstract", "to-specific"],
        help="a situation link (episode -> pattern, or pattern -> episode)",
    )
    link.add_argument(
        "--intensity", type=_non_negative_float, metavar="X", help="link intensity >= 0 (default 1)"
    )
    p.add_argument(
        "--names",
        metavar="NAMES",
        help='with --notes: the notes\' readable ids, {"<note id>": "name"} (default: '
        "FILE.names.json beside FILE when present, as `soulmem export` writes it)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.set_defaults(func=cmd_add)
