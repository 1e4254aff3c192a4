"""Reading and writing many notes in the Rust serde shape, and the JSON Schema for users."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pydantic

from soulmem_torch.errors import ValidationError
from soulmem_torch.model._describe import describe_validation_error
from soulmem_torch.model.notes import MemoryNote

__all__ = ["dump_notes_json", "load_notes_json", "memory_note_json_schema", "parse_notes_text"]


def memory_note_json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of one ``MemoryNote`` in the serde shape."""
    schema = MemoryNote.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema



def parse_notes_text(text: str, *, source: str = "<text>") -> list[MemoryNote]:
    """Parses notes from a JSON array or JSON Lines (one note per line).

    Raises:
        ValidationError: naming the line / array index and field of every bad note.
    """
    stripped = text.lstrip()
    notes: list[MemoryNote] = []
    problems: list[str] = []
    if stripped.startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValidationError(f"{source}: not valid JSON: {exc}") from None
        for i, item in enumerate(items):
            try:
                notes.append(MemoryNote.model_validate(item))
            except pydantic.ValidationError as exc:
                problems.append(f"item {i}: {describe_validation_error(exc)}")
    else:
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                notes.append(MemoryNote.model_validate_json(line))
            except pydantic.ValidationError as exc:
                problems.append(f"line {lineno}: {describe_validation_error(exc)}")
    if problems:
        raise ValidationError(f"{source}: {len(problems)} bad note(s): " + " | ".join(problems))
    return notes


def load_notes_json(path: str | Path) -> list[MemoryNote]:
    """Loads notes from a JSON Lines file or a JSON array file (Rust serde shape)."""
    path = Path(path)
    return parse_notes_text(path.read_text(encoding="utf-8"), source=str(path))


def dump_notes_json(notes: Iterable[MemoryNote], path: str | Path | None = None) -> str:
    """Writes notes as JSON Lines in the exact serde layout; returns the text."""
    text = "".join(note.to_json() + "\n" for note in notes)
    if path is not None:
        Path(path).write_text(text, encoding="utf-8")
    return text
