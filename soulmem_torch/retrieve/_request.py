"""What every request shares: the memory it reads and the device it runs on."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

import torch

from soulmem_torch.errors import ValidationError
from soulmem_torch.retrieve._engine import batch_chunk_size, resolve_device

__all__ = ["graph_of", "run_grouped"]

R = TypeVar("R")
T = TypeVar("T")


def graph_of(memory: Any, device: torch.device | str | None) -> Any:
    """The ``MemoryGraph`` of a ``WorkingMemory`` / ``MemoryCluster`` / ``MemoryGraph`` on a device.

    Snapshots are cached by the cluster (rebuilt only when it changed).
    """
    dev = resolve_device(device)
    if hasattr(memory, "edge_index") and hasattr(memory, "index_of"):
        return memory.to(dev)
    graph = getattr(memory, "graph", None)
    if callable(graph):
        return graph(dev)
    raise ValidationError(
        "working_memory: expected a WorkingMemory, MemoryCluster or MemoryGraph, "
        f"found {type(memory).__name__}"
    )


def run_grouped(
    requests: Sequence[R],
    key: Callable[[R], Hashable],
    run: Callable[[list[R]], list[T]],
) -> list[T]:
    """Runs ``run`` once per group of requests sharing ``key`` and returns results in order.

    Groups of ``(request, MemoryGraph)`` pairs are run in chunks of
    :func:`~soulmem_torch.retrieve._engine.batch_chunk_size` requests (from the memory budget,
    env ``SOULMEM_MAX_BATCH_BYTES``), so every stage of ``run`` sees at most one chunk and a
    call's extra memory stays ``O(N x chunk)``. Queries never interact: the same notes in the
    same order for any chunk size (scores as for a batch of the chunk's size).
    """
    groups: dict[Hashable, list[int]] = {}
    for i, request in enumerate(requests):
        groups.setdefault(key(request), []).append(i)
    out: list[Any] = [None] * len(requests)
    for members in groups.values():
        step = _chunk_size(requests[members[0]], len(members))
        for start in range(0, len(members), step):
            chunk = members[start : start + step]
            results = run([requests[i] for i in chunk])
            for i, result in zip(chunk, results):
                out[i] = result
    return out


def _chunk_size(first: Any, batch: int) -> int:
    graph = first[1] if isinstance(first, tuple) and len(first) == 2 else None
    num_nodes = getattr(graph, "num_nodes", None)
    if num_nodes is None or batch <= 1:
        return max(batch, 1)
    return batch_chunk_size(int(num_nodes), batch)
