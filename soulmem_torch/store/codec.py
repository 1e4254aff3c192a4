"""Encodings of the SQLite store's blobs and the per-row checksums.

**Embedding blob** (one per embedded note; ``NULL`` for a note without one)::

    b"SE" | version u8 = 2 | dtype code u8 | D u32 | field bitmask u64 | layout u8 | count u32
    dense:  count = rows × D values
    sparse: count positions (u16, or u32 past 65,535 values) | count values

The rows are the tag vector, then the note's *present* fields in ``FIELD_NAMES`` order (the bit
``FIELD_INDEX[name]`` of the mask is set for each). Values are kept in their own dtype, bit for
bit (float32 for every built-in embedder; compared as bit patterns, so ``-0.0`` survives),
little-endian; sparse (the nonzero values and their flat positions) whenever that is smaller:
the offline ``HashingEmbedder``'s vectors are ~98 % zeros, so a note costs well under 1 KB
instead of 4 KB per field, and retrieval is unchanged by construction (the decoded tensors are
equal). :func:`decode_embeddings` decodes a whole store at once (one scatter per dtype and
width; every note's vectors are views into one buffer).

**Graph blob** (a tensor-built bank agent): ``b"SG" | version u8 | header length u32 | header
JSON | raw tensor bytes``; the header lists each tensor's dtype, shape and byte range, and the
node ids. Nothing is unpickled.

**Row checksum**: BLAKE2b-128 over the length-prefixed fields of a row (see :func:`row_digest`),
stored beside the row and verified on every read.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import struct
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from soulmem_torch.embedding.compact import (
    COMPACT_MAX_DENSITY,
    COMPACT_MIN_WIDTH,
    CompactVectors,
    compact_embedding,
    compact_ref,
)
from soulmem_torch.embedding.fields import FIELD_INDEX, FIELD_NAMES, MemoryEmbedding
from soulmem_torch.functional.sparse_rows import SparseRows
from soulmem_torch.runtime.cluster import mark_finite
from soulmem_torch.runtime.deferred import DecodedVectors, deferred_embedding

__all__ = [
    "decode_embedding",
    "decode_graph",
    "encode_embedding",
    "encode_graph",
    "first_bad_note_row",
    "note_digest",
    "row_digest",
]

_EMB_MAGIC = b"SE"
_GRAPH_MAGIC = b"SG"
_EMB_HEADER = struct.Struct("<2sBBIQBI")  # magic, version, dtype, D, field mask, layout, count
_DENSE, _SPARSE16, _SPARSE32 = 0, 1, 2
_GRAPH_HEADER = struct.Struct("<2sBI")

_DTYPES: dict[int, torch.dtype] = {
    1: torch.float32,
    2: torch.float64,
    3: torch.float16,
    4: torch.bfloat16,
}
_CODES = {dtype: code for code, dtype in _DTYPES.items()}
_ITEMSIZE = {code: torch.empty((), dtype=dtype).element_size() for code, dtype in _DTYPES.items()}
_BITS = {1: torch.int32, 2: torch.int64, 3: torch.int16, 4: torch.int16}
_NP_BITS = {2: np.int16, 4: np.int32, 8: np.int64}
_MASK_NAMES: dict[int, list[str]] = {}


class CodecError(ValueError):
    """A blob that does not decode (the caller names the row)."""


def row_digest(*parts: str | bytes | int | None) -> bytes:
    """BLAKE2b-128 of the parts, each length-prefixed (``None`` and ``b""`` differ)."""
    chunks: list[bytes] = []  # one hash call over the joined parts (a row is read per note)
    for part in parts:
        if part is None:
            chunks.append(_NONE)
            continue
        if isinstance(part, int):
            part = str(part)
        data = part.encode("utf-8") if isinstance(part, str) else bytes(part)
        chunks.append(_LENGTH(len(data)))
        chunks.append(data)
    return _blake2b(b"".join(chunks), digest_size=16).digest()


_NONE = b"\xff" * 8
_LENGTH = struct.Struct("<Q").pack
_blake2b = hashlib.blake2b


def note_digest(
    agent: str, id_: str, pos: int, note: str, rid: str | None, emb: bytes | None
) -> bytes:
    """``row_digest(agent, id_, pos, note, rid, emb)`` of a note row (the same bytes), unrolled
    for the load path (one call per stored note)."""
    if not (type(agent) is type(id_) is type(note) is str and type(pos) is int) or not (
        rid is None or type(rid) is str
    ) or not (emb is None or type(emb) is bytes):  # fmt: skip
        return row_digest(agent, id_, pos, note, rid, emb)
    a = agent.encode()
    return _unrolled_digest(_LENGTH(len(a)) + a, id_, pos, note, rid, emb)


def _unrolled_digest(
    head: bytes, id_: str, pos: int, note: bytes | str, rid: str | None, emb: bytes | None
) -> bytes:
    """:func:`row_digest` of a typed note row whose agent part (length + UTF-8) is ``head``;
    ``note`` may be its stored UTF-8 bytes."""
    i, p = id_.encode(), str(pos).encode()
    t = note if type(note) is bytes else note.encode()
    parts = [head, _LENGTH(len(i)), i, _LENGTH(len(p)), p, _LENGTH(len(t)), t]
    if rid is None:
        parts.append(_NONE)
    else:
        r = rid.encode()
        parts += (_LENGTH(len(r)), r)
    if emb is None:
        parts.append(_NONE)
    else:
        parts += (_LENGTH(len(emb)), emb)
    return _blake2b(b"".join(parts), digest_size=16).digest()


def first_bad_note_row(agent: str, rows: Sequence[Sequence[Any]]) -> int | None:
    """The index of the first note row ``(id, pos, note, rid, emb, sha)`` whose ``sha`` is not
    its :func:`note_digest` (``None``: every one matches): the same bytes hashed, in one loop
    over the rows (a load verifies every row; the note may be its stored UTF-8 bytes)."""
    a = agent.encode("utf-8")
    head = _LENGTH(len(a)) + a
    digest = _unrolled_digest
    for k, (id_, pos, note, rid, emb, sha) in enumerate(rows):
        if type(id_) is not str or type(pos) is not int or not (
            type(note) is bytes or type(note) is str
        ) or not (rid is None or type(rid) is str) or not (emb is None or type(emb) is bytes):  # fmt: skip
            if sha != row_digest(agent, id_, pos, note, rid, emb):
                return k
            continue
        if digest(head, id_, pos, note, rid, emb) != sha:
            return k
    return None


def encode_embedding(emb: MemoryEmbedding) -> bytes:
    """The blob of one (validated) embedding: the tag and the present fields, sparse when
    that is smaller (the nonzero bit patterns and their flat positions), else dense."""
    ref = compact_ref(emb)
    if ref is not None:
        return _encode_compact(ref)
    fields = emb.fields  # read once (a compact embedding builds them on each read)
    names = sorted(fields, key=FIELD_INDEX.__getitem__)
    vectors = [emb.tag.detach(), *(fields[n].detach() for n in names)]
    dtype = vectors[0].dtype
    for v in vectors[1:]:
        dtype = torch.promote_types(dtype, v.dtype)
    if dtype not in _CODES:
        dtype = torch.float32
    code = _CODES[dtype]
    matrix = torch.stack([v.to("cpu", dtype) for v in vectors]).contiguous()
    mask = 0
    for n in names:
        mask |= 1 << FIELD_INDEX[n]
    bits = matrix.view(_BITS[code]).flatten().numpy()  # the exact bit patterns (keeps -0.0)
    where = np.flatnonzero(bits)
    itemsize = _ITEMSIZE[code]
    index_type = np.dtype("<u2") if bits.size <= 0xFFFF else np.dtype("<u4")
    sparse = where.size * (index_type.itemsize + itemsize) < bits.size * itemsize
    layout = (_SPARSE16 if index_type.itemsize == 2 else _SPARSE32) if sparse else _DENSE
    header = _EMB_HEADER.pack(_EMB_MAGIC, 2, code, int(matrix.shape[1]), mask, layout,
                              int(where.size if sparse else bits.size))  # fmt: skip
    little = bits.astype(bits.dtype.newbyteorder("<"), copy=False)
    if not sparse:
        return header + little.tobytes()
    return header + where.astype(index_type).tobytes() + little[where].tobytes()


def _encode_compact(ref: Any) -> bytes:
    """:func:`encode_embedding` of a compact embedding (embedding/compact.py) read off its
    table's cells without a dense copy: the same bytes (its cells are its non-zero values)."""
    table = ref.table
    t_crow, t_col, t_val, r_crow, r_col, r_val, pos = table.arrays()
    names = sorted(ref.names, key=FIELD_INDEX.__getitem__)
    dim = table.dim
    i = ref.index
    row = pos[i]
    mask = 0
    lo, hi = int(t_crow[i]), int(t_crow[i + 1])
    cols = [t_col[lo:hi].astype(np.int64)]
    vals = [t_val[lo:hi]]
    for k, n in enumerate(names, start=1):
        j = FIELD_INDEX[n]
        mask |= 1 << j
        r = int(row[j])
        lo, hi = int(r_crow[r]), int(r_crow[r + 1])
        cols.append(r_col[lo:hi].astype(np.int64) + k * dim)
        vals.append(r_val[lo:hi])
    where = np.concatenate(cols)
    little = np.concatenate(vals).view(np.int32).astype(np.dtype("<i4"), copy=False)
    code = _CODES[torch.float32]
    size = (1 + len(names)) * dim
    itemsize = _ITEMSIZE[code]
    index_type = np.dtype("<u2") if size <= 0xFFFF else np.dtype("<u4")
    sparse = where.size * (index_type.itemsize + itemsize) < size * itemsize
    layout = (_SPARSE16 if index_type.itemsize == 2 else _SPARSE32) if sparse else _DENSE
    header = _EMB_HEADER.pack(_EMB_MAGIC, 2, code, dim, mask, layout,
                              int(where.size if sparse else size))  # fmt: skip
    if not sparse:
        dense = np.zeros(size, dtype=np.dtype("<i4"))
        dense[where] = little
        return header + dense.tobytes()
    return header + where.astype(index_type).tobytes() + little.tobytes()


