"""Compact raw vectors (docs/spec.md §3, DECISION "compact raw vectors"): many notes' tag and
field vectors held as sparse row tables, and embeddings whose dense tensors are built on read.

A ``HashingEmbedder`` vector is a bag of hashed features (~10–120 non-zero cells of 1,024).
Held densely, every note's tag and each distinct field vector costs ``4·D`` bytes (18 KiB a
structured note at ``D = 1024``); as :class:`~soulmem_torch.functional.sparse_rows.SparseRows`
it costs 8 bytes a non-zero cell (~1–2 KiB). A :class:`CompactVectors` holds the vectors of
``N`` notes in the snapshot's compact layout — ``tag`` ``(N, D)``, ``rows`` ``(P, D)`` (the
distinct field vectors grouped by field), ``pos`` ``(N, F)`` int32 (row of each note field,
``-1`` absent) — and :func:`compact_embedding` hands out a plain
:class:`~soulmem_torch.embedding.fields.MemoryEmbedding` (its exact type) whose ``tag`` and
``fields`` are not attributes: each read builds fresh dense tensors from the table
(``MemoryEmbedding.__getattr__``), the same values bit for bit, and the library keeps none of
them. Assigning ``tag`` or ``fields`` makes them ordinary attributes again; changing a tensor
read from it in place changes only that copy (``MemoryCluster.set_embedding`` replaces a
note's vectors). ``copy`` / ``pickle`` give an ordinary dense embedding.

Who makes them: :meth:`MemoryCluster.add_notes <soulmem_torch.runtime.cluster.MemoryCluster.add_notes>`
packs a batch of sparse float32 CPU vectors on entry (the caller's dense buffers are not kept),
and :meth:`MemoryGraph.from_cluster <soulmem_torch.graph.MemoryGraph.from_cluster>` builds its
tables from them without a dense copy (:func:`stack_sparse_tables`), then points the notes at
its own tables. Dense vectors (a sentence-transformer's), narrow ones (``D`` < 128) and
vectors other than float32 on the CPU stay ordinary tensors, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from soulmem_torch.embedding.fields import FIELD_INDEX, FIELD_NAMES, MemoryEmbedding
from soulmem_torch.errors import ValidationError
from soulmem_torch.functional.sparse_rows import SPARSE_MAX_DENSITY, SparseRows

__all__ = [
    "COMPACT_MAX_DENSITY",
    "COMPACT_MIN_WIDTH",
    "CompactVectors",
    "compact_embedding",
    "compact_ref",
    "pack_embeddings",
    "pack_rows",
    "stack_sparse_tables",
]

COMPACT_MAX_DENSITY = SPARSE_MAX_DENSITY
"""Vectors are held compact when at most this share of their cells is non-zero."""

COMPACT_MIN_WIDTH = 128
"""Narrower vectors stay dense (their dense rows cost little; a user's small test vectors keep
their tensors)."""

_I64 = torch.int64
_F32 = torch.float32
_CPU = torch.device("cpu")
_new = object.__new__


class CompactVectors:
    """The raw vectors of ``N`` notes: ``tag`` ``(N, D)`` and ``rows`` ``(P, D)``
    (:class:`SparseRows`, float32, CPU), ``pos`` ``(N, F)`` int32 (row of ``rows`` of each
    note field, ``-1`` where absent). Immutable once made."""

    __slots__ = ("_arrays", "pos", "rows", "tag")

    def __init__(self, tag: SparseRows, rows: SparseRows, pos: Tensor) -> None:
        self.tag, self.rows, self.pos = tag, rows, pos
        self._arrays: tuple[Any, ...] | None = None

    def __getstate__(self) -> tuple[SparseRows, SparseRows, Tensor]:
        return self.tag, self.rows, self.pos

    def __setstate__(self, state: tuple[SparseRows, SparseRows, Tensor]) -> None:
        self.tag, self.rows, self.pos = state
        self._arrays = None

    def arrays(self) -> tuple[Any, ...]:
        """``(tag crow, tag col, tag val, rows crow, rows col, rows val, pos)`` as numpy
        views of the tables (no copy; made once): what a store's encoder reads a note's
        cells from."""
        if self._arrays is None:
            self._arrays = tuple(
                t.numpy()
                for t in (self.tag.crow, self.tag.col, self.tag.val, self.rows.crow,
                          self.rows.col, self.rows.val, self.pos)
            )  # fmt: skip
        return self._arrays

    @property
    def dim(self) -> int:
        return self.tag.width

    def __len__(self) -> int:
        return len(self.tag)

    def nbytes(self) -> int:
        return self.tag.nbytes() + self.rows.nbytes() + self.pos.numel() * 4

    def tag_vector(self, i: int) -> Tensor:
        """Note ``i``'s tag, dense ``(D,)`` (a fresh tensor)."""
        return self.tag.narrow(i, i + 1).to_dense()[0]

    def field_vectors(self, i: int, names: Sequence[str]) -> dict[str, Tensor]:
        """Note ``i``'s fields ``names``, dense ``(D,)`` each (fresh tensors, one buffer)."""
        if not names:
            return {}
        row = self.pos[i].tolist()
        index = torch.tensor([row[FIELD_INDEX[n]] for n in names], dtype=_I64)
        return dict(zip(names, self.rows.select(index).to_dense().unbind(0)))


