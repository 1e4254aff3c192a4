"""How a batch of requests is cut: groups that share a memory and a config, chunks that fit the
memory budget (env ``SOULMEM_MAX_BATCH_BYTES``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

from soulmem_torch.errors import ValidationError

__all__ = [
    "BATCH_BYTES_PER_NOTE",
    "DEFAULT_MAX_BATCH_BYTES",
    "batch_chunk_size",
    "max_batch_bytes",
    "run_grouped",
]

R = TypeVar("R")
T = TypeVar("T")

DEFAULT_MAX_BATCH_BYTES: int = 512 * 2**20
"""Working-memory budget of one batched call (512 MiB) unless ``SOULMEM_MAX_BATCH_BYTES`` says
otherwise: the strategies split a large batch into chunks that fit it (see
:func:`batch_chunk_size`)."""
BATCH_BYTES_PER_NOTE: int = 192
"""Bytes one query needs per note while a strategy runs (about 24 float64 ``(N,)`` columns:
personalization, iterates, scores, masks and top-k buffers of every stage)."""


def max_batch_bytes() -> int:
    """The batch memory budget: env ``SOULMEM_MAX_BATCH_BYTES`` (an integer number of bytes,
    > 0), else :data:`DEFAULT_MAX_BATCH_BYTES`.

    Raises:
        ValidationError: the variable is set but not a positive integer.
    """
    raw = os.environ.get("SOULMEM_MAX_BATCH_BYTES")
    if raw is None or not raw.strip():
        return DEFAULT_MAX_BATCH_BYTES
    try:
        value = int(raw.strip().replace("_", ""))
    except ValueError:
        value = 0
    if value <= 0:
        raise ValidationError(
            f"SOULMEM_MAX_BATCH_BYTES: expected a positive integer number of bytes, found {raw!r}"
        )
    return value


def batch_chunk_size(num_nodes: int, batch: int, *, budget: int | None = None) -> int:
    """How many of ``batch`` queries on a ``num_nodes``-note memory run at once.

    ``budget // (num_nodes * BATCH_BYTES_PER_NOTE)``, clamped to ``[1, batch]``: a call's extra
    memory stays ``O(num_nodes x chunk)`` whatever the batch size. Queries never interact, so a
    query gets the same notes in the same order in any chunk; its scores are those of a batch
    of the chunk's size (the forward push is bit-identical for any batch; a BLAS / sparse
    product may round the last bits differently for another batch shape).

    Args:
        num_nodes: >= 0. Notes in the memory.
        batch: >= 0. Queries in the call.
        budget: bytes; ``None`` = :func:`max_batch_bytes`.
    """
    budget = max_batch_bytes() if budget is None else int(budget)
    per_query = max(int(num_nodes), 1) * BATCH_BYTES_PER_NOTE
    return max(1, min(int(batch), budget // per_query))


def run_grouped(
    requests: Sequence[R],
    key: Callable[[R], Hashable],
    run: Callable[[list[R]], list[T]],
) -> list[T]:
    """Runs ``run`` once per group of requests sharing ``key`` and returns results in order.

    Groups of ``(request, MemoryGraph)`` pairs are run in chunks of
    :func:`batch_chunk_size` requests (from the memory budget,
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