def decode_embedding(blob: bytes) -> MemoryEmbedding:
    """Inverse of :func:`encode_embedding` (one blob; see :func:`decode_embeddings`).

    Raises:
        CodecError: a bad header, dtype, field mask or payload size.
    """
    out = decode_embeddings([blob])[0]
    assert out is not None
    return out


def _header(blob: bytes) -> tuple[int, int, list[str], int, int]:
    if len(blob) < _EMB_HEADER.size:
        raise CodecError(f"embedding blob of {len(blob)} bytes is shorter than its header")
    magic, version, code, dim, mask, layout, count = _EMB_HEADER.unpack_from(blob)
    if magic != _EMB_MAGIC or version != 2:
        raise CodecError(f"embedding blob: unknown header {magic!r} version {version}")
    if code not in _DTYPES or dim < 1 or layout not in (_DENSE, _SPARSE16, _SPARSE32):
        raise CodecError(f"embedding blob: bad dtype code {code}, width {dim} or layout {layout}")
    names = _MASK_NAMES.get(mask)
    if names is None:
        if mask >> len(FIELD_NAMES):
            raise CodecError(f"embedding blob: field mask {mask:#x} names unknown fields")
        names = _MASK_NAMES[mask] = [n for n in FIELD_NAMES if mask >> FIELD_INDEX[n] & 1]
    size = (1 + len(names)) * dim
    itemsize = _ITEMSIZE[code]
    width = {_DENSE: 0, _SPARSE16: 2, _SPARSE32: 4}[layout]
    expect = _EMB_HEADER.size + count * (width + itemsize)
    if len(blob) != expect or (layout == _DENSE and count != size) or count > size:
        raise CodecError(
            f"embedding blob: {len(blob)} bytes do not fit {1 + len(names)} × {dim} values "
            f"({count} stored)"
        )
    return code, dim, names, layout, count


