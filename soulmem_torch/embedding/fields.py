"""Field layout of note and query embeddings (docs/spec.md §3), shared by the embedder, graph and kernels.

Every note kind stores a tag vector plus a fixed set of named field vectors. ``FIELD_NAMES`` is
the column order of ``MemoryGraph.field_pos`` ``(N, F)`` (the compact layout: the row of
``field_rows`` ``(P, D)`` of each note field, :func:`stack_compact_field_embeddings`) and of the
dense ``field_emb`` ``(N, F, D)`` / ``field_mask`` ``(N, F)`` (:func:`stack_field_embeddings`).
``QUERY_FIELD_NAMES`` is the column order of a query batch's ``field`` ``(B, U, Q, D)`` /
``field_mask`` ``(B, U, Q)`` (one row per query unit).

Which note fields a note has:

=======================  =====================================================================
note kind                fields
=======================  =====================================================================
Semantic                 ``content``, ``aliases``, ``description``
SpecificSituation        ``narrative``, ``environment_*``; ``location_*`` if it has a location;
                         ``participant_*`` if it has participants; ``event_*`` if it has events
AbstractSituation        the fields of its one leaf plus ``fused_self``
Procedure                none
=======================  =====================================================================

The leaf kind of an abstract note is the leaf whose fields are present (``location_name``,
``participant_name``, ``environment_atmosphere`` or ``event_action``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from soulmem_torch.errors import ValidationError

if TYPE_CHECKING:
    from soulmem_torch.model import MemoryNote

__all__ = [
    "FIELD_INDEX",
    "FIELD_NAMES",
    "QUERY_FIELD_INDEX",
    "QUERY_FIELD_NAMES",
    "QUERY_SEMANTIC",
    "QUERY_SITUATION",
    "EmbeddedMemoryNote",
    "MemoryEmbedding",
    "compact_to_dense",
    "dense_to_compact",
    "stack_compact_field_embeddings",
    "stack_field_embeddings",
    "stack_plain_embeddings",
]

FIELD_NAMES: tuple[str, ...] = (
    # Semantic
    "content",
    "aliases",
    "description",
    # SpecificSituation (and, for the leaf fields, AbstractSituation)
    "narrative",
    "location_name",
    "location_coordinates",
    "participant_name",
    "participant_role",
    "participant_fused",
    "environment_atmosphere",
    "environment_tone",
    "event_action",
    "event_initiator",
    "event_target",
    # AbstractSituation only
    "fused_self",
)
FIELD_INDEX: dict[str, int] = {name: i for i, name in enumerate(FIELD_NAMES)}

QUERY_FIELD_NAMES: tuple[str, ...] = (
    # SemanticQueryUnit
    "concept",
    "description",
    # SituationQueryUnit (several locations / participants / events are mean-pooled per field)
    "narrative",
    "location_name",
    "location_coordinates",
    "participant_name",
    "participant_role",
    "environment_atmosphere",
    "environment_tone",
    "event_action",
    "event_initiator",
    "event_target",
)
QUERY_FIELD_INDEX: dict[str, int] = {name: i for i, name in enumerate(QUERY_FIELD_NAMES)}

# query ``kind`` codes (the variant of ``MemoryRetrieveQuery``)
QUERY_SEMANTIC = 0
QUERY_SITUATION = 1


def _check_vector(what: str, value: Any, dim: int | None) -> Tensor:
    """A 1-D finite float tensor (numpy arrays and lists are converted); returns it."""
    if not isinstance(value, Tensor):
        try:
            value = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError):
            raise ValidationError(
                f"{what}: expected a 1-D float tensor, found {type(value).__name__}"
            ) from None
    if value.dim() != 1 or not value.is_floating_point():
        raise ValidationError(
            f"{what}: expected a 1-D float tensor, found shape {tuple(value.shape)} of {value.dtype}"
        )
    if dim is not None and value.shape[0] != dim:
        raise ValidationError(f"{what}: expected width {dim}, found {value.shape[0]}")
    if value.numel() and not bool(torch.isfinite(value).all()):
        pos = int((~torch.isfinite(value)).nonzero()[0, 0])
        raise ValidationError(
            f"{what}: expected finite values, found {value[pos].item()!r} at index {pos}"
        )
    return value


@dataclass
class MemoryEmbedding:
    """A note's embedding: ``tag`` (D,) plus named field vectors (each (D,)).

    Absent fields are simply missing from ``fields`` (a Procedure has none). The constructor does
    not validate (stores and clusters validate on entry); :meth:`from_vector`, :meth:`from_fields`
    and :meth:`validate` do.

    **Plain mode** (one vector per note, plain cosine): the single vector is stored as ``tag``
    with no fields (:meth:`from_vector`); :func:`stack_plain_embeddings` stacks those rows.

    Example:
        >>> import torch
        >>> e = MemoryEmbedding.from_fields(torch.ones(4), {"content": torch.zeros(4)})
        >>> e.dim, sorted(e.fields)
        (4, ['content'])
    """

    tag: Tensor
    fields: dict[str, Tensor] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        # reached only for a missing attribute: the vectors of a deferred embedding (a store's
        # load, runtime/deferred.py), put in place on their first read
        if name in ("tag", "fields"):
            state = self.__dict__
            compact = state.get("_compact")
            if compact is not None:  # a compact embedding (embedding/compact.py): built on
                return compact.value(name)  # each read, not kept
            pending = state.get("_pending")
            if pending is not None:
                pending.resolve(self)
                return state[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __getstate__(self) -> dict[str, Any]:  # copy / pickle: the vectors themselves
        return {"tag": self.tag, "fields": self.fields}

    @property
    def dim(self) -> int:
        return int(self.tag.shape[-1])

    # -- validated construction ------------------------------------------------------------
    @classmethod
    def from_vector(cls, vector: Any, *, dim: int | None = None) -> MemoryEmbedding:
        """Plain mode: one user-supplied vector (D,) per note, stored as float32 ``tag``.

        Raises:
            ValidationError: not 1-D float, wrong width (when ``dim`` is given), NaN / inf.
        """
        vec = _check_vector("vector", vector, dim)
        return cls(tag=vec.detach().to(torch.float32), fields={})

    @classmethod
    def from_fields(
        cls, tag: Any, fields: Mapping[str, Any] | None = None, *, dim: int | None = None
    ) -> MemoryEmbedding:
        """From user-supplied vectors: ``tag`` (D,) and ``{field name: (D,)}``, as float32.

        Field names must be in ``FIELD_NAMES``. A zero ``tag`` means "no tags".

        Raises:
            ValidationError: naming the field, on an unknown name, a non 1-D / non-float vector,
                a width different from ``dim`` (or from the tag's), NaN or inf.
        """
        tag_t = _check_vector("tag", tag, dim)
        width = int(tag_t.shape[0])
        out: dict[str, Tensor] = {}
        for name, vec in (fields or {}).items():
            if name not in FIELD_INDEX:
                raise ValidationError(
                    f"fields[{name!r}]: expected a name in FIELD_NAMES {FIELD_NAMES}, found an "
                    "unknown field"
                )
            out[name] = _check_vector(f"fields[{name!r}]", vec, width).detach().to(torch.float32)
        return cls(tag=tag_t.detach().to(torch.float32), fields=out)

    def validate(self, *, dim: int | None = None, where: str = "embedding") -> MemoryEmbedding:
        """Checks widths, finiteness and field names; returns ``self``.

        Raises:
            ValidationError: naming ``where`` and the field.
        """
        tag_t = _check_vector(f"{where}.tag", self.tag, dim)
        width = int(tag_t.shape[0])
        for name, vec in self.fields.items():
            if name not in FIELD_INDEX:
                raise ValidationError(
                    f"{where}.fields[{name!r}]: expected a name in FIELD_NAMES, found an unknown "
                    "field"
                )
            _check_vector(f"{where}.fields[{name!r}]", vec, width)
        return self

    def to(self, *args: Any, **kwargs: Any) -> MemoryEmbedding:
        """A copy with every vector moved / cast (``tensor.to`` arguments)."""
        return MemoryEmbedding(
            tag=self.tag.to(*args, **kwargs),
            fields={k: v.to(*args, **kwargs) for k, v in self.fields.items()},
        )


@dataclass
class EmbeddedMemoryNote:
    """A note with its (optional) embedding, as stored in a ``MemoryCluster``.

    Graph algorithms (PPR, Bayes) do not need an embedding; similarity scores a note without one
    as 0.
    """

    note: MemoryNote
    embedding: MemoryEmbedding | None = None


# -------------------------------------------------------------------------------------------
# stacking into graph tensors
# -------------------------------------------------------------------------------------------
def _infer_dim(embeddings: Sequence[MemoryEmbedding | None], dim: int | None) -> int:
    if dim is not None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
            raise ValidationError(f"dim: expected an int > 0, found {dim!r}")
        return dim
    for emb in embeddings:
        if emb is not None:
            return emb.dim
    raise ValidationError("dim: no embedding to take the width from; pass dim explicitly")


def stack_field_embeddings(
    embeddings: Sequence[MemoryEmbedding | None], dim: int | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Stacks per-note embeddings into the graph's float32 field tensors (on the CPU).

    Args:
        embeddings: length N. One ``MemoryEmbedding`` or ``None`` (no embedding) per note.
        dim: > 0. Embedding width ``D``; ``None`` = the first embedding's width.

    Returns:
        ``(tag_emb (N, D) f32, tag_mask (N,) bool, field_emb (N, F, D) f32,
        field_mask (N, F) bool)`` with ``F = len(FIELD_NAMES)``. ``tag_mask[i]`` is True iff note
        ``i`` has an embedding (its tag row may still be the zero vector: "no tags"); absent
        rows and fields are zeros / False. Field names outside ``FIELD_NAMES`` are ignored.

    Raises:
        ValidationError: naming the note and field, on a wrong width or a NaN / inf value.
    """
    tag_emb, tag_mask, field_rows, field_pos = stack_compact_field_embeddings(embeddings, dim)
    field_emb, field_mask = compact_to_dense(field_rows, field_pos)
    return tag_emb, tag_mask, field_emb, field_mask


def stack_compact_field_embeddings(
    embeddings: Sequence[MemoryEmbedding | None], dim: int | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The compact field layout of N notes (docs/spec.md §3, DECISION "compact note layout").

    Only the fields a note has are stored: ``field_rows (P, D)`` holds the distinct field
    vectors grouped by field (every row of field ``j`` before any row of field ``j + 1``, in
    note order within a field), ``field_pos (N, F)`` int32 the row of each (note, field),
    ``-1`` where the note lacks the field. A vector shared by several notes for the same field
    (the same tensor memory, as :func:`~soulmem_torch.embedding.embed_notes` hands out for
    fields built from the same texts) is stored once.

    Args:
        embeddings: length N. One ``MemoryEmbedding`` or ``None`` (no embedding) per note.
        dim: > 0. Embedding width ``D``; ``None`` = the first embedding's width.

    Returns:
        ``(tag_emb (N, D) f32, tag_mask (N,) bool, field_rows (P, D) f32, field_pos (N, F)
        int32)`` on the CPU; as :func:`stack_field_embeddings` but without the dense block.

    Raises:
        ValidationError: naming the note and field, on a wrong width or a NaN / inf value.
    """
    n = len(embeddings)
    d = _infer_dim(embeddings, dim) if n else (dim or 0)
    fast = _stack_compact_fast(embeddings, n, d)
    if fast is not None:
        return fast
    return _stack_compact_checked(embeddings, n, d)


_FAST_ERRORS = (TypeError, AttributeError, IndexError, RuntimeError, ValueError)
_FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})


def _stack_compact_fast(
    embeddings: Sequence[MemoryEmbedding | None], n: int, d: int
) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
    """:func:`stack_compact_field_embeddings` without a check per vector: the vectors are
    stacked as they come, then their dtypes, the stacked shapes and the finiteness of the
    stacked tables are checked once (what a cluster's snapshot of thousands of validated
    vectors wants). ``None`` when anything is off (a wrong type, shape, width, dtype, a NaN):
    the caller then runs the vector-by-vector check, which names the first offender. The
    result is the same tables, bit for bit."""
    f = len(FIELD_NAMES)
    try:
        rows, tags, per_field, cells, local, cell_field = _collect(embeddings, d, check=False)
        vectors = [v for group in per_field for v in group]
        if not {t.dtype for t in tags} <= _FLOATS or not {v.dtype for v in vectors} <= _FLOATS:
            return None
        with torch.no_grad():
            stacked_tags = torch.stack(tags) if tags else None
            field_rows = torch.stack(vectors) if vectors else None
    except (_NotFast, *_FAST_ERRORS):
        return None
    for table in (stacked_tags, field_rows):
        if table is None:
            continue
        if table.dim() != 2 or table.shape[1] != d:
            return None
    if stacked_tags is not None:
        stacked_tags = stacked_tags.detach().to("cpu", torch.float32)
    if field_rows is not None:
        field_rows = field_rows.detach().to("cpu", torch.float32)
    # checked as float32 (a float64 value past float32's range is no finite entry either)
    if any(t is not None and not _all_finite(t) for t in (stacked_tags, field_rows)):
        return None
    if stacked_tags is not None and len(rows) == n:  # every note embedded: the stack is it
        tag_emb = stacked_tags.contiguous()
        tag_mask = torch.ones(n, dtype=torch.bool)
    else:
        tag_emb = torch.zeros(n, d, dtype=torch.float32)
        tag_mask = torch.zeros(n, dtype=torch.bool)
    if stacked_tags is not None and len(rows) < n:
        index = torch.tensor(rows, dtype=torch.long)
        tag_emb[index] = stacked_tags
        tag_mask[index] = True
    if field_rows is None:
        field_rows = torch.zeros(0, d, dtype=torch.float32)
    return tag_emb, tag_mask, field_rows, _field_pos(n, f, per_field, cells, local, cell_field)


class _NotFast(Exception):
    """An input the unchecked stacking leaves to the checked one (which names the problem)."""


def _collect(
    embeddings: Sequence[MemoryEmbedding | None], d: int, *, check: bool
) -> tuple[list[int], list[Tensor], list[list[Tensor]], list[int], list[int], list[int]]:
    """The vectors of every note's embedding, one pass: ``(rows, tags, per_field, cells,
    local, cell_field)`` — the embedded notes, their tag vectors, each field's distinct
    vectors, and for every (note, field) cell its flat index, its row within its field and its
    field. A vector shared by several notes for one field (the same memory: address, stride,
    dtype) is kept once.

    ``check``: each vector through :func:`_check_vector` (an error names the note and field);
    otherwise the vectors are taken as they come and anything but a ``MemoryEmbedding``
    raises ``_NotFast`` (the caller checks the stacked tables instead)."""
    f = len(FIELD_NAMES)
    rows: list[int] = []
    tags: list[Tensor] = []
    cells: list[int] = []
    local: list[int] = []
    cell_field: list[int] = []
    per_field: list[list[Tensor]] = [[] for _ in range(f)]
    seen: list[dict[tuple[int, int, Any], int]] = [{} for _ in range(f)]
    index_of = FIELD_INDEX.get
    for i, emb in enumerate(embeddings):
        if emb is None:
            continue
        if type(emb) is not MemoryEmbedding:
            if not check:
                raise _NotFast
            if not isinstance(emb, MemoryEmbedding):
                raise ValidationError(
                    f"embeddings[{i}]: expected a MemoryEmbedding or None, found "
                    f"{type(emb).__name__}"
                )
        rows.append(i)
        tags.append(
            _check_vector(f"embeddings[{i}].tag", emb.tag, d).detach() if check else emb.tag
        )
        for name, vec in emb.fields.items():
            j = index_of(name)
            if j is None:
                continue
            v = (
                _check_vector(f"embeddings[{i}].fields[{name!r}]", vec, d).detach()
                if check
                else vec
            )
            key = (v.data_ptr(), v.stride(0), v.dtype)
            r = seen[j].get(key)
            if r is None:
                r = seen[j][key] = len(per_field[j])
                per_field[j].append(v)
            cells.append(i * f + j)
            local.append(r)
            cell_field.append(j)
    return rows, tags, per_field, cells, local, cell_field


def _all_finite(table: Tensor) -> bool:
    """Whether a stacked table holds only finite values (numpy on the CPU: one pass, several
    times faster than ``torch.isfinite`` there)."""
    flat = table.reshape(-1)
    step = 1 << 20  # elements per pass: the bool temporary stays small
    if flat.device.type == "cpu" and flat.dtype in _NUMPY_FLOATS:
        array = flat.numpy()
        return all(bool(np.isfinite(array[i : i + step]).all()) for i in range(0, array.size, step))
    return all(bool(torch.isfinite(flat[i : i + step]).all()) for i in range(0, flat.numel(), step))


_NUMPY_FLOATS = frozenset({torch.float16, torch.float32, torch.float64})


def _field_pos(
    n: int,
    f: int,
    per_field: list[list[Tensor]],
    cells: list[int],
    local: list[int],
    cell_field: list[int],
) -> Tensor:
    field_pos = torch.full((n * f,), -1, dtype=torch.int32)
    if cells:
        counts = torch.tensor([len(g) for g in per_field], dtype=torch.int64)
        offsets = torch.cumsum(counts, 0) - counts
        field_pos[torch.tensor(cells, dtype=torch.long)] = (
            offsets[torch.tensor(cell_field, dtype=torch.long)]
            + torch.tensor(local, dtype=torch.long)
        ).to(torch.int32)
    return field_pos.view(n, f)


def _stack_compact_checked(
    embeddings: Sequence[MemoryEmbedding | None], n: int, d: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """:func:`stack_compact_field_embeddings` checking every vector as it comes."""
    f = len(FIELD_NAMES)
    rows, tags, per_field, cells, local, cell_field = _collect(embeddings, d, check=True)
    tag_emb = torch.zeros(n, d, dtype=torch.float32)
    tag_mask = torch.zeros(n, dtype=torch.bool)
    if rows:
        index = torch.tensor(rows, dtype=torch.long)
        tag_emb[index] = torch.stack([t.to("cpu", torch.float32) for t in tags])
        tag_mask[index] = True
    vectors = [v.to("cpu", torch.float32) for group in per_field for v in group]
    field_rows = torch.stack(vectors) if vectors else torch.zeros(0, d, dtype=torch.float32)
    field_pos = _field_pos(n, f, per_field, cells, local, cell_field)
    # finite as given, but past float32's range once stored as float32 (a float64 input)
    for name, table in (("tag", tag_emb), ("fields", field_rows)):
        if not _all_finite(table):
            row = int((~torch.isfinite(table)).any(dim=1).nonzero()[0, 0])
            where = f"embeddings[{row}].tag" if name == "tag" else _cell_of(field_pos, row)
            raise ValidationError(
                f"{where}: expected values within float32's range, found one that overflows it"
            )
    return tag_emb, tag_mask, field_rows, field_pos


def _cell_of(field_pos: Tensor, row: int) -> str:
    """``embeddings[i].fields['name']`` of the first cell stored in ``field_rows`` row ``row``."""
    note, j = (int(x) for x in (field_pos == row).nonzero()[0])
    return f"embeddings[{note}].fields[{FIELD_NAMES[j]!r}]"


def dense_to_compact(field_emb: Tensor, field_mask: Tensor) -> tuple[Tensor, Tensor]:
    """``(field_rows (P, D), field_pos (N, F) int32)`` of a dense ``(N, F, D)`` block and its
    ``(N, F)`` mask: the present cells, grouped by field (no interning: every present cell is
    its own row). Follows the inputs' device and dtype."""
    n, f = int(field_mask.shape[0]), int(field_mask.shape[1])
    cells = field_mask.reshape(-1).nonzero().reshape(-1)  # note-major
    cells = cells[torch.sort(cells % f, stable=True).indices]  # grouped by field
    field_rows = field_emb.reshape(n * f, -1).index_select(0, cells)
    field_pos = torch.full((n * f,), -1, dtype=torch.int32, device=field_mask.device)
    field_pos[cells] = torch.arange(cells.numel(), device=field_mask.device, dtype=torch.int32)
    return field_rows, field_pos.view(n, f)


def compact_to_dense(field_rows: Tensor, field_pos: Tensor) -> tuple[Tensor, Tensor]:
    """The dense ``(field_emb (N, F, D), field_mask (N, F))`` of a compact layout (zeros where
    absent): a fresh copy, for code that wants the dense block; no kernel uses it."""
    n, f = int(field_pos.shape[0]), int(field_pos.shape[1])
    d = int(field_rows.shape[-1])
    mask = field_pos >= 0
    dense = field_rows.new_zeros(n, f, d)
    if field_rows.shape[0]:
        dense[mask] = field_rows.index_select(0, field_pos[mask].to(torch.long))
    return dense, mask


def stack_plain_embeddings(
    embeddings: Sequence[MemoryEmbedding | None], dim: int | None = None
) -> tuple[Tensor, Tensor]:
    """Plain mode: stacks each note's single vector (its ``tag``) into ``x``.

    Args:
        embeddings: length N. ``MemoryEmbedding`` (see :meth:`MemoryEmbedding.from_vector`) or
            ``None``.
        dim: > 0. Width ``D``; ``None`` = the first embedding's width.

    Returns:
        ``(x (N, D) f32, mask (N,) bool)`` on the CPU; rows without an embedding are zeros /
        False (their cosine is 0).
    """
    tag_emb, tag_mask, _, _ = _stack_tags_only(embeddings, dim)
    return tag_emb, tag_mask


def _stack_tags_only(
    embeddings: Sequence[MemoryEmbedding | None], dim: int | None
) -> tuple[Tensor, Tensor, None, None]:
    n = len(embeddings)
    d = _infer_dim(embeddings, dim) if n else (dim or 0)
    x = torch.zeros(n, d, dtype=torch.float32)
    mask = torch.zeros(n, dtype=torch.bool)
    rows = [i for i, e in enumerate(embeddings) if e is not None]
    if rows:
        vecs = [
            _check_vector(f"embeddings[{i}].tag", embeddings[i].tag, d)  # type: ignore[union-attr]
            .detach()
            .to("cpu", torch.float32)
            for i in rows
        ]
        index = torch.tensor(rows, dtype=torch.long)
        x[index] = torch.stack(vecs)
        mask[index] = True
    return x, mask, None, None
