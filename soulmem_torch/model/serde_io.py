"""Reading and writing many notes in the Rust serde shape, and the JSON Schema for users."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pydantic

from soulmem_torch.errors import ValidationError
from soulmem_torch.model.describe import describe_validation_error
from soulmem_torch.model.notes import MemoryNote

__all__ = ["dump_notes_json", "load_notes_json", "memory_note_json_schema", "parse_notes_text"]


def memory_note_json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of one ``MemoryNote`` in the serde shape."""
    schema = MemoryNote.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


DUPLICATE_POLICIES = ("reject", "first", "last")
"""What :func:`parse_notes_text` does with a note id that appears twice in one file."""


def parse_notes_text(
    text: str, *, source: str = "<text>", on_duplicate: str = "reject"
) -> list[MemoryNote]:
    """Parses notes from a JSON array or JSON Lines (one note per line).

    Args:
        text: a JSON array of notes, or one note per line (blank lines are skipped).
        source: names the input in error messages.
        on_duplicate: a note id that appears more than once: ``"reject"`` (default: an error
            naming both lines / items), ``"first"`` (keep the first, drop the later ones) or
            ``"last"`` (keep the last, at the position of the first).

    Raises:
        ValidationError: naming the line / array index and field of every bad note, or both
            places of a duplicate id.
    """
    if on_duplicate not in DUPLICATE_POLICIES:
        raise ValidationError(
            f"on_duplicate: expected one of {', '.join(DUPLICATE_POLICIES)}, found {on_duplicate!r}"
        )
    stripped = text.lstrip()
    notes: list[MemoryNote] = []
    places: list[str] = []
    problems: list[str] = []
    if stripped.startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValidationError(f"{source}: not valid JSON: {exc}") from None
        for i, item in enumerate(items):
            try:
                notes.append(MemoryNote.model_validate(item))
                places.append(f"item {i}")
            except pydantic.ValidationError as exc:
                problems.append(f"item {i}: {describe_validation_error(exc)}")
    else:
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                notes.append(MemoryNote.model_validate_json(line))
                places.append(f"line {lineno}")
            except pydantic.ValidationError as exc:
                problems.append(f"line {lineno}: {describe_validation_error(exc)}")
    if problems:
        raise ValidationError(f"{source}: {len(problems)} bad note(s): " + " | ".join(problems))
    first: dict[Any, int] = {}
    duplicates: list[str] = []
    for i, note in enumerate(notes):
        j = first.setdefault(note.id, i)
        if j != i:
            duplicates.append(f"{places[i]} repeats note id {note.id} of {places[j]}")
    if duplicates and on_duplicate == "reject":
        more = f" (and {len(duplicates) - 3} more)" if len(duplicates) > 3 else ""
        raise ValidationError(
            f"{source}: {len(duplicates)} duplicate note id(s): "
            + "; ".join(duplicates[:3])
            + more
            + " — remove them, or choose which copy to keep (on_duplicate='first' or 'last', "
            "on the command line --on-duplicate first|last)"
        )
    if duplicates:
        keep = {}
        for note in notes if on_duplicate == "last" else reversed(notes):
            keep[note.id] = note
        notes = [keep[mid] for mid in first]
    return notes


def load_notes_json(path: str | Path, *, on_duplicate: str = "reject") -> list[MemoryNote]:
    """Loads notes from a JSON Lines file or a JSON array file (Rust serde shape)."""
    path = Path(path)
    return parse_notes_text(
        path.read_text(encoding="utf-8"), source=str(path), on_duplicate=on_duplicate
    )


def dump_notes_json(notes: Iterable[MemoryNote], path: str | Path | None = None) -> str:
    """Writes notes as JSON Lines in the exact serde layout; returns the text."""
    text = "".join(note.to_json() + "\n" for note in notes)
    if path is not None:
        Path(path).write_text(text, encoding="utf-8")
    return text
