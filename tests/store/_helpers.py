"""Small notes and stores shared by the store tests."""

from __future__ import annotations

from datetime import datetime, timezone

from soulmem_torch.model import MemoryId, MemoryNote, SemMemory

T0 = datetime(2026, 3, 1, 9, 30, tzinfo=timezone.utc)


def note(i: int, *, text: str | None = None) -> MemoryNote:
    """A semantic note with a deterministic id (``i`` → the same id every time)."""
    return MemoryNote.build(
        SemMemory(
            content=text or f"concept {i} 概念{i}",
            aliases=[f"alias {i}"],
            concept_type="Entity",
            description=f"description of concept number {i}",
        ),
        id=MemoryId(f"00000000-0000-4000-8000-{i:012d}"),
        tags=[f"t{i % 3}"],
        create_time=T0,
    )


def notes(start: int, stop: int) -> list[MemoryNote]:
    return [note(i) for i in range(start, stop)]
