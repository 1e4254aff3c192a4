"""Small memories for the consolidation tests."""

from __future__ import annotations

from soulmem_torch import SoulMem
from soulmem_torch.model import (
    MemoryLink,
    MemoryNote,
    SemMemLink,
    SemMemory,
)


def sem(text: str) -> MemoryNote:
    return MemoryNote.build(
        SemMemory(content=text, aliases=[], concept_type="Entity", description="")
    )


def linked_pair(value: float = 0.4) -> tuple[SoulMem, MemoryNote, MemoryNote]:
    """Two concepts, ``a -> b`` by a Sem link of intensity and confidence ``value``."""
    a, b = sem("a"), sem("b")
    a.mem_links.append(
        MemoryLink.new(a.id, b.id, SemMemLink(verb="knows", confidence=value), intensity=value)
    )
    return SoulMem.from_notes([a, b]), a, b