_HEAD = np.dtype([("magic", "S2"), ("version", "u1"), ("code", "u1"), ("dim", "<u4"),
                  ("mask", "<u8"), ("layout", "u1"), ("count", "<u4")])  # fmt: skip
_WIDTH = np.array([0, 2, 4], dtype=np.int64)  # index bytes per stored value, by layout


def decode_embeddings(blobs: Sequence[bytes | None]) -> list[MemoryEmbedding | None]:
    """Decodes many blobs at once: one zero-filled buffer per (dtype, width), the stored
    values scattered into it in one vectorized step, and each note's vectors views into it.

    Raises:
        CodecError: naming the position (in ``blobs``) of a blob that does not decode.
    """
    out = _decode_bulk(blobs)
    return out if out is not None else _decode_each(blobs)


def _decode_bulk(blobs: Sequence[bytes | None]) -> list[MemoryEmbedding | None] | None:
    """The common case in whole-array steps: every blob of one dtype and width, headers
    parsed and checked together. ``None`` when anything is unusual (several dtypes or widths,
    any bad blob): :func:`_decode_each` then decodes them (and names a bad one)."""
    present = [i for i, b in enumerate(blobs) if b is not None]
    out: list[MemoryEmbedding | None] = [None] * len(blobs)
    if not present:
        return out
    parts = [blobs[i] for i in present]
    n = len(parts)
    if not all(type(b) is bytes for b in parts):
        return None
    lengths = np.fromiter(map(len, parts), dtype=np.int64, count=n)
    if int(lengths.min()) < _EMB_HEADER.size:
        return None
    heads = np.frombuffer(b"".join(b[: _EMB_HEADER.size] for b in parts), dtype=_HEAD)
    code, dim = int(heads["code"][0]), int(heads["dim"][0])
    floats = _NP_FLOATS.get(code)
    if floats is None:  # bfloat16 (no numpy dtype): decoded blob by blob
        return None
    value_type = np.dtype(floats).newbyteorder("<")
    layout = heads["layout"]
    mask = heads["mask"]
    if (
        code not in _DTYPES
        or dim < 1
        or (heads["magic"] != _EMB_MAGIC).any()
        or (heads["version"] != 2).any()
        or (heads["code"] != code).any()
        or (heads["dim"] != dim).any()
        or (layout > _SPARSE32).any()
        or (mask >> np.uint64(len(FIELD_NAMES))).any()
    ):
        return None
    count = heads["count"].astype(np.int64)
    rows = 1 + np.bitwise_count(mask).astype(np.int64)
    size = rows * dim
    itemsize = _ITEMSIZE[code]
    width = _WIDTH[layout]
    if (
        (_EMB_HEADER.size + count * (width + itemsize) != lengths).any()
        or ((layout == _DENSE) & (count != size)).any()
        or (count > size).any()
    ):
        return None
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(rows, out=starts[1:])
    bits_type = np.dtype(_NP_BITS[itemsize]).newbyteorder("<")
    sparse: list[tuple[np.ndarray, np.ndarray]] = []  # (flat positions, values)
    dense: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (values, bases, counts)
    for kind, index_type in ((_DENSE, None), (_SPARSE16, "<u2"), (_SPARSE32, "<u4")):
        chosen = np.flatnonzero(layout == kind)
        if not chosen.size:
            continue
        sel = chosen.tolist()
        cnt = count[chosen]
        total = int(cnt.sum())
        if not total:
            continue
        head = _EMB_HEADER.size
        widths = int(_WIDTH[kind])
        values = np.frombuffer(
            b"".join(parts[k][head + c * widths :] for k, c in zip(sel, cnt.tolist())),
            dtype=bits_type,
        )
        if not np.isfinite(values.view(value_type)).all():  # only the stored values: the
            return None  # zeros around them are finite; _decode_each names the blob
        if index_type is None:  # a dense blob: its rows × dim values, in order
            dense.append((values, starts[chosen] * dim, cnt))
            continue
        first = np.zeros(len(sel), dtype=np.int64)
        np.cumsum(cnt[:-1], out=first[1:])
        owner = np.repeat(np.arange(len(sel)), cnt)
        local = np.frombuffer(
            b"".join(parts[k][head : head + c * widths] for k, c in zip(sel, cnt.tolist())),
            dtype=index_type,
        ).astype(np.int64)
        if (local >= size[chosen][owner]).any():
            return None
        local += (starts[chosen] * dim)[owner]
        sparse.append((local, values))

    def fill(flat: np.ndarray) -> None:  # the stored values into the zeroed buffer
        for positions, values in sparse:
            flat[positions] = values
        for values, bases, counts in dense:
            first = np.zeros(counts.size, dtype=np.int64)
            np.cumsum(counts[:-1], out=first[1:])
            owner = np.repeat(np.arange(counts.size), counts)
            flat[np.arange(values.size, dtype=np.int64) - first[owner] + bases[owner]] = values

    if _DTYPES[code] is torch.float32 and dim >= COMPACT_MIN_WIDTH:
        table = _compact_table(sparse, dense, starts, mask, dim, value_type, n)
        if table is not None:  # the vectors stay sparse: the snapshot's layout, built later
            names_of = _MASK_NAMES
            for k, (i, m) in enumerate(zip(present, mask.tolist())):
                names = names_of.get(m)
                if names is None:
                    names = names_of[m] = [f for f in FIELD_NAMES if m >> FIELD_INDEX[f] & 1]
                out[i] = compact_embedding(table, k, names)
            return out
    source = DecodedVectors(rows=int(starts[-1]), dim=dim, dtype=_DTYPES[code], floats=floats,
                            bits=bits_type, fill=fill, zeroed=zeroed, on_built=mark_finite)  # fmt: skip
    names_of = _MASK_NAMES
    lows = starts.tolist()
    for k, (i, m) in enumerate(zip(present, mask.tolist())):
        names = names_of.get(m)
        if names is None:
            names = names_of[m] = [f for f in FIELD_NAMES if m >> FIELD_INDEX[f] & 1]
        out[i] = deferred_embedding(source, lows[k], names)
    return out


