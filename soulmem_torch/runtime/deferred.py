"""Embeddings whose vectors are built on first use (a store's load, docs/spec.md §12).

A store holds a note's vectors sparse (its nonzero values and their positions). A load checks
every stored blob completely (header, sizes, positions in range, every stored value finite)
and then hands out one deferred embedding per note instead of dense tensors: the dense
buffer of the whole store (1.6 GB of float32 at 100,000 notes, four 1,024-wide vectors a note)
is zero-filled, scattered and cut into views only when a vector is first read — by the first
snapshot, a search, a save that re-encodes it. Then all of them are built at once, in the same
whole-array steps as before (one scatter, one ``unbind``), so every vector is bit for bit what
an eager decode gives, and every note's vectors are views into that one buffer.

A deferred embedding is a plain :class:`~soulmem_torch.embedding.fields.MemoryEmbedding` (its
exact type: every fast path that takes one takes it) whose ``tag`` and ``fields`` are not set
yet: ``MemoryEmbedding.__getattr__`` puts them in place on the first read (then they are
ordinary attributes); ``copy`` / ``pickle`` read them. Until then it is exactly what the
decoder verified, so :meth:`MemoryCluster.add_notes` takes its width without reading a vector
(:func:`untouched_width`); once read (or assigned) it is checked like any other embedding.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from soulmem_torch.embedding.fields import MemoryEmbedding

__all__ = ["DecodedVectors", "deferred_embedding", "untouched_layout", "untouched_width"]


class DecodedVectors:
    """The verified contents of many blobs of one dtype and width, built into dense views on
    the first :meth:`views` call (thread-safe; built once).

    Args:
        rows: vectors in all (tag + present fields of each note, in order).
        dim: the width of each vector.
        dtype: the torch dtype of the vectors.
        floats: the numpy float dtype of the values (``None``: bfloat16, viewed by torch).
        bits: the numpy integer dtype of the stored bit patterns (the buffer's dtype).
        fill: writes the stored values into the zero-filled flat buffer (every position in
            range and every value finite: the caller checked them).
        zeroed: ``(count, numpy dtype) -> zero-filled 1-D array`` for the buffer.
        on_built: called with the buffer's root tensor and dtype once it is built (e.g.
            ``runtime.cluster.mark_finite``: its values are known to be finite).
    """

    __slots__ = ("_built", "_lock", "_spec", "dim", "dtype", "rows")

    def __init__(
        self,
        *,
        rows: int,
        dim: int,
        dtype: torch.dtype,
        floats: Any,
        bits: np.dtype,
        fill: Callable[[np.ndarray], None],
        zeroed: Callable[[int, np.dtype], np.ndarray],
        on_built: Callable[[torch.Tensor, torch.dtype], None] | None = None,
    ) -> None:
        self.rows, self.dim, self.dtype = rows, dim, dtype
        self._spec: tuple[Any, ...] | None = (floats, bits, fill, zeroed, on_built)
        self._built: tuple[torch.Tensor, ...] | None = None
        self._lock = threading.Lock()

    @property
    def built(self) -> bool:
        """Whether the dense views exist yet."""
        return self._built is not None

    def views(self) -> tuple[torch.Tensor, ...]:
        """One ``(dim,)`` view per vector, of one shared buffer (built on the first call)."""
        built = self._built
        if built is not None:
            return built
        with self._lock:
            if self._built is None:
                assert self._spec is not None
                floats, bits, fill, zeroed, on_built = self._spec
                flat = zeroed(self.rows * self.dim, bits)
                fill(flat)
                native = flat.astype(flat.dtype.newbyteorder("="), copy=False)
                if floats is not None:
                    root = torch.from_numpy(native.view(floats))
                else:  # bfloat16: no numpy dtype
                    root = torch.from_numpy(native).view(self.dtype)
                if on_built is not None:
                    on_built(root, self.dtype)
                self._built = root.view(-1, self.dim).unbind(0)
                self._spec = None  # the stored values are not needed any more
            return self._built


class _Pending:
    """Where a deferred embedding's vectors are: rows ``row``, ``row + 1``, … of ``source``
    (the tag, then ``names`` in order). ``MemoryEmbedding.__getattr__`` calls :meth:`resolve`
    on the first read of ``tag`` or ``fields``."""

    __slots__ = ("names", "row", "source")

    def __init__(self, source: DecodedVectors, row: int, names: Sequence[str]) -> None:
        self.source, self.row, self.names = source, row, names

    def resolve(self, embedding: MemoryEmbedding) -> None:
        views, lo = self.source.views(), self.row
        state = embedding.__dict__  # an attribute assigned before the first read is kept
        state.setdefault("fields", dict(zip(self.names, views[lo + 1 : lo + 1 + len(self.names)])))
        state.setdefault("tag", views[lo])
        state.pop("_pending", None)


_new = object.__new__


def deferred_embedding(source: DecodedVectors, row: int, names: Sequence[str]) -> MemoryEmbedding:
    """A plain :class:`MemoryEmbedding` whose ``tag`` and ``fields`` are rows ``row``, … of
    ``source`` (the tag, then ``names``), put in place on their first read."""
    out = _new(MemoryEmbedding)
    out.__dict__["_pending"] = _Pending(source, row, names)
    return out


def _untouched(embedding: Any) -> _Pending | None:
    if type(embedding) is not MemoryEmbedding:
        return None
    state = embedding.__dict__
    pending = state.get("_pending")
    if pending is None or "tag" in state or "fields" in state:
        return None
    return pending  # type: ignore[no-any-return]


def untouched_width(embedding: Any) -> int | None:
    """The width of a deferred embedding whose vectors were never read or assigned (what its
    decoder verified: 1-D, one width, finite, known field names), else ``None`` (check it
    like any embedding)."""
    pending = _untouched(embedding)
    return None if pending is None else pending.source.dim


def untouched_layout(embedding: Any) -> tuple[DecodedVectors, Sequence[str]] | None:
    """``(its buffer, its field names)`` of a deferred embedding whose vectors were never read
    or assigned (what a store reports without building a vector), else ``None``."""
    pending = _untouched(embedding)
    return None if pending is None else (pending.source, pending.names)