class _Ref:
    """Where a compact embedding's vectors are: note ``index`` of ``table``, fields ``names``
    (in the order the note was given them)."""

    __slots__ = ("index", "names", "table")

    def __init__(self, table: CompactVectors, index: int, names: tuple[str, ...]) -> None:
        self.table, self.index, self.names = table, index, names

    def value(self, name: str) -> Any:
        if name == "tag":
            return self.table.tag_vector(self.index)
        return self.table.field_vectors(self.index, self.names)


_NAMES: dict[tuple[str, ...], tuple[str, ...]] = {}


def _interned(names: tuple[str, ...]) -> tuple[str, ...]:
    return _NAMES.setdefault(names, names)


def compact_embedding(table: CompactVectors, index: int, names: Sequence[str]) -> MemoryEmbedding:
    """A plain :class:`MemoryEmbedding` whose ``tag`` and ``fields`` (``names``) are built on
    each read from note ``index`` of ``table``."""
    out = _new(MemoryEmbedding)
    out.__dict__["_compact"] = _Ref(table, index, _interned(tuple(names)))
    return out


def compact_ref(embedding: Any) -> _Ref | None:
    """The table reference of a compact embedding whose ``tag`` / ``fields`` were never
    assigned, else ``None``."""
    if type(embedding) is not MemoryEmbedding:
        return None
    state = embedding.__dict__
    ref = state.get("_compact")
    if ref is None or "tag" in state or "fields" in state:
        return None
    return ref  # type: ignore[no-any-return]


def _plain(t: Any) -> bool:
    return type(t) is Tensor and t.dtype is _F32 and t.device == _CPU and t.dim() == 1


def _eligible(embedding: Any, d: int, *, resolve: bool = False) -> bool:
    """A dense embedding whose every vector is a 1-D float32 CPU tensor of width ``d``.
    A store's deferred vectors (runtime/deferred.py) are built first when ``resolve``, else
    they do not qualify (a load stays deferred)."""
    if type(embedding) is not MemoryEmbedding:
        return False
    state = embedding.__dict__
    if "_pending" in state and ("tag" not in state or "fields" not in state):
        if not resolve:
            return False
        embedding.tag  # noqa: B018 - builds the deferred vectors (all of the load's at once)
    tag = state.get("tag")
    if tag is None and "_compact" in state:
        return False
    fields = state.get("fields")
    if not _plain(tag) or tag.shape[0] != d or type(fields) is not dict:
        return False
    return all(_plain(v) and v.shape[0] == d and n in FIELD_INDEX for n, v in fields.items())