def _compact_table(
    sparse: Sequence[tuple[np.ndarray, np.ndarray]],
    dense: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
    starts: np.ndarray,
    mask: np.ndarray,
    dim: int,
    value_type: np.dtype,
    n: int,
) -> CompactVectors | None:
    """The decoded float32 vectors of ``n`` notes as one :class:`CompactVectors` — the
    table ``MemoryCluster.add_notes`` packs and a snapshot stacks from them (the tags, then
    each field's rows in note order; its cells are the stored ones, bit for bit: a -0.0
    stays a cell) — built from the stored cells on its first read (:class:`_LoadedVectors`:
    a load stays a load; no dense buffer ever), or ``None`` when more than
    ``COMPACT_MAX_DENSITY`` of the cells are non-zero (the vectors then stay dense:
    deferred, as before).

    ``sparse``: (flat positions, value bits) of the sparse blobs; ``dense``: (value bits,
    first flat position, count) of the dense ones; ``starts``: each note's first row of
    the flat ``(rows, dim)`` layout (its tag, then its fields in ``FIELD_NAMES`` order);
    ``mask``: each note's field bits."""
    total = int(starts[-1])
    cells = sum(len(where) for where, _ in sparse)  # (a sparse blob stores non-zero bits only)
    cells += sum(int(np.count_nonzero(bits)) for bits, _, _ in dense)
    if cells > COMPACT_MAX_DENSITY * total * dim:
        return None

    def build() -> tuple[SparseRows, SparseRows, Tensor]:
        return _compact_layout(*_stored_cells(sparse, dense, value_type), starts, mask, dim, n)

    return _LoadedVectors(build, dim, n)


