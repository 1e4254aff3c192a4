"""Shared helpers: devices, configs, notes files, opening memories, labelling notes."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from soulmem_torch.cli._errors import CLIError
from soulmem_torch.cli._output import _clip, _emit, _show_progress, progress_bar


def _resolve_device(name: str | None) -> Any:
    """``--device`` as a ``torch.device``: the package's one resolver
    (:func:`soulmem_torch.device.resolve_device`; a CUDA device on a machine without one, or
    past its device count, is a one-line error naming ``--device``), imported here so that
    only the commands that run retrieval load torch."""
    from soulmem_torch.device import resolve_device

    return resolve_device(name, what="--device")


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

    from soulmem_torch.model.describe import describe_validation_error
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


def _read_notes_file(
    path: str | Path,
    fmt: str = "auto",
    *,
    on_duplicate: str = "reject",
    names: str | Path | None = None,
) -> tuple[list[Any], dict[Any, str], str]:
    """``(notes, readable_ids, format)`` from a serde JSON / JSON Lines or an evaluation graph.

    A serde file's readable ids come from ``names`` (a names file), else from
    ``FILE.names.json`` beside it when there is one (``soulmem export`` writes it).

    ``on_duplicate`` (serde files): a note id given twice is an error naming both lines
    (``reject``) or keeps the ``first`` / ``last`` copy; a graph's readable ids must be unique.
    """
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
    notes = parse_notes_text(text, source=source, on_duplicate=on_duplicate)
    if names is not None:
        return notes, read_names(names, notes, required=True), fmt
    return notes, read_names(names_path(path), notes), fmt


NAMES_SUFFIX = ".names.json"


def names_path(notes_file: str | Path) -> Path:
    """The readable-ids file beside a serde notes file: ``FILE.names.json``."""
    return Path(str(notes_file) + NAMES_SUFFIX)


def read_names(path: str | Path, notes: Sequence[Any], *, required: bool = False) -> dict[Any, str]:
    """Readable ids ``{note id: name}`` from a names file (``{"<uuid>": "name", ...}``), for the
    given notes only; ``{}`` when the file is absent (unless ``required``)."""
    p = Path(path)
    if not p.exists():
        if required:
            raise CLIError(f"--names {path}: no such file")
        return {}
    text = _read_text(p, "names file")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CLIError(f"names file {path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in data.items()
    ):
        raise CLIError(f'names file {path}: expected a JSON object {{"<note id>": "name", ...}}')
    ids = {str(n.id): n.id for n in notes}
    out = {ids[k]: v for k, v in data.items() if k in ids}
    taken: dict[str, Any] = {}
    for mid, name in out.items():
        if name in taken:
            raise CLIError(f"names file {path}: {name!r} names two notes ({taken[name]}, {mid})")
        taken[name] = mid
    return out


def names_json(readable: dict[Any, str], notes: Sequence[Any]) -> bytes:
    """The names file of ``notes`` (their readable ids, in note order)."""
    data = {str(n.id): readable[n.id] for n in notes if n.id in readable}
    return (json.dumps(data, ensure_ascii=False, indent=1) + "\n").encode("utf-8")


def _embed_with_progress(notes: Sequence[Any], embedder: Any, *, progress: bool) -> list[Any]:
    """``embed_notes`` in chunks, with a progress bar (on an interactive stderr)."""
    from soulmem_torch.embedding import embed_notes

    chunk = 256
    out: list[Any] = []
    with progress_bar(len(notes), "embed", "notes", enabled=progress) as bar:
        for start in range(0, len(notes), chunk):
            part = notes[start : start + chunk]
            out.extend(embed_notes(part, embedder))
            bar.update(len(part))
    return out


def _new_memory(args: argparse.Namespace | None = None, **kwargs: Any) -> Any:
    """An empty memory with ``--embedder`` (default hashing), recorded when it is saved."""
    from soulmem_torch.cli._store import new_store_memory

    return new_store_memory(args or argparse.Namespace(), None, **kwargs)


def _open_memory(path: str, args: argparse.Namespace, **kwargs: Any) -> Any:
    """A ``SoulMem`` from a store directory, or from a notes / graph file (embedded now)."""
    p = Path(path)
    if not p.exists():
        raise CLIError(f"store {path}: no such directory")
    from soulmem_torch.cli._store import load_store_memory

    if p.is_file():
        notes, readable, _ = _read_notes_file(p)
        mem = _new_memory(args, **kwargs)
        embeddings = _embed_with_progress(notes, mem.embedder, progress=_show_progress(args))
        mem.working_memory.add_nodes(notes, embeddings)
        mem.readable_ids.update(readable)
        return mem
    return load_store_memory(args, p, **kwargs)


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
    from soulmem_torch.model import SemMemory
    from soulmem_torch.model.label import note_label

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
