"""Sparse row tables (docs/spec.md §3, DECISION "sparse note side"): a ``(P, D)`` table of
mostly-zero vectors held as its non-zero cells, and the two products the structured similarity
needs from it — sampled row dots and a matmul against selected rows.

A ``HashingEmbedder`` vector is a bag of hashed features: ~10–120 non-zero cells of 1,024.
Held densely, each distinct note field row and each tag costs ``4·D`` bytes however few cells
it uses; as :class:`SparseRows` (CSR: ``crow`` offsets, ``col`` column numbers, ``val`` values)
it costs ``8`` bytes a non-zero cell. :func:`maybe_sparse` picks the layout by density, so a
dense embedder's rows (a sentence-transformer) stay a plain tensor and its kernels unchanged.

Kernels (every value ``a[r] · table[c]`` is the sum of the products at ``c``'s non-zero
columns, in column order, on any device):

* :func:`sparse_row_dots`: ``out[r, k] = a[r] · table[cols[r, k]]`` — the query row gathered
  at each sampled row's columns, times its values, summed per pair (``segment_reduce``);
  each pair's value depends only on its two rows, not on the batch it is computed in.
* :func:`sparse_rows_matmul`: ``a @ table[sel].T`` — one CSR × dense product.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Sequence

import torch
from torch import Tensor

from soulmem_torch.errors import ValidationError

__all__ = [
    "SPARSE_MAX_DENSITY",
    "SPARSE_MIN_CELLS",
    "SparseRows",
    "maybe_sparse",
    "sparse_row_dots",
    "sparse_rows_matmul",
]

SPARSE_MAX_DENSITY = 0.25
"""A table is held sparse when at most this share of its cells is non-zero (a sparse cell
costs 8 bytes, a dense one 4: ≥ 2x smaller at this density)."""

SPARSE_MIN_CELLS = 1 << 20
"""Tables of fewer cells (at ``D = 1024``: fewer than 1,024 rows, ≤ 4 MiB dense) stay dense:
their memory is small, and the dense kernels have less fixed cost per call."""

_CHUNK_CELLS = 1 << 22
"""Dense cells converted at a time by :meth:`SparseRows.from_dense` and written at a time by
:meth:`SparseRows.write_dense` (bounds the transients)."""

_PAIR_CELLS = 1 << 22
"""Gathered products per step of :func:`sparse_row_dots` (bounds its transient memory)."""


class SparseRows:
    """A ``(P, D)`` table of rows in CSR form: row ``i``'s non-zero cells are
    ``val[crow[i]:crow[i + 1]]`` at columns ``col[crow[i]:crow[i + 1]]`` (ascending).

    ``crow`` is int64, ``col`` int32 (int64 for widths beyond 2^31), ``val`` float32 or float64. All-zero
    rows have no cells. ``shape``, ``dtype``, ``device``, ``to`` and ``to_dense`` behave like a
    dense tensor's; indexing goes through :meth:`select` / :meth:`narrow`.
    """

    __slots__ = ("col", "crow", "val", "width")

    def __init__(self, crow: Tensor, col: Tensor, val: Tensor, width: int) -> None:
        if crow.dim() != 1 or crow.numel() < 1:
            raise ValidationError(f"crow: expected shape (P + 1,), found {tuple(crow.shape)}")
        if col.shape != val.shape or col.dim() != 1:
            raise ValidationError(
                f"col / val: expected equal 1-D shapes, found {tuple(col.shape)} and "
                f"{tuple(val.shape)}"
            )
        if not val.is_floating_point():
            raise ValidationError(f"val: expected a float tensor, found {val.dtype}")
        self.crow, self.col, self.val, self.width = crow, col, val, int(width)

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def from_dense(cls, x: Tensor) -> SparseRows:
        """The non-zero cells of ``x`` (P, D), converted a block of rows at a time."""
        if x.dim() != 2:
            raise ValidationError(f"x: expected shape (P, D), found {tuple(x.shape)}")
        p, d = (int(s) for s in x.shape)
        step = max(1, _CHUNK_CELLS // max(d, 1))
        counts, cols, vals = [], [], []
        for lo in range(0, p, step):
            block = x[lo : lo + step]
            at = block.nonzero()  # one pass: the non-zero cells in row-major order
            row, c = at[:, 0], at[:, 1]
            counts.append(torch.bincount(row, minlength=int(block.shape[0])))
            cols.append(c)
            vals.append(block[row, c])
        counts_t = torch.cat(counts) if counts else x.new_zeros(0, dtype=torch.int64)
        col = torch.cat(cols) if cols else x.new_zeros(0, dtype=torch.int64)
        val = torch.cat(vals) if vals else x.new_zeros(0)
        crow = x.new_zeros(p + 1, dtype=torch.int64)
        torch.cumsum(counts_t, 0, out=crow[1:])
        return cls(crow, col.to(_index_dtype(d)), val, d)

    @classmethod
    def cat(cls, parts: Sequence[SparseRows]) -> SparseRows:
        """The rows of ``parts`` one after another (same width, dtype and device)."""
        if not parts:
            raise ValidationError("parts: expected at least one table")
        width = parts[0].width
        if any(x.width != width for x in parts):
            raise ValidationError(f"parts: expected tables of width {width}")
        sizes = [int(x.crow[-1]) - int(x.crow[0]) for x in parts]
        index_dtype = _index_dtype(width)
        device = parts[0].val.device
        crows = [torch.zeros(1, dtype=torch.int64, device=device)]
        offset = 0
        for x, size in zip(parts, sizes):
            crows.append(x.crow[1:].to(torch.int64) - int(x.crow[0]) + offset)
            offset += size
        c0 = [(int(x.crow[0]), int(x.crow[-1])) for x in parts]
        col = torch.cat([x.col[a:b].to(index_dtype) for x, (a, b) in zip(parts, c0)])
        val = torch.cat([x.val[a:b] for x, (a, b) in zip(parts, c0)])
        return cls(torch.cat(crows), col, val, width)

    # -- tensor-like -----------------------------------------------------------------------
    @property
    def shape(self) -> torch.Size:
        return torch.Size((int(self.crow.shape[0]) - 1, self.width))

    @property
    def dtype(self) -> torch.dtype:
        return self.val.dtype

    @property
    def device(self) -> torch.device:
        return self.val.device

    @property
    def nnz(self) -> int:
        return int(self.crow[-1]) - int(self.crow[0])

    def __len__(self) -> int:
        return int(self.crow.shape[0]) - 1

    def __repr__(self) -> str:
        p, d = self.shape
        return f"SparseRows(shape=({p}, {d}), nnz={self.nnz}, dtype={self.dtype})"

    def nbytes(self) -> int:
        """Bytes of its three tensors."""
        return sum(t.numel() * t.element_size() for t in (self.crow, self.col, self.val))

    def to(
        self, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> SparseRows:
        """A copy on ``device`` / with values of ``dtype`` (``self`` when nothing changes)."""
        dev = self.device if device is None else torch.device(device)
        same_dev = dev == self.device or (dev.index is None and dev.type == self.device.type)
        if same_dev and (dtype is None or dtype == self.dtype):
            return self
        return SparseRows(
            self.crow.to(dev), self.col.to(dev), self.val.to(dev, dtype or self.dtype), self.width
        )

    def to_dense(self) -> Tensor:
        """The dense ``(P, D)`` table (a fresh tensor)."""
        p, d = self.shape
        return self.write_dense(self.val.new_zeros(p, d))

    def write_dense(self, out: Tensor) -> Tensor:
        """The cells written into ``out``, a zeroed ``(P, D)`` tensor (values cast to its
        dtype); returns ``out``."""
        p, d = self.shape
        if tuple(out.shape) != (p, d):
            raise ValidationError(f"out: expected shape ({p}, {d}), found {tuple(out.shape)}")
        if self.nnz:
            if out.is_contiguous():  # one flat index: ~2x faster than a (row, column) pair
                # ``_CHUNK_CELLS`` dense cells of rows at a time: the index of a block's cells
                # only (a table of long texts' vectors has tens of millions of cells)
                step = max(1, _CHUNK_CELLS // max(d, 1))
                flat_out = out.view(-1)
                for lo in range(0, p, step):
                    hi = min(lo + step, p)
                    flat, val = self.narrow(lo, hi)._flat_cells()
                    flat_out[lo * d : hi * d].index_put_((flat,), val.to(out.dtype))
            else:
                lo, hi, rows = self._cell_rows()
                out[rows, self.col[lo:hi].to(torch.int64)] = self.val[lo:hi].to(out.dtype)
        return out

    def row_norms(self) -> Tensor:
        """(P,) each row's L2 norm, as ``torch.linalg.vector_norm`` takes it over the dense row
        (the same bits): ~4M cells of rows at a time written into one reused zeroed buffer,
        normed, and their cells zeroed again (the buffer is never cleared whole, nor
        allocated again per block)."""
        p, d = self.shape
        if p == 0 or d == 0:
            return self.val.new_zeros(p)
        step = max(1, (1 << 22) // d)
        buf = self.val.new_zeros(min(step, p) * d)
        norms = []
        for lo in range(0, p, step):
            block = self.narrow(lo, min(lo + step, p))
            flat, val = block._flat_cells()
            buf.index_put_((flat,), val)
            norms.append(torch.linalg.vector_norm(buf[: len(block) * d].view(-1, d), dim=-1))
            buf.index_fill_(0, flat, 0.0)
        return torch.cat(norms)

    def _flat_cells(self) -> tuple[Tensor, Tensor]:
        """``(position, value)`` of each cell in a row-major ``(P, D)`` buffer (int64)."""
        lo, hi, rows = self._cell_rows()
        return rows * self.width + self.col[lo:hi].to(torch.int64), self.val[lo:hi]

    def _cell_rows(self) -> tuple[int, int, Tensor]:
        """``(lo, hi, row)``: the cells are ``col[lo:hi]`` / ``val[lo:hi]`` (a narrowed table's
        window), ``row`` (int64) the row of each."""
        lo, hi = int(self.crow[0]), int(self.crow[-1])
        lengths = (self.crow[1:] - self.crow[:-1]).to(torch.int64)
        row = torch.repeat_interleave(torch.arange(len(self), device=self.device), lengths)
        return lo, hi, row

    def divide_rows(self, divisor: Tensor, *, keep: Tensor | None = None) -> SparseRows:
        """Each row's cells divided by ``divisor[row]`` ((P,), float; times ``keep[row]``,
        (P,) bool, when given), the cells that come out zero left out: what ``from_dense`` of
        ``to_dense() / divisor[:, None] * keep[:, None]`` holds (the same quotients), without
        a dense copy."""
        p = len(self)
        if tuple(divisor.shape) != (p,) or (keep is not None and tuple(keep.shape) != (p,)):
            raise ValidationError(
                f"divisor / keep: expected shape ({p},), found {tuple(divisor.shape)} / "
                f"{None if keep is None else tuple(keep.shape)}"
            )
        lo, hi = int(self.crow[0]), int(self.crow[-1])
        lengths = (self.crow[1:] - self.crow[:-1]).to(torch.int64)

        def per_cell(x: Tensor) -> Tensor:  # each row's value, once per cell of the row
            return torch.repeat_interleave(x, lengths, output_size=hi - lo)

        val = self.val[lo:hi] / per_cell(divisor.to(self.val.dtype))
        if keep is not None:
            val *= per_cell(keep)
        nonzero = val != 0  # (a zero quotient, a row not kept: what from_dense drops)
        if bool(nonzero.all()):  # (the common case: every cell stays, in its place)
            crow = self.crow - lo if lo else self.crow
            return SparseRows(crow, self.col[lo:hi], val, self.width)
        row = per_cell(torch.arange(p, device=self.device))
        counts = torch.zeros(p, dtype=torch.int64, device=self.device)
        counts.index_add_(0, row, nonzero.to(torch.int64))
        crow = counts.new_zeros(p + 1)
        torch.cumsum(counts, 0, out=crow[1:])
        return SparseRows(crow, self.col[lo:hi][nonzero], val[nonzero], self.width)

    def narrow(self, lo: int, hi: int) -> SparseRows:
        """Rows ``lo:hi`` (views of the cells)."""
        p = len(self)
        if not 0 <= lo <= hi <= p:
            raise ValidationError(f"rows {lo}:{hi}: expected 0 <= lo <= hi <= {p}")
        return SparseRows(self.crow[lo : hi + 1], self.col, self.val, self.width)

    def select(self, index: Tensor) -> SparseRows:
        """Rows ``index`` (any order, repeats allowed): a compact copy of their cells."""
        pos, lengths, _ = _cells(self, index.reshape(-1).to(torch.int64))
        crow = lengths.new_zeros(int(lengths.shape[0]) + 1)
        torch.cumsum(lengths, 0, out=crow[1:])
        return SparseRows(crow, self.col[pos], self.val[pos], self.width)

    def with_zero_row(self) -> SparseRows:
        """These rows followed by one all-zero row."""
        crow = torch.cat([self.crow, self.crow[-1:]])
        return SparseRows(crow, self.col, self.val, self.width)

    def csr(self) -> Tensor:
        """The table as a ``torch.sparse_csr`` tensor (no copy when it starts at cell 0)."""
        crow, col, val = self.crow, self.col, self.val
        if int(crow[0]) != 0 or int(crow[-1]) != int(col.shape[0]):
            lo, hi = int(crow[0]), int(crow[-1])
            crow, col, val = crow - lo, col[lo:hi], val[lo:hi]
        if col.dtype != crow.dtype:  # torch's CSR wants both index tensors of one dtype
            if int(crow[-1]) < 2**31 and col.dtype == torch.int32:
                crow = crow.to(torch.int32)
            else:
                col = col.to(crow.dtype)
        with warnings.catch_warnings():  # "sparse CSR support is in beta": the op is documented
            warnings.simplefilter("ignore", UserWarning)
            return torch.sparse_csr_tensor(
                crow, col, val, size=tuple(self.shape), check_invariants=False
            )


def _index_dtype(width_or_cells: int) -> torch.dtype:
    return torch.int32 if width_or_cells < 2**31 else torch.int64


def maybe_sparse(
    x: Tensor,
    *,
    max_density: float = SPARSE_MAX_DENSITY,
    min_cells: int = SPARSE_MIN_CELLS,
) -> Tensor | SparseRows:
    """``x`` (P, D) as :class:`SparseRows` when it has at least ``min_cells`` cells and at
    most ``max_density`` of them are non-zero, else ``x`` itself."""
    if x.dim() != 2 or x.numel() == 0 or x.numel() < min_cells:
        return x
    nnz = int(torch.count_nonzero(x))
    if nnz > max_density * x.numel():
        return x
    return SparseRows.from_dense(x)


def join_tables(parts: Sequence[Tensor | SparseRows], width: int) -> Tensor | SparseRows:
    """The rows of ``parts`` (dense tensors and / or :class:`SparseRows`, one device) one after
    another, in the layout the whole asks for (:func:`maybe_sparse`'s rule): sparse parts are
    never made dense when the whole is sparse, dense parts converted one at a time."""
    cells = sum(int(x.shape[0]) for x in parts) * width
    nnz = sum(x.nnz if isinstance(x, SparseRows) else int(torch.count_nonzero(x)) for x in parts)
    if parts and cells >= SPARSE_MIN_CELLS and nnz <= SPARSE_MAX_DENSITY * cells:
        return SparseRows.cat(
            [x if isinstance(x, SparseRows) else SparseRows.from_dense(x) for x in parts]
        )
    dense = [x.to_dense() if isinstance(x, SparseRows) else x for x in parts]
    if not dense:
        return torch.zeros(0, width)
    return torch.cat(dense)


def _cells(table: SparseRows, rows: Tensor) -> tuple[Tensor, Tensor, int]:
    """Cell positions of ``rows`` (one after another), each row's cell count, and the total.

    The positions are one running sum: ``+1`` within a row, a jump at each (non-empty) row's
    first cell — cheaper than a ``repeat_interleave`` of the row starts."""
    crow = table.crow
    start = crow.index_select(0, rows)
    lengths = crow.index_select(0, rows + 1) - start
    total = int(lengths.sum()) if lengths.numel() else 0
    if total == 0:
        return start.new_zeros(0), lengths, 0
    return _runs(start, lengths, total), lengths, total


def _runs(start: Tensor, lengths: Tensor, total: int) -> Tensor:
    """``cat([arange(s, s + n) for s, n in zip(start, lengths)])`` (``total = sum(lengths)``):
    ``arange(total)`` plus a per-run offset, the running sum of each run's jump added at its
    first cell (empty runs' jumps telescope into the next run's; no filtering, no host sync)."""
    ends = torch.cumsum(lengths, 0)
    jump = start.clone()
    jump[1:] -= start[:-1] + lengths[:-1]
    return _offsets(ends - lengths, jump, total) + torch.arange(total, device=start.device)


def _offsets(first: Tensor, jump: Tensor, total: int) -> Tensor:
    """``(total,)`` int64: the running sum of ``jump[i]`` placed at cell ``first[i]`` (runs
    starting at ``total``, i.e. empty trailing ones, fall off the end)."""
    out = torch.zeros(total + 1, dtype=torch.int64, device=jump.device)
    out.index_add_(0, first, jump)
    return torch.cumsum(out[:total], 0)


def _check_table(a: Tensor, table: SparseRows) -> None:
    if a.dim() != 2 or int(a.shape[1]) != table.width:
        raise ValidationError(
            f"a: expected shape (R, {table.width}) (the width of the table), found {tuple(a.shape)}"
        )


def sparse_row_dots(a: Tensor, table: SparseRows, cols: Tensor) -> Tensor:
    """``out[r, k] = a[r] · table[cols[r, k]]``: (R, K) in ``a``'s dtype.

    Each pair's cells are gathered (their columns pick entries of ``a[r]``, times their
    values) and summed in column order by one ``segment_reduce``: a pair's value depends on
    its two rows only, never on the rest of the batch. Steps of at most ~4M products.

    Args:
        a: (R, D) float32 or float64 (dense).
        table: a :class:`SparseRows` of width ``D`` on ``a``'s device.
        cols: (R, K) integer row numbers into ``table``, each in ``[0, P)``.
    """
    _check_table(a, table)
    r, k = int(cols.shape[0]), int(cols.shape[1])
    out = a.new_zeros(r * k)
    if r == 0 or k == 0 or table.nnz == 0:
        return out.view(r, k)
    d = table.width
    crow = table.crow
    flat = cols.reshape(-1).to(torch.int64)
    start = crow.index_select(0, flat)
    lengths = crow.index_select(0, flat + 1) - start
    per_query = lengths.view(r, k).sum(dim=1)
    bounds = _steps(per_query, _PAIR_CELLS)
    flat_a = a.reshape(-1)
    val = table.val if table.val.dtype == a.dtype else table.val.to(a.dtype)
    # cell positions and query offsets as int32 when they fit (half the index traffic)
    idt = torch.int32 if int(crow[-1]) < 2**31 and r * d < 2**31 else torch.int64
    col = table.col if table.col.dtype == idt else table.col.to(idt)
    for lo, hi in itertools.pairwise(bounds):
        seg = lengths[lo * k : hi * k]
        counts = per_query[lo:hi]
        total = int(counts.sum())
        if total == 0:
            continue
        # each pair's cells: arange(total) shifted by (pair's first cell in the table − its
        # first product), one repeat per pair (no host sync: ``output_size`` is known)
        shift = (start[lo * k : hi * k] - (torch.cumsum(seg, 0) - seg)).to(idt)
        pos = torch.arange(total, dtype=idt, device=a.device)
        pos += torch.repeat_interleave(shift, seg, output_size=total)
        # the offset of each cell's query row in ``flat_a``, plus the cell's column
        owner = col.index_select(0, pos)
        owner += torch.repeat_interleave(
            torch.arange(lo * d, hi * d, d, dtype=idt, device=a.device), counts,
            output_size=total,
        )  # fmt: skip
        prod = flat_a.index_select(0, owner)
        prod *= val.index_select(0, pos)
        out[lo * k : hi * k] = torch.segment_reduce(prod, "sum", lengths=seg, unsafe=True)
    return out.view(r, k)


def _steps(per_row: Tensor, budget: int) -> list[int]:
    """Row bounds ``[0, ..., R]`` of consecutive steps holding at most ``budget`` cells each
    (a row with more has a step of its own)."""
    r = int(per_row.shape[0])
    if int(per_row.sum()) <= budget:
        return [0, r]
    bounds, base, prev = [0], 0, 0
    for i, c in enumerate(torch.cumsum(per_row, 0).tolist()):
        if c - base > budget and i > bounds[-1]:  # row i starts a new step
            bounds.append(i)
            base = prev
        prev = c
    bounds.append(r)
    return bounds


def sparse_rows_matmul(a: Tensor, table: SparseRows, sel: Tensor | None = None) -> Tensor:
    """``a @ table[sel].T``: (R, n) in ``a``'s dtype (``sel`` None: every row of the table).

    Args:
        a: (R, D) float32 or float64 (dense).
        table: a :class:`SparseRows` of width ``D`` on ``a``'s device.
        sel: (n,) integer row numbers into ``table``, or None.
    """
    _check_table(a, table)
    rows = table if sel is None else table.select(sel)
    n = len(rows)
    if n == 0 or int(a.shape[0]) == 0 or rows.nnz == 0:
        return a.new_zeros(int(a.shape[0]), n)
    s = rows.to(dtype=a.dtype).csr()
    return (s @ a.T).T