class _LoadedVectors(CompactVectors):
    """A load's :class:`CompactVectors`: its width and length known, its tables built from
    the stored cells (checked by the decoder) on the first read of ``tag``, ``rows`` or
    ``pos`` (thread-safe; once)."""

    __slots__ = ("_build", "_len", "_lock", "_width")

    def __init__(self, build: Any, dim: int, n: int) -> None:  # (the tables come later)
        self._build, self._width, self._len = build, dim, n
        self._lock = threading.Lock()
        self._arrays = None

    def __getattr__(self, name: str) -> Any:  # only for an unset slot: a table not built
        if name not in ("tag", "rows", "pos"):
            raise AttributeError(name)
        with self._lock:
            if self._build is not None:
                self.tag, self.rows, self.pos = self._build()
                self._build = None
        return object.__getattribute__(self, name)

    @property
    def dim(self) -> int:
        return self._width

    def __reduce__(self) -> tuple[Any, ...]:  # copy / pickle: a plain table, built
        return (CompactVectors, (self.tag, self.rows, self.pos))

    def __len__(self) -> int:
        return self._len


def _stored_cells(
    sparse: Sequence[tuple[np.ndarray, np.ndarray]],
    dense: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
    value_type: np.dtype,
) -> tuple[np.ndarray, np.ndarray]:
    """``(flat positions ascending, float32 values)`` of every stored non-zero bit pattern."""
    positions, values = [], []
    for where, bits in sparse:
        positions.append(where)
        values.append(bits.view(value_type))
    for bits, bases, counts in dense:
        first = np.zeros(counts.size, dtype=np.int64)
        np.cumsum(counts[:-1], out=first[1:])
        owner = np.repeat(np.arange(counts.size), counts)
        nz = np.flatnonzero(bits)  # every non-zero bit pattern (-0.0 too: bit for bit)
        positions.append((nz - first[owner[nz]] + bases[owner[nz]]).astype(np.int64))
        values.append(bits[nz].view(value_type))
    if not positions:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
    pos = np.concatenate(positions)
    val = np.concatenate(values).astype(np.float32)
    if len(pos) > 1 and not bool((pos[1:] > pos[:-1]).all()):
        order = np.argsort(pos, kind="stable")  # (blobs of several layouts, or unsorted)
        pos, val = pos[order], val[order]
    return pos, val


