"""An embedding plan: every output vector as a weighted sum of embedded (deduplicated) texts.

Note and query embedding first walk their inputs in Python and record, for each output slot
(a note field, a query unit field, a tag), which texts contribute with which weight. All texts
are then embedded at once (deduplicated, in a few batched embedder calls) and every slot is
assembled with one ``index_add_`` — means, weighted pools and blends are just weights.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from soulmem_torch.embedding.embedder import chunk_text, run_embedder
from soulmem_torch.errors import ValidationError

__all__ = ["EmbeddingPlan"]

_SUM_BLOCK = 4096
"""Contributions per ``index_add_`` in :func:`_weighted_sum`."""


class EmbeddingPlan:
    """Collects ``slot = Σ weight · embed(text)`` recipes; :meth:`assemble` evaluates them."""

    def __init__(self, *, chunk_chars: int | None) -> None:
        self.chunk_chars = chunk_chars
        self._text_id: dict[str, int] = {}
        self.texts: list[str] = []
        self._origin: list[str] = []
        self.num_slots = 0
        self._slot: list[int] = []
        self._text: list[int] = []
        self._weight: list[float] = []

    def new_slot(self) -> int:
        """A new output slot (a zero vector until something is added to it)."""
        self.num_slots += 1
        return self.num_slots - 1

    def _text_index(self, text: str, origin: str) -> int:
        idx = self._text_id.get(text)
        if idx is None:
            idx = len(self.texts)
            self._text_id[text] = idx
            self.texts.append(text)
            self._origin.append(origin)
        return idx

    def add(self, slot: int, text: str, weight: float, origin: str) -> None:
        """``slot += weight · embed(text)`` (the whole text, as one embedder input)."""
        if not isinstance(text, str):
            raise ValidationError(f"{origin}: expected a str, found {type(text).__name__}")
        self._slot.append(slot)
        self._text.append(self._text_index(text, origin))
        self._weight.append(weight)

    def add_chunked(self, slot: int, text: str, weight: float, origin: str) -> None:
        """``slot += weight · mean(embed(chunk) for chunk in chunks(text))``.

        Long text is split into chunks of at most ``chunk_chars`` characters (the original's
        ``infer_with_chunk``); text with no chunk (empty / whitespace) adds nothing, leaving the
        zero vector.
        """
        if self.chunk_chars is None or not isinstance(text, str):
            self.add(slot, text, weight, origin)  # (``add`` reports a non-str)
            return
        chunks = chunk_text(text, self.chunk_chars)
        if not chunks:
            return
        share = weight / len(chunks)
        known = self._text_id.get
        for chunk in chunks:  # (``add`` inlined: a long note has many chunks)
            idx = known(chunk)
            self._text.append(self._text_index(chunk, origin) if idx is None else idx)
        self._slot.extend([slot] * len(chunks))
        self._weight.extend([share] * len(chunks))

    def describe(self, text_index: int) -> str:
        return self._origin[text_index]

    def assemble(
        self,
        embedder: Any,
        *,
        query: bool,
        batch_size: int,
        device: torch.device | str | None,
    ) -> Tensor:
        """Embeds every distinct text once and returns the slots, shape ``(num_slots, D)`` f32."""
        cells = _hashing_cells(embedder, self.texts, query=query, batch_size=batch_size)
        if cells is not None:
            return _weighted_sum_cells(
                cells, self.num_slots, self._slot, self._text, self._weight, device=device
            )
        vectors = self._embed(embedder, query=query, batch_size=batch_size, device=device)
        return _weighted_sum(vectors, self.num_slots, self._slot, self._text, self._weight)

    def assemble_distinct(
        self,
        embedder: Any,
        *,
        query: bool,
        batch_size: int,
        device: torch.device | str | None,
    ) -> tuple[Tensor, list[int]]:
        """As :meth:`assemble`, but slots with the same recipe (the same texts with the same
        weights in the same order — a speaker's name in every turn, the same empty
        environment) are computed once: returns ``(rows (K, D) f32, row of each slot)``.

        A slot's row is built from exactly its own contributions in their order, so each
        value is the one :meth:`assemble` gives."""
        recipes: list[list[tuple[int, float]]] = [[] for _ in range(self.num_slots)]
        for slot, text, weight in zip(self._slot, self._text, self._weight):
            recipes[slot].append((text, weight))
        distinct: dict[tuple[tuple[int, float], ...], int] = {}
        slot_row: list[int] = []
        for recipe in recipes:
            slot_row.append(distinct.setdefault(tuple(recipe), len(distinct)))
        first = [True] * len(distinct)
        representative = [False] * self.num_slots
        for slot, row in enumerate(slot_row):
            if first[row]:
                first[row] = False
                representative[slot] = True
        keep = [i for i, slot in enumerate(self._slot) if representative[slot]]
        args = (
            len(distinct),
            [slot_row[self._slot[i]] for i in keep],
            [self._text[i] for i in keep],
            [self._weight[i] for i in keep],
        )
        cells = _hashing_cells(embedder, self.texts, query=query, batch_size=batch_size)
        if cells is not None:
            return _weighted_sum_cells(cells, *args, device=device), slot_row
        vectors = self._embed(embedder, query=query, batch_size=batch_size, device=device)
        return _weighted_sum(vectors, *args), slot_row

    def _embed(
        self, embedder: Any, *, query: bool, batch_size: int, device: torch.device | str | None
    ) -> Tensor:
        """Every distinct text's vector, ``(len(texts), D)``."""
        return run_embedder(
            embedder,
            self.texts,
            query=query,
            batch_size=batch_size,
            device=device,
            describe=self.describe,
        )


