"""``ShortOnly``: the short-term window and its summary (docs/spec.md §7)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from soulmem_torch.errors import ValidationError
from soulmem_torch.retrieve.requests import ShortOnlyRequest

__all__ = ["RetrShortOnly", "ShortOnlyRequest"]

if TYPE_CHECKING:
    from soulmem_torch.retrieve._types import MemorySource


def _window(memory: MemorySource) -> Any:
    if memory is None:
        raise ValidationError("working_memory: expected a WorkingMemory, found None")
    return getattr(memory, "sliding_window", None)


class RetrShortOnly:
    """``RetrShortOnly().retrieve(request) -> (messages, summary)``.

    ``clipping_length`` keeps the last N messages (None → all). **DECISION:** the summary is
    returned only when ``include_summary`` is true (else ``""``); the original always returns it.
    A memory without a short-term window (a bare ``MemoryCluster`` or ``MemoryGraph``) gives
    ``([], "")``.
    """

    def retrieve(self, request: ShortOnlyRequest) -> tuple[list[Any], str]:
        """One request: ``(messages, summary)`` — the window's messages (the last
        ``clipping_length`` when set) and its summary (``""`` unless ``include_summary``)."""
        window = _window(request.working_memory)
        if window is None:
            return [], ""
        messages = list(window.messages())
        n = request.config.clipping_length
        if n is not None:
            messages = messages[len(messages) - n :] if n > 0 else []
        summary = window.summary if request.config.include_summary else ""
        return messages, summary or ""

    def retrieve_batch(self, requests: Sequence[ShortOnlyRequest]) -> list[tuple[list[Any], str]]:
        """One ``(messages, summary)`` per request, in request order."""
        return [self.retrieve(r) for r in requests]
