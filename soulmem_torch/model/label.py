"""A note's one-line human label: what ``SoulMem.describe``, the command line, the server's
agent routes and consolidation's prompts show of a note."""

from __future__ import annotations

from soulmem_torch.model.notes import (
    AbstractSituation,
    MemoryNote,
    ProcMemory,
    SemMemory,
    SpecificSituation,
)

__all__ = ["note_label"]


def note_label(note: MemoryNote, *, width: int = 60) -> str:
    """A one-line human label of a note (its name / narrative / action), cut to ``width``
    characters (the last one then ``…``)."""
    mt = note.mem_type
    if isinstance(mt, SemMemory):
        text = mt.content
    elif isinstance(mt, SpecificSituation):
        text = mt.narrative
    elif isinstance(mt, AbstractSituation):
        leaf = mt.leaf
        text = (
            getattr(leaf, "name", None)
            or getattr(leaf, "action", None)
            or getattr(leaf, "atmosphere", "")
        )
        text = f"{mt.kind}: {text}"
    elif isinstance(mt, ProcMemory):
        text = f"{mt.action.action_type.value}: {mt.action.content}"
    else:  # pragma: no cover - the union is closed
        text = str(mt)
    return text if len(text) <= width else text[: width - 1] + "…"
