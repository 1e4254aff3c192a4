"""``soulmem``: the command line of soulmem_torch.

Commands (``soulmem COMMAND --help`` for every flag)::

    soulmem demo   [--days N] [--top N] [--window N] [--show N] [--device D]
    soulmem query  STORE [TEXT] [--file Q] [--config C] [--top N] [--json] [--device D]
    soulmem import FILE [STORE | --store STORE] [--format auto|serde|graph] [--replace]
    soulmem export STORE FILE [--format serde|graph]
    soulmem eval   SUITE.json [--graph PATH] [--config C] [--cases] [--json] [--device D]
    soulmem forget STORE (--now TIME | --days N) (--llm MOD:FUNC | --fake | --mask-only)
                   [--concurrency N] [--timeout S] [--dry-run] [--show N] [--json]

STORE is a store directory (:class:`~soulmem_torch.store.MemoryStore`); ``query`` and ``export``
also accept a notes file (serde JSON / JSON Lines, or an evaluation graph) in its place.

Exit status: 0 success; 1 a runtime error (missing or corrupt file, invalid config, failing
LLM, …); 2 a malformed command line; 130 interrupted. Every error is one line on stderr,
``soulmem COMMAND: error: …``; ``--debug`` re-raises it with its traceback instead.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import importlib.util
import inspect
import json
import logging
import os
import re
import sys
import time
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

__all__ = ["CLIError", "build_parser", "main"]

PROG = "soulmem"
EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


# -------------------------------------------------------------------------------------------
# errors
# -------------------------------------------------------------------------------------------
class CLIError(Exception):
    """An error to report as one line and an exit status (1 = runtime, 2 = usage)."""

    def __init__(self, message: str, code: int = EXIT_RUNTIME) -> None:
        super().__init__(message)
        self.code = code


class _UsageError(CLIError):
    def __init__(self, message: str, prog: str) -> None:
        super().__init__(message, EXIT_USAGE)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are raised (one line, exit 2), never printed + exited."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(message, self.prog)


def _one_line(text: str) -> str:
    """Folds a multi-line message (e.g. a list of bad graph nodes) into one line."""
    out = ""
    for part in (p.strip() for p in str(text).splitlines()):
        if part:
            out += part if not out else (" " if out.endswith(":") else "; ") + part
    return out or "(no message)"


def _describe_exception(exc: BaseException) -> tuple[str, int]:
    """``(message, exit status)`` for any exception that reaches the top level."""
    import pydantic

    if isinstance(exc, CLIError):
        return str(exc), exc.code
    if isinstance(exc, pydantic.ValidationError):
        from soulmem_torch.model._describe import describe_validation_error

        return f"invalid {exc.title}: {describe_validation_error(exc)}", EXIT_RUNTIME
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON: {exc}", EXIT_RUNTIME
    from soulmem_torch.errors import SoulMemError

    if isinstance(exc, SoulMemError):
        return str(exc), EXIT_RUNTIME
    if isinstance(exc, OSError):
        if exc.filename is not None and exc.strerror:
            return f"{exc.filename}: {exc.strerror}", EXIT_RUNTIME
        return str(exc) or type(exc).__name__, EXIT_RUNTIME
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text ({exc})", EXIT_RUNTIME
    return (
        f"unexpected {type(exc).__name__}: {exc} (run with --debug for the traceback)",
        EXIT_RUNTIME,
    )


# -------------------------------------------------------------------------------------------
# argument types (checked while parsing: a bad value is a usage error, exit 2)
# -------------------------------------------------------------------------------------------
_DEVICE = re.compile(r"^(cpu|cuda|auto|cuda:\d+)$")


def _device_arg(text: str) -> str:
    if not _DEVICE.match(text):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda, cuda:N or auto, found {text!r}")
    return text


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, found {text!r}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value >= 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, found {text!r}")
    return value


def _positive_float(text: str) -> float:
    value = _non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, found {text!r}")
    return value


def _rfc3339_arg(text: str) -> Any:
    """An RFC 3339 time (``2026-07-20T12:00:00Z``; an offset is converted to UTC) or ``now``."""
    from soulmem_torch.model.timestamp import Timestamp

    if text.strip().lower() == "now":
        return Timestamp.now()
    try:
        return Timestamp.parse(text.strip())
    except (ValueError, TypeError):
        raise argparse.ArgumentTypeError(
            f"expected an RFC 3339 time such as 2026-07-20T12:00:00Z (or 'now'), found {text!r}"
        ) from None


def _llm_spec_arg(text: str) -> str:
    module, sep, attr = text.rpartition(":")
    if not sep or not module or not attr:
        raise argparse.ArgumentTypeError(
            f"expected MODULE:FUNCTION (e.g. my_llm:complete or ./my_llm.py:complete), "
            f"found {text!r}"
        )
    return text


# -------------------------------------------------------------------------------------------
# terminal output: width-aware (CJK = 2 columns) clipping and aligned tables
# -------------------------------------------------------------------------------------------
def _char_width(ch: str) -> int:
    if unicodedata.combining(ch):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def _width(text: str) -> int:
    return sum(_char_width(ch) for ch in text)


def _clip(text: str, width: int) -> str:
    """One line of at most ``width`` display columns (whitespace collapsed, ``…`` when cut)."""
    text = " ".join(str(text).split())
    if _width(text) <= width:
        return text
    out, used = [], 0
    for ch in text:
        w = _char_width(ch)
        if used + w > width - 1:
            break
        out.append(ch)
        used += w
    return "".join(out) + "…"


def _pad(text: str, width: int, *, right: bool = False) -> str:
    gap = " " * max(0, width - _width(text))
    return gap + text if right else text + gap


def _table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    right: Sequence[int] = (),
    indent: str = "  ",
) -> list[str]:
    """Aligned plain-text rows; columns in ``right`` are right-aligned; no trailing blanks."""
    widths = [max(_width(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    lines = []
    for row in [headers, *rows]:
        cells = [_pad(str(c), w, right=i in right) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append((indent + "  ".join(cells)).rstrip())
    return lines


def _emit(lines: str | Sequence[str] = "") -> None:
    if isinstance(lines, str):
        lines = [lines]
    for line in lines:
        print(line)


def _show_progress(args: argparse.Namespace) -> bool:
    """Progress bars only on an interactive stderr and without ``--quiet``."""
    return not getattr(args, "quiet", False) and sys.stderr.isatty()


def _info(args: argparse.Namespace, message: str) -> None:
    """A status line on stderr (kept off stdout so ``--json`` output stays clean)."""
    if not getattr(args, "quiet", False):
        print(message, file=sys.stderr)


def _quiet_libraries(args: argparse.Namespace) -> None:
    """jieba logs its dictionary loading at DEBUG level on stderr; keep that for ``--debug``."""
    if getattr(args, "debug", False):
        return
    with contextlib.suppress(Exception):
        import jieba

        jieba.setLogLevel(logging.WARNING)


# -------------------------------------------------------------------------------------------
# shared helpers: devices, configs, notes, stores
# -------------------------------------------------------------------------------------------
def _resolve_device(name: str | None) -> str | None:
    if name is None or name == "cpu":
        return name
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not torch.cuda.is_available():
        raise CLIError(
            f"--device {name}: CUDA is not available on this machine "
            "(torch.cuda.is_available() is False); use --device cpu or --device auto"
        )
    index = int(name.split(":")[1]) if ":" in name else 0
    if index >= torch.cuda.device_count():
        raise CLIError(
            f"--device {name}: there are only {torch.cuda.device_count()} CUDA device(s)"
        )
    return name


def _read_text(path: str | Path, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CLIError(f"{what} {path}: no such file") from None
    except IsADirectoryError:
        raise CLIError(f"{what} {path}: is a directory, expected a file") from None
    except UnicodeDecodeError as exc:
        raise CLIError(f"{what} {path}: not UTF-8 text ({exc})") from None
    except OSError as exc:
        raise CLIError(f"{what} {path}: cannot read ({exc.strerror or exc})") from None


def _load_pipeline_config(path: str | None) -> Any:
    """A ``DefaultPipelineConfig`` from a JSON file (``None`` → ``None``: the defaults)."""
    if path is None:
        return None
    text = _read_text(path, "--config")
    import pydantic

    from soulmem_torch.model._describe import describe_validation_error
    from soulmem_torch.retrieve import DefaultPipelineConfig

    try:
        return DefaultPipelineConfig.model_validate_json(text)
    except pydantic.ValidationError as exc:
        raise CLIError(
            f"--config {path}: not a valid DefaultPipelineConfig: {describe_validation_error(exc)}"
        ) from None


def _detect_format(text: str, source: str) -> str:
    """``"graph"`` (readable string ids, no ``create_time``) or ``"serde"`` (Rust notes)."""
    stripped = text.lstrip()
    if not stripped:
        raise CLIError(f"{source}: the file is empty")
    if not stripped.startswith("["):
        return "serde"  # JSON Lines (or a single note object)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CLIError(f"{source}: not valid JSON ({exc})") from None
    items = [item for item in data if isinstance(item, dict)] if isinstance(data, list) else []
    if not items:
        raise CLIError(f"{source}: expected a JSON array of notes, found no objects in it")
    if any("create_time" in item for item in items):
        return "serde"
    return "graph"


def _read_notes_file(path: str | Path, fmt: str = "auto") -> tuple[list[Any], dict[Any, str], str]:
    """``(notes, readable_ids, format)`` from a serde JSON / JSON Lines or an evaluation graph."""
    from soulmem_torch.model.serde_io import parse_notes_text
    from soulmem_torch.model.soul_tune import parse_soul_tune_graph

    source = str(path)
    text = _read_text(path, "notes file")
    if fmt == "auto":
        fmt = _detect_format(text, source)
    if fmt == "graph":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CLIError(f"{source}: not valid JSON ({exc})") from None
        graph = parse_soul_tune_graph(data, source=source)
        return graph.notes, graph.readable_ids, fmt
    notes = parse_notes_text(text, source=source)
    return notes, {}, fmt


def _embed_with_progress(notes: Sequence[Any], embedder: Any, *, progress: bool) -> list[Any]:
    """``embed_notes`` in chunks, with a tqdm bar on long inputs."""
    from tqdm.auto import tqdm

    from soulmem_torch.embedding import embed_notes

    chunk = 256
    out: list[Any] = []
    with tqdm(
        total=len(notes), desc="embed", unit="note", disable=not progress, leave=False
    ) as bar:
        for start in range(0, len(notes), chunk):
            part = notes[start : start + chunk]
            out.extend(embed_notes(part, embedder))
            bar.update(len(part))
    return out


def _new_memory(**kwargs: Any) -> Any:
    from soulmem_torch.api import SoulMem

    return SoulMem(**kwargs)


def _open_memory(path: str, args: argparse.Namespace, **kwargs: Any) -> Any:
    """A ``SoulMem`` from a store directory, or from a notes / graph file (embedded now)."""
    p = Path(path)
    if not p.exists():
        raise CLIError(f"store {path}: no such directory")
    from soulmem_torch.api import SoulMem

    if p.is_file():
        notes, readable, _ = _read_notes_file(p)
        mem = SoulMem(**kwargs)
        embeddings = _embed_with_progress(notes, mem.embedder, progress=_show_progress(args))
        mem.working_memory.add_nodes(notes, embeddings)
        mem.readable_ids.update(readable)
        return mem
    return SoulMem.load(p, **kwargs)


def _kind(note: Any) -> str:
    from soulmem_torch.model import AbstractSituation, ProcMemory, SemMemory, SpecificSituation

    mt = note.mem_type
    if isinstance(mt, SemMemory):
        return "concept"
    if isinstance(mt, SpecificSituation):
        return "episode"
    if isinstance(mt, AbstractSituation):
        return "abstract"
    if isinstance(mt, ProcMemory):
        return "action"
    return type(mt).__name__  # pragma: no cover - the union is closed


def _label(note: Any, width: int = 200) -> str:
    from soulmem_torch.api import note_label
    from soulmem_torch.model import SemMemory

    mt = note.mem_type
    if isinstance(mt, SemMemory) and mt.description:
        return _clip(f"{mt.content} — {mt.description}", width)
    return _clip(note_label(note, width=10_000), width)


def _short_id(mem: Any, mid: Any) -> str:
    """The readable id when known, else the first 8 hex digits of the UUID."""
    rid = mem.readable_ids.get(mid)
    return rid if rid is not None else str(mid)[:8]


def _scored_rows(mem: Any, scored: Sequence[tuple[Any, float]], width: int) -> list[list[str]]:
    rows = []
    for rank, (mid, score) in enumerate(scored, start=1):
        entry = mem.cluster.get(mid)
        kind = _kind(entry.note) if entry is not None else "?"
        label = _label(entry.note, width) if entry is not None else ""
        rows.append([str(rank), _short_id(mem, mid), kind, f"{float(score):.3f}", label])
    return rows


def _scored_json(mem: Any, scored: Sequence[tuple[Any, float]]) -> list[dict[str, Any]]:
    out = []
    for rank, (mid, score) in enumerate(scored, start=1):
        entry = mem.cluster.get(mid)
        out.append(
            {
                "rank": rank,
                "id": str(mid),
                "readable_id": mem.readable_ids.get(mid),
                "kind": _kind(entry.note) if entry is not None else None,
                "label": _label(entry.note, 10_000) if entry is not None else None,
                "score": float(score),
            }
        )
    return out


def _describe_query(query: Any, width: int = 80) -> str:
    """A one-line summary of a structured query: ``Semantic: 林小满 / the café owner``."""
    parts = []
    for unit in query.units:
        values = []
        for value in unit.model_dump(mode="json").values():
            if isinstance(value, list):
                for v in value:
                    values.extend(str(x) for x in (v.values() if isinstance(v, dict) else [v]) if x)
            elif isinstance(value, dict):
                values.extend(str(x) for x in value.values() if x)
            elif value not in (None, ""):
                values.append(str(value))
        parts.append(" / ".join(values))
    return _clip(f"{query.kind}: " + "; ".join(parts), width)


def _print_window(result: Any, indent: str = "  ") -> None:
    """The short-term window (messages, oldest first) and its summary."""
    if not result.short_history and not result.short_mem:
        return
    _emit(f"{indent}short-term window ({len(result.short_history)} messages):")
    for msg in result.short_history:
        _emit(f"{indent}  [{msg.role}] {_clip(msg.text, 90)}")
    summary = result.short_mem or "(none yet)"
    _emit(f"{indent}  summary of earlier messages: {_clip(summary, 90)}")


def _newest_create_time(notes: Sequence[Any]) -> Any:
    from soulmem_torch.model.timestamp import Timestamp

    if not notes:
        return Timestamp.now()
    return max(n.create_time for n in notes)


def _days_after(start: Any, days: float) -> Any:
    """``start + days`` as a ``Timestamp`` (printed as RFC 3339)."""
    from soulmem_torch.model.timestamp import Timestamp

    return Timestamp.from_datetime(start + timedelta(days=days))


def _clip_pair(before: str, after: str, width: int) -> tuple[str, str]:
    """Both texts clipped to ``width`` columns, starting near their first difference (so a
    change late in a long narrative stays visible), with ``…`` where text was cut."""
    before, after = " ".join(before.split()), " ".join(after.split())
    same = 0
    for a, b in zip(before, after):
        if a != b:
            break
        same += 1
    start = max(0, same - 4) if _width(before[:same]) > width // 2 else 0
    if start:
        return _clip("…" + before[start:], width), _clip("…" + after[start:], width)
    return _clip(before, width), _clip(after, width)


def _changed_notes(mem: Any, report: Any) -> list[tuple[Any, Any, str]]:
    """``(note, action, text now)`` of every note whose text forgetting changed, in note order
    (a ``MaskOnly`` that masked no token changed nothing and is left out)."""
    from soulmem_torch.forget import MaskOnly, Revised

    out = []
    for entry in mem.cluster:
        action = report.actions.get(entry.note.id)
        if isinstance(action, Revised):
            after = action.new_summary
        elif isinstance(action, MaskOnly):
            after = action.masked_text
        else:
            continue
        if after != action.old_summary:
            out.append((entry.note, action, after))
    return out


def _forget_rows(
    mem: Any,
    report: Any,
    *,
    limit: int | None,
    width: int,
    order: Callable[[Any], Any] | None = None,
) -> tuple[list[list[str]], int]:
    """Rows ``note, kind, md, action, before → after`` of every changed note (note order, or
    sorted by ``order(note)``); ``MaskOnly!`` marks a note the LLM failed to reconstruct."""
    from soulmem_torch.forget import MaskOnly, Revised

    changed = _changed_notes(mem, report)
    if order is not None:
        changed.sort(key=lambda item: order(item[0]))
    rows = []
    for note, action, after in changed[: limit if limit is not None else len(changed)]:
        name = "Revised" if isinstance(action, Revised) else "MaskOnly"
        if isinstance(action, MaskOnly) and action.llm_error is not None:
            name = "MaskOnly!"
        shown_before, shown_after = _clip_pair(action.old_summary, after, width)
        rows.append(
            [
                _short_id(mem, note.id),
                _kind(note),
                f"{action.missing_degree:.2f}",
                name,
                f"{shown_before} → {shown_after}",
            ]
        )
    return rows, len(changed)


def _emit_forget_table(report: Any, rows: list[list[str]], n_changed: int) -> None:
    if rows:
        _emit(_table(["note", "kind", "md", "action", "before → after"], rows, right=(2,)))
    if n_changed > len(rows):
        _emit(f"  … and {n_changed - len(rows)} more changed notes (--show N to see more)")
    kept = report.mask_only + report.revised - n_changed
    if kept > 0:
        _emit(f"  ({kept} more note(s) were processed but kept their exact text)")


def _forget_json(mem: Any, report: Any, *, now: Any, saved: bool) -> dict[str, Any]:
    from soulmem_torch.forget import Revised

    changed = [
        {
            "id": str(note.id),
            "readable_id": mem.readable_ids.get(note.id),
            "kind": _kind(note),
            "action": type(action).__name__,
            "missing_degree": action.missing_degree,
            "masked_count": action.masked_count,
            "before": action.old_summary,
            "masked": action.masked_text,
            "after": after,
            "llm_error": None if isinstance(action, Revised) else action.llm_error,
        }
        for note, action, after in _changed_notes(mem, report)
    ]
    return {
        "now": str(now),
        "summary": report.summary(),
        "total": report.total,
        "eligible": report.eligible,
        "counts": report.counts,
        "reembedded": len(report.reembedded),
        "failures": [
            {
                "id": None if f.note_id is None else str(f.note_id),
                "stage": f.stage,
                "error": f.error,
            }
            for f in report.failures
        ],
        "changed": changed,
        "saved": saved,
    }


# -------------------------------------------------------------------------------------------
# LLM loading (forget --llm MODULE:FUNCTION)
# -------------------------------------------------------------------------------------------
def _load_llm(spec: str) -> Callable[[str, str], Any]:
    """Imports ``module:function`` (or ``path/to/file.py:function``); checks it is callable
    with ``(system, user)``."""
    module_name, _, attr = spec.rpartition(":")
    try:
        if module_name.endswith(".py") or os.sep in module_name or "/" in module_name:
            file = Path(module_name)
            if not file.is_file():
                raise CLIError(f"--llm {spec}: no such file {module_name!r}")
            name = f"_soulmem_llm_{abs(hash(str(file.resolve())))}"
            mod_spec = importlib.util.spec_from_file_location(name, file)
            if mod_spec is None or mod_spec.loader is None:
                raise CLIError(f"--llm {spec}: cannot load {module_name!r} as a Python module")
            module = importlib.util.module_from_spec(mod_spec)
            sys.modules[name] = module
            mod_spec.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path and "" not in sys.path:
                sys.path.insert(0, os.getcwd())  # as `python -m` does: modules next to you
            module = importlib.import_module(module_name)
    except CLIError:
        raise
    except ModuleNotFoundError as exc:
        raise CLIError(
            f"--llm {spec}: cannot import module {module_name!r} ({exc}); is it on PYTHONPATH?"
        ) from None
    except Exception as exc:  # the user's module raised while importing
        raise CLIError(
            f"--llm {spec}: importing {module_name!r} raised {type(exc).__name__}: {exc}"
        ) from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CLIError(
                f"--llm {spec}: module {module_name!r} has no attribute {attr!r}"
            ) from None
    if not callable(obj):
        raise CLIError(
            f"--llm {spec}: {attr!r} is a {type(obj).__name__}, not a callable "
            "(expected an async function (system, user) -> str)"
        )
    try:
        inspect.signature(obj).bind("system", "user")
    except TypeError as exc:
        raise CLIError(
            f"--llm {spec}: {attr!r} cannot be called as (system, user): {exc}"
        ) from None
    except ValueError:  # no signature available (some builtins): trust it
        pass
    return obj


# -------------------------------------------------------------------------------------------
# commands
# -------------------------------------------------------------------------------------------
_DEMO_CONVERSATION: tuple[tuple[str, str], ...] = (
    ("user", "早上好！今天店里忙吗？"),
    ("assistant", "Morning! The oat-milk delivery is late again, so it's a little hectic."),
    ("user", "Remind me what Grandma said about making 桂花糕?"),
    ("assistant", "外婆说：糖少放一点，心多放一点。"),
    ("user", "下午我还要去鸟类实验室，帮我记一下要带野外记录本。"),
    ("assistant", "Noted: bring the field notebook to the bird lab this afternoon."),
)


_KIND_PLURAL = {
    "concept": "concepts",
    "episode": "episodes",
    "abstract": "abstract situations",
    "action": "actions",
}


def cmd_demo(args: argparse.Namespace) -> int:
    """The bundled sample memory end to end: load, embed, talk, ask, forget."""
    t_start = time.perf_counter()
    _quiet_libraries(args)
    device = _resolve_device(args.device)

    from soulmem_torch.api import SoulMem
    from soulmem_torch.data import load_sample_queries, sample_memory_path
    from soulmem_torch.forget import FakeLLM
    from soulmem_torch.model.query import MemoryRetrieveQuery
    from soulmem_torch.retrieve import mix_by_priority
    from soulmem_torch.runtime import make_information

    rule = "-" * 78
    # 1. long-term memory: the sample graph, embedded offline ------------------------------
    t0 = time.perf_counter()
    mem = SoulMem.from_graph_file(
        sample_memory_path(), device=device, window_capacity=args.window, llm=FakeLLM()
    )
    kinds: dict[str, int] = {}
    for entry in mem.cluster:
        k = _kind(entry.note)
        kinds[k] = kinds.get(k, 0) + 1
    n_links = sum(len(e.note.mem_links) for e in mem.cluster)
    _emit("SoulMem demo — the sample memory of 林小满 (Xiaoman Lin), owner of 云朵咖啡馆")
    _emit("=" * 78)
    _emit(
        f"memory:  {len(mem)} notes ("
        + ", ".join(f"{v} {_KIND_PLURAL.get(k, k)}" for k, v in kinds.items())
        + f"), {n_links} links"
    )
    _emit(
        f"         embedded offline by {type(mem.embedder).__name__}"
        f"(dim={getattr(mem.embedder, 'dim', '?')}) in {time.perf_counter() - t0:.2f} s; "
        f"retrieval on {device or 'cpu'}"
    )

    # 2. short-term memory: a few chat messages through a small window --------------------
    async def talk() -> int:
        updates = 0
        for role, text in _DEMO_CONVERSATION:
            result = await mem.working_memory.push(make_information(text, role))
            updates += bool(result.summary_updated)
        return updates

    updates = asyncio.run(talk())
    _emit(
        f"chat:    {len(_DEMO_CONVERSATION)} messages pushed into a window of {args.window}; "
        "evicted ones are summarized"
    )
    _emit(
        f"         by the built-in FakeLLM ({updates} summary update{'' if updates == 1 else 's'})"
    )

    # 3. retrieval: every sub-query of the sample suite in ONE batch -----------------------
    suite = load_sample_queries()
    cases = suite["test_cases"]
    queries, priorities, owners = [], [], []
    for ci, case in enumerate(cases):
        for sq in case["sub_queries"]:
            queries.append(
                MemoryRetrieveQuery.model_validate({"tag": sq["tag"], "variant": sq["variant"]})
            )
            priorities.append(int(sq["priority"]))
            owners.append(ci)
    t0 = time.perf_counter()
    results = mem.query(queries, priorities=priorities)
    elapsed = time.perf_counter() - t0
    _emit()
    _emit(f"RETRIEVAL — the {len(queries)} structured queries of sample_queries.json")
    _emit(f"({len(cases)} cases), answered in one batch by the default pipeline in {elapsed:.2f} s")
    _emit(rule)
    hits = 0
    retrieved: list[Any] = []
    for ci, case in enumerate(cases):
        mine = [r for r, o in zip(results, owners) if o == ci]
        memory = mix_by_priority(
            [r.association for r in mine], [r.priority for r in mine], top_k=10
        )
        actions = mix_by_priority([r.action for r in mine], [r.priority for r in mine])
        retrieved.extend(mid for mid, _ in memory[: args.top])
        names = [_short_id(mem, mid) for mid, _ in memory]
        expected = case.get("expected_combined_ranking", [])
        rank = next((i for i, n in enumerate(names, 1) if n in expected), None)
        hits += rank is not None and rank <= 5
        found = f"{names[rank - 1]} at rank {rank}" if rank else "expected memory not in top 10"
        n_sub = f" · {len(mine)} sub-queries" if len(mine) > 1 else ""
        _emit(f"[{ci + 1:2d}/{len(cases)}] {case['name']}{n_sub} — expected {found}")
        _emit(f"        {_clip(case.get('description', ''), 70)}")
        _emit(
            _table(
                ["#", "memory", "kind", "score", "label"],
                _scored_rows(mem, memory[: args.top], 40),
                right=(0, 3),
                indent="        ",
            )
        )
        for mid, score in actions[:2]:
            entry = mem.cluster.get(mid)
            label = _label(entry.note, 44) if entry is not None else ""
            _emit(f"        → action {_short_id(mem, mid)} ({score:.2f}): {label}")
    _emit(f"{hits}/{len(cases)} cases have an expected memory in their top 5")
    _emit()
    _emit("SHORT-TERM MEMORY — what every pipeline result also carries")
    _emit(rule)
    _print_window(results[0], indent="")

    # 4. forgetting ---------------------------------------------------------------------------
    mem.working_memory.record_retrieval(retrieved, touch_notes=True)
    notes = [e.note for e in mem.cluster]
    now = _days_after(_newest_create_time(notes), args.days)
    _emit()
    _emit(f"FORGETTING — {args.days:g} simulated day(s) after the notes were written ({now})")
    _emit("notes recalled above decay more slowly (md = missing degree); the FakeLLM fills")
    _emit("masked words with placeholders, where a real LLM would reconstruct them")
    _emit(rule)
    report = asyncio.run(mem.forget(now=now, llm=FakeLLM(), progress=_show_progress(args)))
    _emit(report.summary())
    episodes_first = {"episode": 0, "concept": 1}
    rows, n_changed = _forget_rows(
        mem,
        report,
        limit=args.show,
        width=26,
        order=lambda note: episodes_first.get(_kind(note), 2),
    )
    _emit_forget_table(report, rows, n_changed)
    _emit()
    _emit(f"demo finished in {time.perf_counter() - t_start:.1f} s")
    return EXIT_OK


def _read_queries_file(path: str) -> list[tuple[str, Any, int]]:
    """Items ``("text", str, 0)`` or ``("query", MemoryRetrieveQuery, priority)``.

    Accepted: one text per line (blank lines and ``#`` comments skipped); or JSON — an array
    whose items are strings, ``MemoryRetrieveQuery`` objects ``{tag, variant}``,
    question.json-style sub-queries ``{priority, tag, variant}`` or ``{priority, query}``; a
    single such object; a test case ``{sub_queries: [...]}`` or a whole suite
    ``{test_cases: [...]}`` (every sub-query of every case); or JSON Lines of such items.
    """
    import pydantic

    from soulmem_torch.model._describe import describe_validation_error
    from soulmem_torch.model.query import MemoryRetrieveQuery

    text = _read_text(path, "--file")
    stripped = text.strip()
    if not stripped:
        raise CLIError(f"--file {path}: the file is empty")
    if stripped[0] not in "[{":
        lines = [ln.strip() for ln in text.splitlines()]
        return [("text", ln, 0) for ln in lines if ln and not ln.startswith("#")]
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        try:  # JSON Lines?
            data = [json.loads(ln) for ln in text.splitlines() if ln.strip()]
        except json.JSONDecodeError:
            raise CLIError(f"--file {path}: not valid JSON ({exc})") from None
    if isinstance(data, dict):
        if isinstance(data.get("test_cases"), list):
            data = [
                sq
                for case in data["test_cases"]
                if isinstance(case, dict)
                for sq in case.get("sub_queries", [])
            ]
        elif isinstance(data.get("sub_queries"), list):
            data = data["sub_queries"]
        else:
            data = [data]
    if not isinstance(data, list) or not data:
        raise CLIError(f"--file {path}: expected a non-empty JSON array of queries")
    out: list[tuple[str, Any, int]] = []
    for i, item in enumerate(data):
        if isinstance(item, str):
            if not item.strip():
                raise CLIError(f"--file {path}: item {i}: an empty text")
            out.append(("text", item, 0))
            continue
        if not isinstance(item, dict):
            raise CLIError(
                f"--file {path}: item {i}: expected a text or a query object, "
                f"found {type(item).__name__}"
            )
        priority = item.get("priority", 0)
        if isinstance(priority, bool) or not isinstance(priority, int) or priority < 0:
            raise CLIError(f"--file {path}: item {i}: priority must be an integer >= 0")
        body = item["query"] if isinstance(item.get("query"), dict) else item
        try:
            query = MemoryRetrieveQuery.model_validate(
                {"tag": body.get("tag", []), "variant": body.get("variant")}
            )
        except pydantic.ValidationError as exc:
            raise CLIError(
                f"--file {path}: item {i}: not a query: {describe_validation_error(exc)}"
            ) from None
        out.append(("query", query, priority))
    return out


def cmd_query(args: argparse.Namespace) -> int:
    """Answers texts and/or structured queries against a store, in one batch per kind."""
    if args.text is None and args.file is None:
        raise CLIError("give a TEXT to ask, or --file QUERIES", EXIT_USAGE)
    if args.text is not None and not args.text.strip():
        raise CLIError("TEXT: expected a non-empty text", EXIT_USAGE)
    items: list[tuple[str, Any, int]] = []
    if args.text is not None:
        items.append(("text", args.text, 0))
    if args.file is not None:
        items.extend(_read_queries_file(args.file))
    if not items:
        raise CLIError(f"--file {args.file}: no queries in it")
    config = _load_pipeline_config(args.config)
    device = _resolve_device(args.device)
    mem = _open_memory(args.store, args, device=device)

    texts = [(i, payload) for i, (kind, payload, _) in enumerate(items) if kind == "text"]
    structured = [(i, payload, p) for i, (kind, payload, p) in enumerate(items) if kind == "query"]
    answers: list[Any] = [None] * len(items)
    t0 = time.perf_counter()
    if texts:
        for (i, _), res in zip(texts, mem.ask([t for _, t in texts], config=config)):
            answers[i] = res
    if structured:
        results = mem.query(
            [q for _, q, _ in structured], config=config, priorities=[p for _, _, p in structured]
        )
        for (i, _, _), res in zip(structured, results):
            answers[i] = res
    elapsed = time.perf_counter() - t0

    if args.json:
        out = []
        for (kind, payload, priority), res in zip(items, answers):
            out.append(
                {
                    "query": payload if kind == "text" else json.loads(payload.to_json()),
                    "priority": priority,
                    "memories": _scored_json(mem, res.association[: args.top]),
                    "actions": _scored_json(mem, res.action),
                }
            )
        print(json.dumps(out, ensure_ascii=False, indent=2))
        return EXIT_OK
    _emit(
        f"{len(items)} quer{'y' if len(items) == 1 else 'ies'} against {len(mem)} notes "
        f"({args.store}) in {elapsed:.2f} s"
    )
    for n, ((kind, payload, priority), res) in enumerate(zip(items, answers), start=1):
        title = _clip(payload, 80) if kind == "text" else _describe_query(payload)
        extra = f"  (priority {priority})" if kind == "query" and priority else ""
        _emit()
        _emit(f"[{n}] {title}{extra}")
        if not res.association:
            _emit("  no memory found")
        else:
            rows = _scored_rows(mem, res.association[: args.top], 60)
            _emit(_table(["#", "memory", "kind", "score", "label"], rows, right=(0, 3)))
        if res.action:
            _emit("  recommended actions:")
            _emit(
                _table(
                    ["#", "action", "kind", "score", "label"],
                    _scored_rows(mem, res.action, 60),
                    right=(0, 3),
                    indent="    ",
                )
            )
    return EXIT_OK


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
    notes, readable, fmt = _read_notes_file(args.file, args.format)
    if not notes:
        raise CLIError(f"{args.file}: no notes in it")
    from soulmem_torch.store import MemoryStore

    merge = MemoryStore(store).exists() and not args.replace
    mem = _open_memory(store, args) if merge else _new_memory()
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
    manifest = mem.save(store)
    n_links = sum(len(n.mem_links) for n in notes)
    _emit(
        f"imported {len(notes)} notes ({n_links} links, {fmt} format) from {args.file} into "
        f"{store}: {len(fresh)} new, {len(notes) - len(fresh)} already present; the store now "
        f"holds {manifest['counts']['notes']} notes (version {MemoryStore(store).current_version()}"
        f", {time.perf_counter() - t0:.2f} s)"
    )
    if manifest["counts"].get("pending_links"):
        _emit(
            f"note: {manifest['counts']['pending_links']} link(s) point to notes that are not in "
            "the store (kept as pending links)"
        )
    return EXIT_OK


def _atomic_write(path: str, data: bytes) -> None:
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


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
    return EXIT_OK


def _write_output(args: argparse.Namespace, data: bytes, what: str) -> None:
    """Writes ``data`` to stdout (``args.file == "-"``) or atomically to ``args.file``."""
    if args.file == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    else:
        _atomic_write(args.file, data)
        _info(args, f"{what} to {args.file}")


def cmd_schema(args: argparse.Namespace) -> int:
    """Writes the JSON Schema of one note (the Rust serde shape)."""
    from soulmem_torch.model import memory_note_json_schema

    text = json.dumps(memory_note_json_schema(), ensure_ascii=False, indent=2) + "\n"
    _write_output(args, text.encode("utf-8"), "wrote the MemoryNote JSON Schema")
    return EXIT_OK


def cmd_eval(args: argparse.Namespace) -> int:
    """Runs a retrieval suite (question.json) and prints its metric table."""
    if not Path(args.suite).is_file():
        raise CLIError(f"suite {args.suite}: no such file")
    if args.graph is not None and not Path(args.graph).is_file():
        raise CLIError(f"--graph {args.graph}: no such file")
    from soulmem_torch.retrieve.evaluation import evaluate_suite_file, format_report

    config = _load_pipeline_config(args.config)
    device = _resolve_device(args.device)
    t0 = time.perf_counter()
    report = evaluate_suite_file(args.suite, graph_path=args.graph, pipeline=config, device=device)
    elapsed = time.perf_counter() - t0
    if args.json:
        out = {
            "suite": report.name,
            "cases": len(report.cases),
            "k_values": list(report.k_values),
            "summary": report.summary(),
            "per_case": [
                {
                    "name": c.name,
                    "passed": c.passed,
                    "combined": [[i, float(s)] for i, s in c.combined],
                    "action_hit": c.action_hit,
                    "mrr": c.combined_metrics.mrr,
                }
                for c in report.cases
            ],
            "elapsed_s": elapsed,
        }
        print(json.dumps(out, ensure_ascii=False, indent=2))
        return EXIT_OK
    _emit([line.rstrip() for line in format_report(report, per_case=args.cases).splitlines()])
    _info(args, f"({len(report.cases)} cases in {elapsed:.2f} s)")
    return EXIT_OK


def cmd_forget(args: argparse.Namespace) -> int:
    """Forgetting over a store: mask / reconstruct, re-embed, save back atomically."""
    store = Path(args.store)
    if not store.is_dir():
        raise CLIError(
            f"store {args.store}: "
            + ("no such directory" if not store.exists() else "not a store directory")
        )
    if args.llm is not None:
        llm: Any = _load_llm(args.llm)
        llm_name = args.llm
    elif args.fake:
        from soulmem_torch.forget import FakeLLM

        llm, llm_name = FakeLLM(), "the built-in FakeLLM"
    else:
        llm, llm_name = None, "no LLM (mask only)"
    _quiet_libraries(args)
    from soulmem_torch.api import SoulMem

    mem = SoulMem.load(store)
    notes = [e.note for e in mem.cluster]
    now = args.now if args.now is not None else _days_after(_newest_create_time(notes), args.days)
    _info(args, f"forgetting over {len(notes)} notes of {store} at {now} with {llm_name}")
    report = asyncio.run(
        mem.forget(
            now=now,
            llm=llm,
            progress=_show_progress(args),
            concurrency=args.concurrency,
            timeout=args.timeout,
        )
    )
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
    if not args.dry_run and changed:
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
    if args.dry_run:
        _emit("dry run: the store was not changed")
    elif saved:
        from soulmem_torch.store import MemoryStore

        _emit(f"saved {store} (version {MemoryStore(store).current_version()})")
    else:
        _emit("nothing changed; the store was not rewritten")
    return EXIT_OK


# -------------------------------------------------------------------------------------------
# parser
# -------------------------------------------------------------------------------------------
_EPILOG = """\
exit status: 0 ok, 1 runtime error (missing/corrupt file, bad config, failing LLM, ...),
2 malformed command line, 130 interrupted. Errors are one line on stderr; --debug shows
the traceback instead.
"""


def build_parser() -> argparse.ArgumentParser:
    """The ``soulmem`` argument parser (errors raise instead of exiting)."""
    from soulmem_torch import __version__

    common = _Parser(add_help=False)
    common.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="re-raise errors with their traceback",
    )
    common.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=argparse.SUPPRESS,
        help="no progress bars or status lines on stderr",
    )
    device = _Parser(add_help=False)
    device.add_argument(
        "--device",
        type=_device_arg,
        default="cpu",
        metavar="{cpu,cuda,auto}",
        help="where retrieval runs: cpu (default), cuda, cuda:N, or auto (cuda when available)",
    )
    config = _Parser(add_help=False)
    config.add_argument(
        "--config",
        metavar="FILE",
        help="a JSON DefaultPipelineConfig, e.g. "
        '{"similarity": {"similarity_threshold": 0.4}, "merge_top_k": 10}',
    )

    parser = _Parser(
        prog=PROG,
        description="SoulMem agent memory on PyTorch: import notes, ask questions, evaluate "
        "retrieval suites and run forgetting.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--debug", action="store_true", help="re-raise errors with tracebacks")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars on stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    p = sub.add_parser(
        "demo",
        parents=[common, device],
        help="run the bundled sample memory end to end (what `make demo` runs)",
        description="Loads the bundled sample memory (77 notes), embeds it with the offline "
        "hashing embedder, pushes a short chat into the working memory (FakeLLM summaries), "
        "answers every query of sample_queries.json in one batch, then ages the memory by "
        "--days simulated days and shows what forgetting masked and reconstructed.",
    )
    p.add_argument(
        "--days",
        type=_non_negative_float,
        default=1.0,
        help="simulated days after the notes' creation (default 1; 3 forgets most words)",
    )
    p.add_argument(
        "--top",
        type=_positive_int,
        metavar="N",
        default=3,
        help="memories shown per case (default 3)",
    )
    p.add_argument(
        "--window",
        type=_positive_int,
        metavar="N",
        default=4,
        help="short-term window capacity (default 4, so messages get evicted)",
    )
    p.add_argument(
        "--show",
        type=_positive_int,
        metavar="N",
        default=12,
        help="changed notes shown after forgetting (default 12)",
    )
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser(
        "query",
        parents=[common, device, config],
        help="ask a store: a text, or a file of texts / structured queries",
        description="Answers a free-text question (a concept query and an episode query, "
        "mixed) and/or every query of --file, in one batch, through the default pipeline. "
        "STORE is a store directory, or a notes / graph file (embedded on the fly).",
        epilog="--file accepts one text per line, or JSON: an array of texts, "
        "MemoryRetrieveQuery objects {tag, variant}, question.json sub-queries "
        "{priority, tag, variant}, a test case {sub_queries} or a whole suite {test_cases}.",
    )
    p.add_argument("store", metavar="STORE", help="store directory (or a notes/graph file)")
    p.add_argument("text", metavar="TEXT", nargs="?", help="a question in free text")
    p.add_argument("--file", metavar="QUERIES", help="a file of queries (see below)")
    p.add_argument(
        "--top",
        type=_positive_int,
        metavar="N",
        default=10,
        help="memories shown per query (default 10)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.set_defaults(func=cmd_query)

    p = sub.add_parser(
        "import",
        parents=[common],
        help="embed a notes file (serde JSON / JSON Lines, or an evaluation graph) into a store",
        description="Reads Rust serde notes (JSON Lines, one note per line, or a JSON array) or "
        "an evaluation graph (SPEC §9: readable string ids, no times), embeds them with the "
        "offline hashing embedder and saves them atomically into STORE (default: "
        "$SOULMEM_STORE, else ./soulmem_store). Graph imports keep their readable ids. An "
        "existing store is extended (notes already in it are skipped) unless --replace.",
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
    p.set_defaults(func=cmd_import)

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
    p.set_defaults(func=cmd_export)

    p = sub.add_parser(
        "schema",
        parents=[common],
        help="write the JSON Schema of a note (the Rust serde shape)",
        description="The JSON Schema (draft 2020-12) of one MemoryNote as the Rust original "
        "serializes it: externally tagged enums, RFC 3339 times, UUID strings.",
    )
    p.add_argument("file", metavar="FILE", nargs="?", default="-", help="output file (default -)")
    p.set_defaults(func=cmd_schema)

    p = sub.add_parser(
        "eval",
        parents=[common, device, config],
        help="run a retrieval suite (question.json) and print its metrics",
        description="Loads the suite and its graph (graph_path, relative to the suite, or "
        "--graph), embeds it, runs every sub-query in one batch and prints MRR, hit rate and "
        "recall / precision / nDCG at each k, per sub-query and combined.",
    )
    p.add_argument("suite", metavar="SUITE.json", help="the suite file")
    p.add_argument("--graph", metavar="PATH", help="graph file (overrides graph_path)")
    p.add_argument("--cases", action="store_true", help="also one line per case")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser(
        "forget",
        parents=[common],
        help="run forgetting over a store (mask, reconstruct with an LLM, re-embed, save)",
        description="Decays every note by the Ebbinghaus curve at the given time, masks "
        "forgotten words, asks the LLM to reconstruct heavily masked text, re-embeds the "
        "changed notes and saves the store back atomically (unless --dry-run). If every LLM "
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
        help="seconds one LLM call may take (default: no limit)",
    )
    p.add_argument("--dry-run", action="store_true", help="report only; do not save")
    p.add_argument(
        "--show",
        type=_positive_int,
        metavar="N",
        default=20,
        help="changed notes listed (default 20)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable report on stdout")
    p.set_defaults(func=cmd_forget)
    return parser


# -------------------------------------------------------------------------------------------
# entry point
# -------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _utf8_stdio() -> Iterator[None]:
    """Chinese text must not crash on a non-UTF-8 console: replace what cannot be encoded."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(errors="replace")  # type: ignore[union-attr]
    yield


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one command; returns the exit status (never raises, except with ``--debug``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    with _utf8_stdio():
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except _UsageError as exc:
            print(
                f"{exc.prog}: error: {_one_line(str(exc))} (see '{exc.prog} --help')",
                file=sys.stderr,
            )
            return EXIT_USAGE
        except SystemExit as exc:  # --help / --version
            return exc.code if isinstance(exc.code, int) else EXIT_OK
        prog = f"{PROG} {args.command}"
        try:
            return int(args.func(args) or EXIT_OK)
        except KeyboardInterrupt:
            print(f"{prog}: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        except BrokenPipeError:  # e.g. `soulmem export STORE - | head`
            with contextlib.suppress(OSError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
            return EXIT_OK
        except Exception as exc:
            if getattr(args, "debug", False):
                raise
            message, code = _describe_exception(exc)
            print(f"{prog}: error: {_one_line(message)}", file=sys.stderr)
            return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