def stack_sparse_tables(
    embeddings: Sequence[MemoryEmbedding | None], d: int, *, require: bool = False
) -> tuple[SparseRows, Tensor, SparseRows, Tensor] | None:
    """``(tag (N, D), tag_mask (N,), rows (P, D), pos (N, F) int32)`` of ``embeddings``, the
    tables held sparse: the snapshot's compact layout
    (:func:`~soulmem_torch.embedding.fields.stack_compact_field_embeddings`: rows grouped by
    field, note order within a field, a vector shared by several notes for one field — the
    same tensor memory or the same row of one table — stored once), the same values, built
    without a dense copy of the compact embeddings' vectors.

    ``None`` when the vectors are not all compact or plain float32 CPU tensors of width ``d``
    with finite values, or (unless ``require``) when more than ``COMPACT_MAX_DENSITY`` of the
    cells are non-zero or ``d < COMPACT_MIN_WIDTH``: the caller stacks them densely."""
    n, f = len(embeddings), len(FIELD_NAMES)
    if d < COMPACT_MIN_WIDTH and not require:
        return None
    whole = _whole_table(embeddings)
    if whole is not None:  # every note is row i of one table: its tables as they are
        mask = torch.ones(n, dtype=torch.bool)
        return whole.tag, mask, whole.rows, whole.pos
    index_of = FIELD_INDEX.get
    # sources: 0 = the dense vectors (stacked), k >= 1 = the k-th compact table
    tables: dict[int, int] = {}
    table_list: list[CompactVectors] = []
    pos_arrays: list[Any] = []  # each table's pos (numpy): a note's row read when met
    dense: list[Tensor] = []
    tag_src: list[tuple[int, int]] = []  # per note: (source, row) or (-1, 0) no embedding
    per_field: list[list[tuple[int, int]]] = [[] for _ in range(f)]
    seen: list[dict[Any, int]] = [{} for _ in range(f)]
    cells: list[int] = []
    local: list[int] = []
    cell_field: list[int] = []
    for i, emb in enumerate(embeddings):
        if emb is None:
            tag_src.append((-1, 0))
            continue
        ref = compact_ref(emb)
        if ref is not None:
            table = ref.table
            if table.dim != d:
                return None
            k = tables.get(id(table))
            if k is None:
                k = tables[id(table)] = len(table_list) + 1
                table_list.append(table)
                pos_arrays.append(table.arrays()[6])  # (not .tolist(): a bank's table is big)
            tag_src.append((k, ref.index))
            row = pos_arrays[k - 1][ref.index].tolist()
            for name in ref.names:
                j = index_of(name)
                if j is None or row[j] < 0:
                    return None
                key = (k, row[j])
                r = seen[j].get(key)
                if r is None:
                    r = seen[j][key] = len(per_field[j])
                    per_field[j].append(key)
                cells.append(i * f + j)
                local.append(r)
                cell_field.append(j)
            continue
        if not _eligible(emb, d, resolve=True):
            return None
        tag_src.append((0, len(dense)))
        dense.append(emb.tag)
        for name, vec in emb.fields.items():
            j = index_of(name)
            if j is None:
                continue
            key = (vec.data_ptr(), vec.stride(0))
            r = seen[j].get(key)
            if r is None:
                r = seen[j][key] = len(per_field[j])
                per_field[j].append((0, len(dense)))
                dense.append(vec)
            cells.append(i * f + j)
            local.append(r)
            cell_field.append(j)
    with torch.no_grad():
        stacked = torch.stack(dense) if dense else torch.zeros(0, d)
    if stacked.numel() and not require:
        total = int(stacked.shape[0]) * d
        nnz = int(torch.count_nonzero(stacked))
        if nnz > COMPACT_MAX_DENSITY * total:
            return None
    if stacked.numel():
        dense_table = SparseRows.from_dense(stacked)
        del stacked
        if dense_table.nnz and not bool(torch.isfinite(dense_table.val).all()):
            return None
    else:
        dense_table = SparseRows(torch.zeros(1, dtype=_I64), torch.zeros(0, dtype=torch.int32),
                                 torch.zeros(0), d)  # fmt: skip
    tag = _gather(dense_table, table_list, [t.tag for t in table_list], tag_src, d)
    field_src = [key for group in per_field for key in group]
    rows = _gather(dense_table, table_list, [t.rows for t in table_list], field_src, d)
    tag_mask = torch.tensor([s >= 0 for s, _ in tag_src], dtype=torch.bool)
    if not require and tag.nnz + rows.nnz > COMPACT_MAX_DENSITY * (len(tag) + len(rows)) * d:
        return None
    field_pos = torch.full((n * f,), -1, dtype=torch.int32)
    if cells:
        counts = torch.tensor([len(g) for g in per_field], dtype=_I64)
        offsets = torch.cumsum(counts, 0) - counts
        field_pos[torch.tensor(cells, dtype=_I64)] = (
            offsets[torch.tensor(cell_field, dtype=_I64)] + torch.tensor(local, dtype=_I64)
        ).to(torch.int32)
    return tag, tag_mask, rows, field_pos.view(n, f)


