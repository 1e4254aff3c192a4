"""Types the strategies accept (imported only for type checking, so nothing here costs at run time).

``MemorySource``: what a request reads — a :class:`~soulmem_torch.runtime.WorkingMemory`, its
:class:`~soulmem_torch.runtime.MemoryCluster`, or a bare
:class:`~soulmem_torch.graph.MemoryGraph` snapshot (no notes: no short-term window, string or
text channel).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:
    from soulmem_torch.graph import MemoryGraph
    from soulmem_torch.runtime import MemoryCluster, WorkingMemory

__all__ = ["MemorySource"]

MemorySource = Union["WorkingMemory", "MemoryCluster", "MemoryGraph"]
"""A working memory, a memory cluster or a graph snapshot."""