def _compact_layout(
    pos: np.ndarray, val: np.ndarray, starts: np.ndarray, mask: np.ndarray, dim: int, n: int
) -> tuple[SparseRows, SparseRows, Tensor]:
    """``(tag, rows, pos)`` of a :class:`CompactVectors` from the cells of the flat layout."""
    total = int(starts[-1])
    f = len(FIELD_NAMES)
    has = ((mask[:, None] >> np.arange(f, dtype=np.uint64)) & np.uint64(1)).astype(bool)
    rank = np.cumsum(has, axis=1) - 1  # a field's row within its note, after the tag
    field, note = np.nonzero(has.T)  # grouped by field, notes in order within a field
    field_pos = np.full((n, f), -1, dtype=np.int32)
    field_pos[note, field] = np.arange(len(note), dtype=np.int32)
    field_rows = starts[note] + 1 + rank[note, field]  # their rows of the flat layout
    kind = np.full(total, -1, dtype=np.int8)  # each flat row: -1 a tag, else its field
    kind[field_rows] = field
    row = pos // dim
    per_row = np.bincount(row, minlength=total)
    # the cells in table order: the tags' first, then each field's; a stable sort of a
    # small-integer key keeps the notes' (flat) order within each
    order = np.argsort(kind[row], kind="stable")
    pos, val = pos[order], val[order]
    col = (pos % dim).astype(np.int32)
    tag_crow = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(per_row[starts[:-1]], out=tag_crow[1:])
    rows_crow = np.zeros(len(note) + 1, dtype=np.int64)
    np.cumsum(per_row[field_rows], out=rows_crow[1:])
    cut = int(tag_crow[-1])
    tag = SparseRows(
        torch.from_numpy(tag_crow), torch.from_numpy(col[:cut]), torch.from_numpy(val[:cut]), dim
    )
    rows = SparseRows(
        torch.from_numpy(rows_crow),
        torch.from_numpy(col[cut:]),
        torch.from_numpy(val[cut:]),
        dim,
    )
    return tag, rows, torch.from_numpy(field_pos)


