"""Encodings of the SQLite store's blobs and the per-row checksums.

**Embedding blob** (one per embedded note; ``NULL`` for a note without one)::

    b"SE" | version u8 = 1 | dtype code u8 | D u32 | field bitmask u64 | zlib(rows × D values)

The rows are the tag vector, then the note's *present* fields in ``FIELD_NAMES`` order (the bit
``FIELD_INDEX[name]`` of the mask is set for each). Values are kept in their own dtype, bit for
bit (float32 for every built-in embedder) and deflated (zlib level 1): the offline
``HashingEmbedder``'s vectors are ~98 % zeros, so a note costs a few hundred bytes instead of
4 KB per field, and retrieval is unchanged by construction (the decoded tensors are equal).

**Graph blob** (a tensor-built bank agent): ``b"SG" | version u8 | header length u32 | header
JSON | raw tensor bytes``; the header lists each tensor's dtype, shape and byte range, and the
node ids. Nothing is unpickled.

**Row checksum**: BLAKE2b-128 over the length-prefixed fields of a row (see :func:`row_digest`),
stored beside the row and verified on every read.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from soulmem_torch.embedding.fields import FIELD_INDEX, FIELD_NAMES, MemoryEmbedding

__all__ = [
    "decode_embedding",
    "decode_graph",
    "encode_embedding",
    "encode_graph",
    "row_digest",
]

_EMB_MAGIC = b"SE"
_GRAPH_MAGIC = b"SG"
_EMB_HEADER = struct.Struct("<2sBBIQ")
_GRAPH_HEADER = struct.Struct("<2sBI")

_DTYPES: dict[int, torch.dtype] = {
    1: torch.float32,
    2: torch.float64,
    3: torch.float16,
    4: torch.bfloat16,
}
_CODES = {dtype: code for code, dtype in _DTYPES.items()}


class CodecError(ValueError):
    """A blob that does not decode (the caller names the row)."""


def row_digest(*parts: str | bytes | int | None) -> bytes:
    """BLAKE2b-128 of the parts, each length-prefixed (``None`` and ``b""`` differ)."""
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        if part is None:
            h.update(b"\xff" * 8)
            continue
        if isinstance(part, int):
            part = str(part)
        data = part.encode("utf-8") if isinstance(part, str) else bytes(part)
        h.update(struct.pack("<Q", len(data)))
        h.update(data)
    return h.digest()


def encode_embedding(emb: MemoryEmbedding) -> bytes:
    """The blob of one (validated) embedding: the tag and the present fields, deflated."""
    names = sorted(emb.fields, key=FIELD_INDEX.__getitem__)
    vectors = [emb.tag.detach(), *(emb.fields[n].detach() for n in names)]
    dtype = vectors[0].dtype
    for v in vectors[1:]:
        dtype = torch.promote_types(dtype, v.dtype)
    if dtype not in _CODES:
        dtype = torch.float32
    matrix = torch.stack([v.to("cpu", dtype) for v in vectors]).contiguous()
    mask = 0
    for n in names:
        mask |= 1 << FIELD_INDEX[n]
    raw = matrix.view(torch.uint8).numpy().tobytes()
    header = _EMB_HEADER.pack(_EMB_MAGIC, 1, _CODES[dtype], int(matrix.shape[1]), mask)
    return header + zlib.compress(raw, 1)


def decode_embedding(blob: bytes) -> MemoryEmbedding:
    """Inverse of :func:`encode_embedding`.

    Raises:
        CodecError: a bad header, dtype, field mask or payload size.
    """
    if len(blob) < _EMB_HEADER.size:
        raise CodecError(f"embedding blob of {len(blob)} bytes is shorter than its header")
    magic, version, code, dim, mask = _EMB_HEADER.unpack_from(blob)
    if magic != _EMB_MAGIC or version != 1:
        raise CodecError(f"embedding blob: unknown header {magic!r} version {version}")
    dtype = _DTYPES.get(code)
    if dtype is None or dim < 1:
        raise CodecError(f"embedding blob: bad dtype code {code} or width {dim}")
    if mask >> len(FIELD_NAMES):
        raise CodecError(f"embedding blob: field mask {mask:#x} names unknown fields")
    names = [n for n in FIELD_NAMES if mask >> FIELD_INDEX[n] & 1]
    try:
        raw = zlib.decompress(blob[_EMB_HEADER.size :])
    except zlib.error as exc:
        raise CodecError(f"embedding blob: {exc}") from None
    rows = 1 + len(names)
    itemsize = torch.empty((), dtype=dtype).element_size()
    if len(raw) != rows * dim * itemsize:
        raise CodecError(
            f"embedding blob: expected {rows * dim * itemsize} bytes ({rows} × {dim} "
            f"{dtype}), found {len(raw)}"
        )
    matrix = torch.frombuffer(bytearray(raw), dtype=dtype).view(rows, dim)
    return MemoryEmbedding(tag=matrix[0], fields=dict(zip(names, matrix[1:].unbind(0))))


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
