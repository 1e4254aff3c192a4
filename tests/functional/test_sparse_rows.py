"""Sparse row tables (functional/sparse_rows.py) against dense references: conversions, the
sampled row dots and the matmul, empty and all-zero rows, float32 and float64, and the note
side built sparse from hashed vectors scoring as the dense one does."""

from __future__ import annotations

import pytest
import torch

from soulmem_torch.errors import ValidationError
from soulmem_torch.functional.similarity import (
    normalize_rows,
    note_side_compact,
    row_dots,
    rows_matmul,
)
from soulmem_torch.functional.sparse_rows import (
    SparseRows,
    join_tables,
    maybe_sparse,
    sparse_row_dots,
    sparse_rows_matmul,
)

DTYPES = [torch.float32, torch.float64]


def _sparse_table(p: int, d: int, nnz: int, *, seed: int = 0, dtype=torch.float32):
    """``p`` rows of ``d`` with ~``nnz`` non-zero cells each; rows 0 and 3 all zeros."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.zeros(p, d, dtype=dtype)
    cols = torch.randint(0, d, (p, nnz), generator=gen)
    x.scatter_(1, cols, torch.randn(p, nnz, generator=gen, dtype=dtype))
    x[0] = 0
    if p > 3:
        x[3] = 0
    return x


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_select_narrow_cat(dtype) -> None:
    x = _sparse_table(40, 64, 5, dtype=dtype)
    s = SparseRows.from_dense(x)
    assert s.shape == x.shape and s.dtype == dtype and s.nnz == int((x != 0).sum())
    assert torch.equal(s.to_dense(), x)
    idx = torch.tensor([3, 7, 7, 0, 39, 12])
    assert torch.equal(s.select(idx).to_dense(), x[idx])
    assert torch.equal(s.narrow(5, 17).to_dense(), x[5:17])
    assert torch.equal(s.narrow(9, 9).to_dense(), x[9:9])
    both = SparseRows.cat([s.narrow(20, 40), s.narrow(0, 20)])
    assert torch.equal(both.to_dense(), torch.cat([x[20:], x[:20]]))
    zero = s.with_zero_row()
    assert zero.shape == (41, 64) and torch.equal(zero.to_dense()[-1], torch.zeros(64, dtype=dtype))
    assert torch.equal(s.narrow(4, 30).csr().to_dense(), x[4:30])
    assert s.to(dtype=torch.float64).dtype == torch.float64
    assert (
        s.nbytes() == s.crow.numel() * 8 + s.col.numel() * 4 + s.val.numel() * s.val.element_size()
    )


def test_empty_and_all_zero_tables() -> None:
    empty = SparseRows.from_dense(torch.zeros(0, 8))
    assert empty.shape == (0, 8) and empty.nnz == 0 and empty.to_dense().shape == (0, 8)
    zeros = SparseRows.from_dense(torch.zeros(5, 8))
    assert zeros.nnz == 0 and torch.equal(zeros.to_dense(), torch.zeros(5, 8))
    a = torch.randn(3, 8)
    assert torch.equal(sparse_row_dots(a, zeros, torch.randint(0, 5, (3, 4))), torch.zeros(3, 4))
    assert torch.equal(sparse_rows_matmul(a, zeros), torch.zeros(3, 5))
    assert sparse_row_dots(a, zeros, torch.zeros(3, 0, dtype=torch.long)).shape == (3, 0)
    assert sparse_rows_matmul(a, zeros, torch.zeros(0, dtype=torch.long)).shape == (3, 0)
    assert sparse_rows_matmul(a[:0], SparseRows.from_dense(torch.eye(8))).shape == (0, 8)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nnz", [1, 6, 30])
def test_row_dots_and_matmul_equal_the_dense_reference(dtype, nnz: int, device) -> None:
    x = _sparse_table(300, 128, nnz, seed=nnz, dtype=dtype)
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(17, 128, generator=gen, dtype=dtype)
    cols = torch.randint(0, 300, (17, 23), generator=gen)
    cols[0, :3] = 0  # all-zero rows
    ref = (a.double().unsqueeze(1) * x.double()[cols]).sum(-1).to(device)
    x, a, cols = x.to(device), a.to(device), cols.to(device)
    s = SparseRows.from_dense(x)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    got = sparse_row_dots(a, s, cols)
    assert got.dtype == dtype and got.shape == (17, 23)
    torch.testing.assert_close(got.double(), ref, rtol=0, atol=tol)
    assert not got[0, :3].any()
    torch.testing.assert_close(row_dots(a, s, cols), got, rtol=0, atol=0)  # the dispatch
    sel = torch.tensor([0, 5, 299, 5, 3], device=device)
    mm = sparse_rows_matmul(a, s, sel)
    torch.testing.assert_close(mm.double(), a.double() @ x.double()[sel].T, rtol=0, atol=tol)
    torch.testing.assert_close(rows_matmul(a, s, sel), rows_matmul(a, x, sel), rtol=0, atol=tol)
    torch.testing.assert_close(
        sparse_rows_matmul(a, s).double(), a.double() @ x.double().T, rtol=0, atol=tol
    )


def test_row_dots_are_independent_of_the_batch_and_of_the_steps(monkeypatch) -> None:
    """A pair's value depends on its two rows only: the same bits in any batch, and when the
    products are split into steps."""
    import soulmem_torch.functional.sparse_rows as sr

    x = _sparse_table(200, 256, 20, seed=3)
    s = SparseRows.from_dense(x)
    a = torch.randn(40, 256)
    cols = torch.randint(0, 200, (40, 31))
    whole = sparse_row_dots(a, s, cols)
    for r in (0, 7, 39):
        assert torch.equal(sparse_row_dots(a[r : r + 1], s, cols[r : r + 1]), whole[r : r + 1])
    monkeypatch.setattr(sr, "_PAIR_CELLS", 500)  # many steps (a query row more than a step)
    assert torch.equal(sparse_row_dots(a, s, cols), whole)


def test_bad_inputs_raise_clear_errors() -> None:
    s = SparseRows.from_dense(_sparse_table(10, 16, 3))
    with pytest.raises(ValidationError, match=r"a: expected shape \(R, 16\)"):
        sparse_row_dots(torch.randn(2, 8), s, torch.zeros(2, 1, dtype=torch.long))
    with pytest.raises(ValidationError, match=r"a: expected shape \(R, 16\)"):
        sparse_rows_matmul(torch.randn(16), s)
    with pytest.raises(ValidationError, match="rows 4:20"):
        s.narrow(4, 20)
    with pytest.raises(ValidationError, match="x: expected shape"):
        SparseRows.from_dense(torch.zeros(3))
    with pytest.raises(ValidationError, match="col / val"):
        SparseRows(torch.zeros(2, dtype=torch.long), torch.zeros(3, dtype=torch.int32),
                   torch.zeros(2), 4)  # fmt: skip
    with pytest.raises(ValidationError, match="expected tables of width 16"):
        SparseRows.cat([s, SparseRows.from_dense(torch.eye(4))])


def test_maybe_sparse_picks_the_layout_by_density_and_size() -> None:
    sparse = _sparse_table(50, 64, 4)
    assert isinstance(maybe_sparse(sparse, min_cells=0), SparseRows)
    assert maybe_sparse(sparse) is sparse  # 3,200 cells: small tables stay dense
    assert isinstance(maybe_sparse(_sparse_table(1024, 1024, 4)), SparseRows)
    dense = torch.randn(50, 64)
    assert maybe_sparse(dense, min_cells=0) is dense
    assert maybe_sparse(torch.zeros(0, 64)).shape == (0, 64)


def test_join_tables_keeps_sparse_parts_sparse() -> None:
    a, b = _sparse_table(600, 1024, 6, seed=1), _sparse_table(600, 1024, 6, seed=2)
    joined = join_tables([SparseRows.from_dense(a), b], 1024)  # mixed parts, sparse whole
    assert isinstance(joined, SparseRows) and torch.equal(joined.to_dense(), torch.cat([a, b]))
    small = join_tables([SparseRows.from_dense(a[:5]), b[:5]], 1024)  # small whole: dense
    assert isinstance(small, torch.Tensor) and torch.equal(small, torch.cat([a[:5], b[:5]]))
    dense = torch.randn(1100, 1024)
    assert torch.equal(join_tables([dense[:600], SparseRows.from_dense(dense[600:])], 1024), dense)
    assert join_tables([], 8).shape == (0, 8)


@pytest.mark.parametrize("dense_vectors", [False, True])
def test_note_side_sparse_when_the_vectors_are(dense_vectors: bool, monkeypatch) -> None:
    """Hashed-like (sparse) vectors → SparseRows tables with normalize_rows's values, absent
    tags zeroed; dense vectors → dense tables, as before (small tables allowed sparse here)."""
    import soulmem_torch.functional.similarity as fsim

    monkeypatch.setattr(fsim, "SPARSE_MIN_CELLS", 0)
    n, d = 30, 256
    tag = torch.randn(n, d) if dense_vectors else _sparse_table(n, d, 8, seed=5)
    rows = torch.randn(12, d) if dense_vectors else _sparse_table(12, d, 8, seed=6)
    mask = torch.ones(n, dtype=torch.bool)
    mask[4] = False
    pos = torch.full((n, 15), -1, dtype=torch.int32)
    pos[:12, 0] = torch.arange(12, dtype=torch.int32)
    side = note_side_compact(tag, mask, rows, pos)
    assert isinstance(side.rows, SparseRows) is not dense_vectors
    assert isinstance(side.tag, SparseRows) is not dense_vectors
    dense_rows = side.rows.to_dense() if isinstance(side.rows, SparseRows) else side.rows
    dense_tag = side.tag.to_dense() if isinstance(side.tag, SparseRows) else side.tag
    assert torch.equal(dense_rows[:12], normalize_rows(rows)) and not dense_rows[12].any()
    assert torch.equal(dense_tag, normalize_rows(tag) * mask.unsqueeze(-1))
    assert side.field.shape == (n, 15, d) and torch.equal(side.field[:12, 0], dense_rows[:12])


@pytest.mark.parametrize("dense_out", [False, True])
@pytest.mark.parametrize("with_keep", [False, True])
def test_normalized_table_of_sparse_vectors_is_the_dense_references_bit_for_bit(
    dense_out: bool, with_keep: bool, monkeypatch
) -> None:
    """Raw vectors held sparse, normalized into a sparse table (the cells divided by each
    row's norm) or a dense one (the cells laid straight into it): the same tensors as
    ``normalize_rows`` of the dense vectors, times the mask, converted (``from_dense``) —
    explicit zero cells, all-zero rows and rows not kept dropped, several blocks of rows."""
    import soulmem_torch.functional.similarity as fsim

    monkeypatch.setattr(fsim, "SPARSE_MIN_CELLS", 0)
    if dense_out:
        monkeypatch.setattr(fsim, "SPARSE_MAX_DENSITY", 0.0)
    p, d = 9000, 512  # (more rows than one block of 2^22 cells)
    dense = _sparse_table(p, d, 12, seed=11)
    dense[5, :3] = torch.tensor([1e-30, -1e-30, 3e38])  # tiny and huge values in one row
    sparse = SparseRows.from_dense(dense)
    sparse.val[::97] = 0.0  # explicit zero cells
    dense = sparse.to_dense()
    keep = torch.rand(p, generator=torch.Generator().manual_seed(2)) > 0.2 if with_keep else None
    got = fsim._normalized_table(sparse, torch.device("cpu"), zero_row=True, keep=keep)
    want = normalize_rows(dense)
    if keep is not None:
        want *= keep.unsqueeze(-1)
    want = torch.cat([want, want.new_zeros(1, d)])
    if dense_out:
        assert not isinstance(got, SparseRows) and torch.equal(got, want)
        return
    assert isinstance(got, SparseRows)
    ref = SparseRows.from_dense(want)
    assert torch.equal(got.crow, ref.crow)
    assert torch.equal(got.col.to(torch.int64), ref.col.to(torch.int64))
    assert torch.equal(got.val, ref.val)  # bit for bit


def test_divide_rows_checks_its_shapes() -> None:
    table = SparseRows.from_dense(_sparse_table(6, 16, 3))
    with pytest.raises(ValidationError, match="divisor"):
        table.divide_rows(torch.ones(5))
    with pytest.raises(ValidationError, match="keep"):
        table.divide_rows(torch.ones(6), keep=torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValidationError, match="out"):
        table.write_dense(torch.zeros(5, 16))


@pytest.mark.parametrize("dtype", DTYPES)
def test_row_norms_and_dense_copies_are_the_references_bit_for_bit(dtype) -> None:
    """``row_norms`` (one reused buffer, its cells zeroed after each block) equals
    ``torch.linalg.vector_norm`` of the dense rows — over several blocks, on a narrowed
    table (cells not starting at 0), for all-zero rows and an empty table — and
    ``write_dense`` fills a contiguous and a strided buffer alike."""
    p, d = 9000, 512  # (more rows than one block of 2^22 cells)
    dense = _sparse_table(p, d, 12, seed=5, dtype=dtype)
    table = SparseRows.from_dense(dense)
    want = torch.linalg.vector_norm(dense, dim=-1)
    got = table.row_norms()
    assert got.dtype == dtype and torch.equal(got, want)
    assert got[0] == 0 and got[3] == 0
    assert torch.equal(table.row_norms(), want)  # (nothing left behind in a buffer)
    part = table.narrow(4100, 8500)
    assert torch.equal(part.row_norms(), want[4100:8500])
    assert torch.equal(part.to_dense(), dense[4100:8500])
    assert torch.equal(table.narrow(7, 7).row_norms(), want[:0])
    strided = torch.zeros(d, 4400, dtype=dtype).T  # (a transposed view: not contiguous)
    assert torch.equal(part.write_dense(strided), dense[4100:8500])


@pytest.mark.parametrize("chunk", [64, 1000, 1 << 22])
def test_write_dense_a_block_of_rows_at_a_time_is_the_whole_table(chunk, monkeypatch) -> None:
    """``write_dense`` into a contiguous buffer writes ``_CHUNK_CELLS`` dense cells of rows at
    a time: the same table for any block size (a row per block, blocks not dividing the rows,
    one block), whole or narrowed, all-zero rows included."""
    from soulmem_torch.functional import sparse_rows

    monkeypatch.setattr(sparse_rows, "_CHUNK_CELLS", chunk)
    dense = _sparse_table(37, 64, 9, seed=8)
    table = SparseRows.from_dense(dense)
    assert torch.equal(table.to_dense(), dense)
    assert torch.equal(table.narrow(5, 30).to_dense(), dense[5:30])
    out = torch.zeros(37, 64, dtype=torch.float64)
    assert torch.equal(table.write_dense(out), dense.to(torch.float64))


def test_divide_rows_keeps_every_cell_in_place_when_none_comes_out_zero() -> None:
    """Without a zero quotient or a row left out, ``divide_rows`` keeps the cells where
    they are (a narrowed table's too): the same table as ``from_dense`` of the dense
    quotients; with rows left out, those rows' cells go."""
    dense = _sparse_table(50, 64, 5, seed=3)
    part = SparseRows.from_dense(dense).narrow(10, 40)  # (its cells do not start at 0)
    divisor = torch.linspace(0.5, 3.0, 30)
    got = part.divide_rows(divisor)
    ref = SparseRows.from_dense(dense[10:40] / divisor.unsqueeze(1))
    assert torch.equal(got.crow, ref.crow) and torch.equal(got.val, ref.val)
    assert torch.equal(got.col.to(torch.int64), ref.col.to(torch.int64))
    keep = torch.arange(30) % 3 != 0
    got = part.divide_rows(divisor, keep=keep)
    ref = SparseRows.from_dense(dense[10:40] / divisor.unsqueeze(1) * keep.unsqueeze(1))
    assert torch.equal(got.crow, ref.crow) and torch.equal(got.val, ref.val)
