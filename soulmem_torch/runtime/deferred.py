"""Embeddings whose vectors are built on first use (a store's load, docs/spec.md §12).

A store holds a note's vectors sparse (its nonzero values and their positions). A load checks
every stored blob completely (header, sizes, positions in range, every stored value finite)
and then hands out one :class:`DeferredEmbedding` per note instead of dense tensors: the dense
buffer of the whole store (1.6 GB of float32 at 100,000 notes, four 1,024-wide vectors a note)
is zero-filled, scattered and cut into views only when a vector is first read — by the first
snapshot, a search, a save that re-encodes it. Then all of them are built at once, in the same
whole-array steps as before (one scatter, one ``unbind``), so every vector is bit for bit what
an eager decode gives, and every note's vectors are views into that one buffer.

A ``DeferredEmbedding`` is a :class:`~soulmem_torch.embedding.fields.MemoryEmbedding` (same
attributes, equality, ``dim``, ``to``, ``validate``); ``copy`` / ``pickle`` give a plain one.
Until its vectors are read it is exactly what the decoder verified, so
:meth:`MemoryCluster.add_notes` takes its width without reading a vector
(:func:`untouched_width`); once read (or assigned) it is checked like any other embedding.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from soulmem_torch.embedding.fields import MemoryEmbedding

__all__ = ["DecodedVectors", "DeferredEmbedding", "untouched_layout", "untouched_width"]


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


class DeferredEmbedding(MemoryEmbedding):
    """A note's embedding whose vectors are rows ``row``, ``row + 1``, … of a
    :class:`DecodedVectors` (the tag, then ``names`` in order), built on first access."""

    def __init__(self, source: DecodedVectors, row: int, names: Sequence[str]) -> None:
        # MemoryEmbedding's own fields live in the properties below
        self._source: DecodedVectors | None = source
        self._row = row
        self._names = names
        self._tag: torch.Tensor | None = None
        self._fields: dict[str, torch.Tensor] | None = None

    def _resolve(self) -> None:
        source = self._source
        assert source is not None
        views, lo = source.views(), self._row
        self._fields = dict(zip(self._names, views[lo + 1 : lo + 1 + len(self._names)]))
        self._tag = views[lo]
        self._source = None

    @property  # type: ignore[override]
    def tag(self) -> torch.Tensor:
        if self._tag is None:
            self._resolve()
        return self._tag  # type: ignore[return-value]

    @tag.setter
    def tag(self, value: torch.Tensor) -> None:
        if self._tag is None:
            self._resolve()
        self._tag = value

    @property  # type: ignore[override]
    def fields(self) -> dict[str, torch.Tensor]:
        if self._fields is None:
            self._resolve()
        return self._fields  # type: ignore[return-value]

    @fields.setter
    def fields(self, value: dict[str, torch.Tensor]) -> None:
        if self._fields is None:
            self._resolve()
        self._fields = value

    @property
    def dim(self) -> int:
        if self._source is not None:
            return self._source.dim
        return int(self.tag.shape[-1])

    def __repr__(self) -> str:
        return f"MemoryEmbedding(tag={self.tag!r}, fields={self.fields!r})"

    def __reduce__(self) -> Any:  # copy / deepcopy / pickle: a plain MemoryEmbedding
        return (MemoryEmbedding, (self.tag, self.fields))

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self.__reduce__()


def untouched_width(embedding: Any) -> int | None:
    """The width of a :class:`DeferredEmbedding` whose vectors were never read or assigned
    (what its decoder verified: 1-D, one width, finite, known field names), else ``None``
    (check it like any embedding)."""
    if type(embedding) is DeferredEmbedding and embedding._source is not None:
        return embedding._source.dim
    return None


def untouched_layout(embedding: Any) -> tuple[DecodedVectors, Sequence[str]] | None:
    """``(its buffer, its field names)`` of a :class:`DeferredEmbedding` whose vectors were
    never read or assigned (what a store reports without building a vector), else ``None``."""
    if type(embedding) is DeferredEmbedding and embedding._source is not None:
        return embedding._source, embedding._names
    return None