def _weighted_sum(
    vectors: Tensor, rows: int, slot: list[int], text: list[int], weight: list[float]
) -> Tensor:
    """``(rows, D)`` float32: each ``vectors[text[i]] · weight[i]`` added into row ``slot[i]``,
    in order (one ``index_add_``)."""
    out = torch.zeros(rows, int(vectors.shape[1]), dtype=torch.float32, device=vectors.device)
    if slot:
        dev = vectors.device
        index = torch.tensor(slot, dtype=torch.long, device=dev)
        picked = torch.tensor(text, dtype=torch.long, device=dev)
        w = torch.tensor(weight, dtype=torch.float32, device=dev).unsqueeze(1)
        # in blocks, in order (each row still sums its terms in order): the weighted copies
        # stay small instead of one (contributions, D) temporary
        for start in range(0, len(slot), _SUM_BLOCK):
            end = start + _SUM_BLOCK
            out.index_add_(
                0, index[start:end], vectors.index_select(0, picked[start:end]) * w[start:end]
            )
    return out


def _hashing_cells(
    embedder: Any, texts: list[str], *, query: bool, batch_size: int
) -> tuple[int, tuple[np.ndarray, ...]] | None:
    """``(D, cells)``: the built-in :class:`~soulmem_torch.embedding.HashingEmbedder`'s
    vectors of ``texts`` as their non-zero cells
    (:meth:`~soulmem_torch.embedding.HashingEmbedder.cells`); ``None`` for any other embedder
    (a subclass too: it may change what a call gives) and for cells that are not all finite
    (the dense path then names the text)."""
    from soulmem_torch.embedding.hashing import HashingEmbedder

    if type(embedder) is not HashingEmbedder or (query and hasattr(embedder, "embed_query")):
        return None
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValidationError(f"batch_size: expected an int > 0, found {batch_size!r}")
    cells = embedder.cells(texts)
    _, _, vals, base = cells
    if not (np.isfinite(vals).all() and np.isfinite(base).all()):
        return None
    return embedder.dim, cells


def _weighted_sum_cells(
    cells: tuple[int, tuple[np.ndarray, ...]],
    rows: int,
    slot: list[int],
    text: list[int],
    weight: list[float],
    *,
    device: torch.device | str | None,
) -> Tensor:
    """:func:`_weighted_sum` of vectors given by their cells (``HashingEmbedder.cells``), the
    same values bit for bit: each contribution's cells times its float32 weight, added into
    its row in contribution order (one ``index_add_``, which adds in index order); the cells a
    vector does not have are zeros, and adding a zero product to a sum that starts at ``+0.0``
    changes nothing. No dense ``(texts, D)`` matrix, no weighted copies of it."""
    dim, (ptr, cols, vals, base) = cells
    out = torch.zeros(rows * dim, dtype=torch.float32)
    if slot:
        t = np.asarray(text, dtype=np.int64)
        s = np.asarray(slot, dtype=np.int64)
        w = np.asarray(weight, dtype=np.float64).astype(np.float32)
        length = ptr[t + 1] - ptr[t]
        ends = np.cumsum(length)
        total = int(ends[-1])
        at = np.repeat(ptr[t] - (ends - length), length) + np.arange(total, dtype=np.int64)
        contribution = np.repeat(np.arange(len(t), dtype=np.int64), length)
        out.index_add_(
            0,
            torch.from_numpy(s[contribution] * dim + cols[at]),
            torch.from_numpy(vals[at] * w[contribution]),
        )
        # the baseline (the last column): one value per contribution, in order
        out.index_add_(0, torch.from_numpy(s * dim + (dim - 1)), torch.from_numpy(base[t] * w))
    out = out.view(rows, dim)
    return out if device is None else out.to(device)