def _whole_table(embeddings: Sequence[MemoryEmbedding | None]) -> CompactVectors | None:
    """The table of which the embeddings are rows ``0, 1, …`` in order (all of its rows,
    every note embedded), else ``None``."""
    if not embeddings:
        return None
    first = compact_ref(embeddings[0])
    if first is None or len(first.table) != len(embeddings):
        return None
    table = first.table
    for i, emb in enumerate(embeddings):
        ref = compact_ref(emb)
        if ref is None or ref.table is not table or ref.index != i:
            return None
    return table


def _gather(
    dense_table: SparseRows,
    table_list: list[CompactVectors],
    sources: list[SparseRows],
    wanted: list[tuple[int, int]],
    d: int,
) -> SparseRows:
    """The rows ``wanted`` (``(source, row)``: 0 = ``dense_table``, k = ``sources[k - 1]``,
    -1 = an all-zero row), in order, as one table."""
    if not wanted:
        return SparseRows(torch.zeros(1, dtype=_I64), torch.zeros(0, dtype=torch.int32),
                          torch.zeros(0), d)  # fmt: skip
    src = torch.tensor([s for s, _ in wanted], dtype=_I64)
    row = torch.tensor([r for _, r in wanted], dtype=_I64)
    parts: list[SparseRows] = []
    where = torch.empty(len(wanted), dtype=_I64)
    offset = 0
    all_tables = [dense_table, *sources]
    for k, table in enumerate(all_tables):
        members = (src == k).nonzero().reshape(-1)
        if members.numel() == 0:
            continue
        parts.append(table.select(row[members]))
        where[members] = torch.arange(offset, offset + members.numel())
        offset += int(members.numel())
    zero = (src < 0).nonzero().reshape(-1)
    if zero.numel():
        crow = torch.zeros(int(zero.numel()) + 1, dtype=_I64)
        parts.append(SparseRows(crow, torch.zeros(0, dtype=torch.int32), torch.zeros(0), d))
        where[zero] = torch.arange(offset, offset + zero.numel())
        offset += int(zero.numel())
    joined = SparseRows.cat(parts) if len(parts) > 1 else parts[0]
    if len(parts) == 1 and bool((where == torch.arange(len(wanted))).all()):
        return joined
    return joined.select(where)


def pack_embeddings(
    embeddings: Sequence[MemoryEmbedding | None], d: int
) -> list[MemoryEmbedding | None] | None:
    """``embeddings`` as compact embeddings of one new :class:`CompactVectors` (``None``
    entries stay ``None``), or ``None`` when they do not qualify (see
    :func:`stack_sparse_tables`; the caller keeps them as they are)."""
    if not any(_eligible(e, d) for e in embeddings if e is not None):
        return None
    stacked = stack_sparse_tables(embeddings, d)
    if stacked is None:
        return None
    tag, _, rows, pos = stacked
    return share_tables(CompactVectors(tag, rows, pos), embeddings)


