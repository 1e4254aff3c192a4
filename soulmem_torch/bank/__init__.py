"""Many agents at once: ``MemoryBank`` (one disjoint-union snapshot), ``BatchingRetriever``
(asyncio micro-batching), ``ShardedMemoryBank`` (agents spread over ``torch.distributed``
ranks) and the HTTP app of ``soulmem serve``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["BatchingRetriever", "MemoryBank", "ShardedMemoryBank"]

_LAZY = {
    "MemoryBank": "soulmem_torch.bank.bank",
    "BatchingRetriever": "soulmem_torch.bank.batching",
    "ShardedMemoryBank": "soulmem_torch.bank.sharded",
}

if TYPE_CHECKING:
    from soulmem_torch.bank.bank import MemoryBank
    from soulmem_torch.bank.batching import BatchingRetriever
    from soulmem_torch.bank.sharded import ShardedMemoryBank


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'soulmem_torch.bank' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