def _decode_each(blobs: Sequence[bytes | None]) -> list[MemoryEmbedding | None]:
    heads: list[tuple[int, int, list[str], int, int] | None] = []
    for i, blob in enumerate(blobs):
        if blob is None:
            heads.append(None)
            continue
        try:
            heads.append(_header(blob))
        except CodecError as exc:
            raise CodecError(f"blob {i}: {exc}") from None
    out: list[MemoryEmbedding | None] = [None] * len(blobs)
    groups: dict[tuple[int, int], list[int]] = {}
    for i, head in enumerate(heads):
        if head is not None:
            groups.setdefault((head[0], head[1]), []).append(i)
    for (code, dim), members in groups.items():
        rows = [1 + len(heads[i][2]) for i in members]  # type: ignore[index]
        starts = np.zeros(len(members) + 1, dtype=np.int64)
        np.cumsum(rows, out=starts[1:])
        bits_type = np.dtype(_NP_BITS[_ITEMSIZE[code]]).newbyteorder("<")
        flat = np.zeros(int(starts[-1]) * dim, dtype=bits_type)
        positions: list[np.ndarray] = []
        values: list[np.ndarray] = []
        for k, i in enumerate(members):
            _, _, _, layout, count = heads[i]  # type: ignore[misc]
            blob = blobs[i]
            base = int(starts[k]) * dim
            if layout == _DENSE:
                flat[base : base + count] = np.frombuffer(blob, bits_type, count, _EMB_HEADER.size)  # type: ignore[arg-type]
                continue
            index_type = "<u2" if layout == _SPARSE16 else "<u4"
            width = 2 if layout == _SPARSE16 else 4
            where = np.frombuffer(blob, index_type, count, _EMB_HEADER.size)  # type: ignore[arg-type]
            if count and int(where.max()) >= rows[k] * dim:
                raise CodecError(f"blob {i}: a stored position lies outside its vectors")
            positions.append(where.astype(np.int64) + base)
            values.append(np.frombuffer(blob, bits_type, count, _EMB_HEADER.size + count * width))  # type: ignore[arg-type]
        if positions:
            flat[np.concatenate(positions)] = np.concatenate(values)
        native = flat.astype(flat.dtype.newbyteorder("="), copy=False)
        dtype = _DTYPES[code]
        floats = _NP_FLOATS.get(code)
        if floats is not None:  # the buffer as its floats (views of it share one base)
            root = torch.from_numpy(native.view(floats))
        else:  # bfloat16: no numpy dtype
            root = torch.from_numpy(native).view(dtype)
        bad = _first_non_finite_row(root, dim)
        if bad is not None:
            k = int(np.searchsorted(starts, bad, side="right")) - 1
            raise CodecError(f"blob {members[k]}: a stored value is NaN or infinite")
        mark_finite(root._base if root._base is not None else root, dtype)
        matrix = root.view(-1, dim)
        vectors = matrix.unbind(0)
        for k, i in enumerate(members):
            lo, hi = int(starts[k]), int(starts[k + 1])
            names = heads[i][2]  # type: ignore[index]
            out[i] = MemoryEmbedding(tag=vectors[lo], fields=dict(zip(names, vectors[lo + 1 : hi])))
    return out


_NP_FLOATS = {1: np.float32, 2: np.float64, 3: np.float16}
_MMAP_MIN = 64 << 20  # bytes from which a decode buffer is mapped directly (see zeroed)


def zeroed(count: int, dtype: np.dtype) -> np.ndarray:
    """A zero-filled 1-D array. A big one (a whole store's vectors: 1.6 GB at 100,000 notes)
    is an anonymous private mapping of its own: zero pages from the kernel like
    ``np.zeros``, but without the transparent-huge-page advice numpy gives big arrays, whose
    first touch can stall in the kernel's memory compaction (measured: 1.4–1.9 s of CPU to
    fill 1.6 GB on a busy 24 GiB box, 0.8 s with plain pages; benchmarks/RESULTS.md). The
    mapping is unmapped when the last view of it is gone."""
    nbytes = count * dtype.itemsize
    if nbytes < _MMAP_MIN or not hasattr(mmap, "MAP_PRIVATE"):
        return np.zeros(count, dtype=dtype)
    try:
        buffer = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, ValueError):  # no room for the mapping: numpy says so clearly
        return np.zeros(count, dtype=dtype)
    return np.frombuffer(buffer, dtype=dtype, count=count)


