"""One agent of a :class:`~soulmem_torch.bank.MemoryBank`: a ``SoulMem`` (note-backed) or a bare
``MemoryGraph`` (tensor-built). Shared by the bank and its persistence (``_persist.py``)."""

from __future__ import annotations

from typing import Any

__all__ = ["Agent"]


class Agent:
    """One agent: a ``SoulMem`` (``mem``, note-backed) or a bare ``MemoryGraph`` (``graph``)."""

    __slots__ = ("graph", "mem")

    def __init__(self, mem: Any = None, graph: Any = None) -> None:
        self.mem = mem
        self.graph = graph

    def snapshot(self) -> Any:
        """The agent's current ``MemoryGraph`` snapshot."""
        if self.mem is not None:
            return self.mem.working_memory.graph()
        return self.graph