def pack_rows(
    rows: Tensor,
    tag_row: Sequence[int],
    fields: Sequence[dict[str, int]],
    sizes: Sequence[int],
) -> list[list[MemoryEmbedding]] | None:
    """The notes of each group as compact embeddings of the group's own
    :class:`CompactVectors`: the table :func:`pack_embeddings` would pack the group's dense
    views into (``MemoryCluster.add_notes``), the same tensors, built from the distinct vectors
    ``rows`` with whole-array steps instead of a pass over every note's vectors.

    Args:
        rows: shape (K, D). The distinct vectors (what :func:`~soulmem_torch.embedding.embed_notes`
            hands out views of).
        tag_row: shape (N,). Row of each note's tag.
        fields: N dicts. Each note's fields (name → row), in the note's order.
        sizes: notes per group, summing to N (the notes of group ``g`` follow group ``g - 1``'s).

    ``None`` (the caller keeps the dense views) where :func:`pack_embeddings` would leave a
    group's vectors dense: not float32 CPU, narrower than ``COMPACT_MIN_WIDTH``, a value not
    finite, a group more than ``COMPACT_MAX_DENSITY`` non-zero, or a field name outside
    ``FIELD_NAMES``."""
    n, f = len(tag_row), len(FIELD_NAMES)
    if len(fields) != n or sum(sizes) != n:
        raise ValidationError(
            f"fields / sizes: expected {n} notes (one per tag_row entry), found "
            f"{len(fields)} / {sum(sizes)}"
        )
    if rows.dim() != 2 or rows.dtype is not _F32 or rows.device != _CPU:
        return None
    k, d = (int(s) for s in rows.shape)
    if d < COMPACT_MIN_WIDTH:
        return None
    index_of = FIELD_INDEX.get
    names = [tuple(fs) for fs in fields]
    counts = np.fromiter(map(len, names), np.int64, n)
    field_j = np.fromiter(
        (index_of(name, -1) for fs in names for name in fs), np.int64, int(counts.sum())
    )
    if (field_j < 0).any():
        return None
    field_r = np.fromiter((r for fs in fields for r in fs.values()), np.int64, len(field_j))
    entry_note = np.repeat(np.arange(n, dtype=np.int64), counts)
    with torch.no_grad():
        table = SparseRows.from_dense(rows)
    if table.nnz and not bool(torch.isfinite(table.val).all()):
        return None
    tags = torch.as_tensor(np.asarray(tag_row, dtype=np.int64))
    note_cut = np.concatenate(([0], np.cumsum(np.asarray(sizes, dtype=np.int64))))
    entry_cut = np.searchsorted(entry_note, note_cut)
    out: list[list[MemoryEmbedding]] = []
    for g in range(len(sizes)):
        a, b = int(note_cut[g]), int(note_cut[g + 1])
        ea, eb = int(entry_cut[g]), int(entry_cut[g + 1])
        # each field's distinct rows in order of their first note, the fields in FIELD_NAMES
        # order: stack_sparse_tables' layout (its vectors are the distinct rows here)
        key = field_j[ea:eb] * max(k, 1) + field_r[ea:eb]
        distinct, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        order = np.lexsort((first, distinct // max(k, 1)))
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order), dtype=np.int64)
        tag = table.select(tags[a:b])
        field_rows = table.select(torch.from_numpy(distinct[order] % max(k, 1)))
        if tag.nnz + field_rows.nnz > COMPACT_MAX_DENSITY * (len(tag) + len(field_rows)) * d:
            return None
        pos = np.full((b - a, f), -1, dtype=np.int32)
        pos[entry_note[ea:eb] - a, field_j[ea:eb]] = rank[inverse.reshape(-1)]
        vectors = CompactVectors(tag, field_rows, torch.from_numpy(pos))
        out.append([compact_embedding(vectors, i, names[a + i]) for i in range(b - a)])
    return out


def share_tables(
    table: CompactVectors, embeddings: Sequence[MemoryEmbedding | None]
) -> list[MemoryEmbedding | None]:
    """Compact embeddings of ``table`` for ``embeddings`` (note ``i`` = row ``i``; each
    keeps its field names and their order), ``None`` where ``None``."""
    out: list[MemoryEmbedding | None] = []
    for i, emb in enumerate(embeddings):
        if emb is None:
            out.append(None)
            continue
        ref = compact_ref(emb)
        if ref is not None and ref.table is table and ref.index == i:
            out.append(emb)  # already this row of this table
            continue
        names = ref.names if ref is not None else tuple(emb.fields)
        out.append(compact_embedding(table, i, names))
    return out