def _first_non_finite_row(flat: torch.Tensor, dim: int) -> int | None:
    """The first row (of ``dim`` values) of a 1-D buffer that holds a NaN / inf, or ``None``
    (one chunked pass; numpy where it has the dtype)."""
    step = max(dim, (1 << 20) // dim * dim)
    for lo in range(0, flat.numel(), step):
        part = flat[lo : lo + step]
        ok = part.numpy() if part.dtype != torch.bfloat16 else None
        finite = np.isfinite(ok) if ok is not None else torch.isfinite(part).numpy()
        if not finite.all():
            return (lo + int(np.flatnonzero(~finite)[0])) // dim
    return None


_GRAPH_KEYS = (
    "edge_index", "edge_kind", "node_type", "intensity", "confidence", "prob", "tag_emb",
    "tag_mask", "field_emb", "field_mask", "create_time_ns", "retrieval_count",
)  # fmt: skip
_TENSOR_DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool,
              torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
}  # fmt: skip


def encode_graph(graph: Any) -> bytes:
    """The blob of a tensor-built ``MemoryGraph`` (its tensors and node ids)."""
    header: dict[str, Any] = {"ids": [str(i) for i in graph.ids], "tensors": {}}
    chunks: list[bytes] = []
    offset = 0
    for key in _GRAPH_KEYS:
        value = getattr(graph, key, None)
        if value is None:
            continue
        t = value.detach().to("cpu").contiguous()
        data = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header["tensors"][key] = {
            "dtype": str(t.dtype).removeprefix("torch."),
            "shape": list(t.shape),
            "offset": offset,
            "bytes": len(data),
        }
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    return _GRAPH_HEADER.pack(_GRAPH_MAGIC, 1, len(text)) + text + b"".join(chunks)


def decode_graph(blob: bytes) -> tuple[list[str], dict[str, torch.Tensor]]:
    """Inverse of :func:`encode_graph`: ``(ids, tensors)``.

    Raises:
        CodecError: a bad header or a tensor that does not fit its bytes.
    """
    if len(blob) < _GRAPH_HEADER.size:
        raise CodecError("graph blob is shorter than its header")
    magic, version, length = _GRAPH_HEADER.unpack_from(blob)
    if magic != _GRAPH_MAGIC or version != 1:
        raise CodecError(f"graph blob: unknown header {magic!r} version {version}")
    start = _GRAPH_HEADER.size
    try:
        header = json.loads(blob[start : start + length].decode("utf-8"))
        ids = [str(i) for i in header["ids"]]
        specs: Mapping[str, Any] = header["tensors"]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise CodecError(f"graph blob: bad header ({exc})") from None
    body = memoryview(blob)[start + length :]
    out: dict[str, torch.Tensor] = {}
    for key, spec in specs.items():
        try:
            dtype = _TENSOR_DTYPES[spec["dtype"]]
            shape = [int(s) for s in spec["shape"]]
            lo, size = int(spec["offset"]), int(spec["bytes"])
        except (KeyError, TypeError, ValueError):
            raise CodecError(f"graph blob: bad entry for tensor {key!r}") from None
        if key not in _GRAPH_KEYS or lo < 0 or lo + size > len(body):
            raise CodecError(f"graph blob: tensor {key!r} lies outside the blob")
        numel = 1
        for s in shape:
            numel *= s
        itemsize = torch.empty((), dtype=dtype).element_size()
        if numel * itemsize != size:
            raise CodecError(f"graph blob: tensor {key!r} {shape} {dtype} needs {numel * itemsize} "
                             f"bytes, found {size}")  # fmt: skip
        data = bytearray(body[lo : lo + size])
        out[key] = (
            torch.frombuffer(data, dtype=dtype).view(shape)
            if size
            else torch.empty(shape, dtype=dtype)
        )
    return ids, out


def chunks_of(items: Iterable[Any], size: int) -> Iterable[list[Any]]:
    """Lists of at most ``size`` items (for SQL ``IN`` lists within SQLite's variable limit)."""
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
