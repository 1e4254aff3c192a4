"""Fused similarity (docs/spec.md §4): B queries against all N notes with batched matmuls, float32.

Every cosine is a matmul of L2-normalized vectors (a zero vector stays zero, so ``cos = 0``
whenever either side is all zeros); the structured rules are masked ``where`` / ``max`` / sums
over fixed small field lists — no Python loop over notes, units or queries.

Inputs (``B`` queries padded to ``U`` units, ``Q = len(QUERY_FIELD_NAMES)``, ``N`` notes,
``F = len(FIELD_NAMES)``, width ``D``; see :mod:`soulmem_torch.embedding.fields`):

==================  =============  ===============================================================
argument            shape / dtype  meaning
==================  =============  ===============================================================
``query_tag``       (B, D) float   mean tag vector of each query (zero: no tags)
``query_kind``      (B,) int       ``QUERY_SEMANTIC`` (0) / ``QUERY_SITUATION`` (1)
``query_field``     (B, U, Q, D)   unit fields in ``QUERY_FIELD_NAMES`` order
``query_field_mask``(B, U, Q) bool the unit has the field
``query_unit_mask`` (B, U) bool    the unit exists
``tag_emb``         (N, D) float   note tag vectors (``MemoryGraph.tag_emb``)
``tag_mask``        (N,) bool      the note has an embedding (``MemoryGraph.tag_mask``)
``field_emb``       (N, F, D)      note fields in ``FIELD_NAMES`` order (``MemoryGraph.field_emb``)
``field_mask``      (N, F) bool    field present (``MemoryGraph.field_mask``)
``node_type``       (N,) int       ``NODE_*`` codes (``MemoryGraph.node_type``)
==================  =============  ===============================================================

Rules (all weights from :class:`BlendWeights`, products and sums evaluated in float32 in the
original's order):

* Location: name; with query coordinates ``0.6·name + 0.4·coord``.
* Participant: name and role → ``0.6·name + 0.4·role``; one → that one; none → 0.
* Environment: both → ``0.5·atm + 0.5·tone``; one → that; none → 0.
* Event: initiator and target → ``0.3·i + 0.3·t + 0.4·action``; initiator only →
  ``(1 − 0.6)·i + 0.6·action``; target only → ``(1 − 0.6)·t + 0.6·action``; neither → action.
* SpecificSituation vs a unit: ``max(0, narrative?, location? (both have one), participants?
  (both), environment? (query has one), event? (both))``.
* AbstractSituation vs a unit: ``max(0, its leaf's rule if the query has that part,
  cos(query narrative, fused_self))``. The leaf is the one whose fields are present
  (location, then participant, environment, event).
* Semantic vs a unit: ``concept = max(cos(id, content), cos(id, aliases))`` if the unit has an
  identifier else 0; with a description ``0.5·concept + 0.5·cos(desc, description)``.
* Variant: Semantic query → mean over units (none → 0); Situation query → mean over units
  too (``BlendWeights.situation_units = "sum"`` adds them, as older originals); a kind mismatch and any
  Procedure → 0.
* Embedding score: note or query tag all zeros → variant; else ``0.3·cos(tags) + 0.7·variant``.
  A Procedure note with tags thus still gets ``0.3·cos(tags)`` (as in the original).
* Fused with the string channel: ``str <= 0 → emb``, else ``max(emb, α·emb + (1 − α)·str)``.
* A note without an embedding (``tag_mask`` False) scores 0.
"""

from __future__ import annotations

import struct
import warnings
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from soulmem_torch.embedding.fields import (
    FIELD_INDEX,
    FIELD_NAMES,
    QUERY_FIELD_INDEX,
    QUERY_FIELD_NAMES,
    QUERY_SEMANTIC,
    QUERY_SITUATION,
)
from soulmem_torch.errors import ValidationError
from soulmem_torch.functional.codes import NODE_ABSTRACT, NODE_SEMANTIC, NODE_SPECIFIC
from soulmem_torch.functional.sparse_rows import (
    SPARSE_MAX_DENSITY,
    SPARSE_MIN_CELLS,
    SparseRows,
    sparse_row_dots,
    sparse_rows_matmul,
)
from soulmem_torch.functional.topk import stable_topk

__all__ = [
    "BlendWeights",
    "NoteSide",
    "QueryFields",
    "cosine_scores",
    "embedding_scores",
    "embedding_scores_compact",
    "fuse_string_scores",
    "fused_similarity",
    "fused_similarity_compact",
    "normalize_rows",
    "row_dots",
    "rows_matmul",
    "note_side",
    "note_side_compact",
    "topk",
    "semantic_variant",
    "situation_variant",
]


class BlendWeights(BaseModel):
    """Every weight of the similarity score (the original's ``BlendWeights``), docs/spec.md defaults.

    ``situation_units``: ``"mean"`` (the default, docs/spec.md §4: the newest original averages a
    Situation query's unit scores like a Semantic query's, so three identical units scoring 1.0
    give 1.0 and scores stay in [0, 1]); ``"sum"`` adds them (older versions of the original;
    ``DefaultPipelineConfig.original()`` selects it through ``SimilarityConfig``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    tag: float = Field(0.3, ge=0.0, le=1.0, allow_inf_nan=False, description="Tag cosine weight.")
    variant: float = Field(0.7, ge=0.0, le=1.0, allow_inf_nan=False, description="Variant weight.")
    string_blend_alpha: float = Field(
        0.6, ge=0.0, le=1.0, allow_inf_nan=False,
        description="Embedding share α in max(emb, α·emb + (1 − α)·str).",
    )  # fmt: skip
    sem_concept: float = Field(0.5, ge=0.0, le=1.0, allow_inf_nan=False)
    sem_description: float = Field(0.5, ge=0.0, le=1.0, allow_inf_nan=False)
    sit_location_name: float = Field(0.6, ge=0.0, le=1.0, allow_inf_nan=False)
    sit_location_coord: float = Field(0.4, ge=0.0, le=1.0, allow_inf_nan=False)
    sit_participant_name: float = Field(0.6, ge=0.0, le=1.0, allow_inf_nan=False)
    sit_participant_role: float = Field(0.4, ge=0.0, le=1.0, allow_inf_nan=False)
    sit_env_atmosphere: float = Field(0.5, ge=0.0, le=1.0, allow_inf_nan=False)
    sit_env_tone: float = Field(0.5, ge=0.0, le=1.0, allow_inf_nan=False)
    sit_event_initiator: float = Field(0.3, ge=0.0, le=1.0, allow_inf_nan=False)
    sit_event_target: float = Field(0.3, ge=0.0, le=1.0, allow_inf_nan=False)
    sit_event_action: float = Field(0.4, ge=0.0, le=1.0, allow_inf_nan=False)
    sit_event_initiator_only_action: float = Field(
        0.6, ge=0.0, le=1.0, allow_inf_nan=False,
        description="Action weight when the query event has only an initiator (initiator: 1 − it).",
    )  # fmt: skip
    sit_event_target_only_action: float = Field(
        0.6, ge=0.0, le=1.0, allow_inf_nan=False,
        description="Action weight when the query event has only a target (target: 1 − it).",
    )  # fmt: skip
    situation_units: Literal["sum", "mean"] = Field(
        "mean", description="How a Situation query's unit scores combine."
    )


def f32(x: float) -> float:
    """``x`` rounded to float32 (returned as a Python float)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def one_minus_f32(x: float) -> float:
    """``1.0 - x`` evaluated in float32, as the original's ``1.0 - w`` on an ``f32``."""
    return f32(1.0 - f32(x))


# -------------------------------------------------------------------------------------------
# plain cosine and top-k
# -------------------------------------------------------------------------------------------
def normalize_rows(x: Tensor) -> Tensor:
    """``x / ‖x‖`` along the last dim in float32; all-zero rows stay zero."""
    x = x.to(torch.float32)
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return x / torch.where(norm > 0, norm, torch.ones_like(norm))


def cosine_scores(query: Tensor, x: Tensor) -> Tensor:
    """Plain-mode cosine of every query against every note vector.

    Args:
        query: shape (B, D) (or (D,)). Query vectors.
        x: shape (N, D). Note vectors (e.g. ``stack_plain_embeddings``).

    Returns:
        shape (B, N) (or (N,)), float32; 0 wherever either vector is all zeros.

    Raises:
        ValidationError: widths differ, a tensor is not 1-/2-D, or a query holds NaN / inf
            (it would score NaN against every note).
    """
    squeeze = query.dim() == 1
    q = query.unsqueeze(0) if squeeze else query
    if q.dim() != 2 or x.dim() != 2:
        raise ValidationError(
            f"query / x: expected shapes (B, D) and (N, D), found {tuple(query.shape)} and "
            f"{tuple(x.shape)}"
        )
    if q.shape[1] != x.shape[1]:
        raise ValidationError(
            f"x: expected width D = {q.shape[1]} (that of query), found {x.shape[1]}"
        )
    if q.numel() and not bool(torch.isfinite(q).all()):
        row = int((~torch.isfinite(q)).any(dim=1).nonzero()[0, 0])
        raise ValidationError(
            f"query: expected finite values, found NaN or inf in row {row} "
            f"({q[row][~torch.isfinite(q[row])][0].item()})"
        )
    out = normalize_rows(q) @ normalize_rows(x).T
    return out.squeeze(0) if squeeze else out


def row_dots(a: Tensor, table: Tensor | SparseRows, cols: Tensor) -> Tensor:
    """``out[r, k] = a[r] · table[cols[r, k]]``: (R, K), without gathering the ``(R, K, D)``
    rows of ``table``.

    A :class:`~soulmem_torch.functional.sparse_rows.SparseRows` table (the sparse note side,
    docs/spec.md §3) is read cell by cell
    (:func:`~soulmem_torch.functional.sparse_rows.sparse_row_dots`), on any device.

    On the CPU, one sampled dense-dense product (``torch.sparse.sampled_addmm``: ``a @
    table.T`` computed only at the ``R × K`` sampled entries, each a dot product that reads
    the row of ``table`` in place; columns may repeat and need not be sorted): ~7-10x a
    gather + ``bmm`` at ``D = 1024``, where the gathered copy, not the arithmetic, was the
    cost. Its dot products are summed in the kernel's own order, so the results can differ
    from a ``matmul``'s in the last bits (float32: ~1e-7 on unit vectors). On other devices
    (cuSPARSE's SDDMM wants sorted, distinct columns; a GPU gathers at memory speed) the
    gather + ``bmm``.

    Args:
        a: (R, D) float32 or float64.
        table: (P, D), the dtype and device of ``a``, dense or sparse.
        cols: (R, K) int64 row numbers into ``table``, each in ``[0, P)``.
    """
    if isinstance(table, SparseRows):
        return sparse_row_dots(a, table, cols)
    r, k = int(cols.shape[0]), int(cols.shape[1])
    if r == 0 or k == 0 or a.shape[1] == 0:
        return a.new_zeros(r, k)
    if a.device.type != "cpu":
        return torch.bmm(table[cols], a.unsqueeze(-1)).squeeze(-1)
    p = int(table.shape[0])
    if k > p:  # a CSR row holds at most P entries: repeated columns a slice of P at a time
        return torch.cat([row_dots(a, table, cols[:, i : i + p]) for i in range(0, k, p)], 1)
    crow = torch.arange(0, r * k + 1, k, dtype=torch.int64, device=a.device)
    with warnings.catch_warnings():  # "sparse CSR support is in beta": the op is documented
        warnings.simplefilter("ignore", UserWarning)
        mask = torch.sparse_csr_tensor(
            crow, cols.reshape(-1).to(torch.int64), a.new_zeros(r * k),
            size=(r, int(table.shape[0])), check_invariants=False,
        )  # fmt: skip
        out = torch.sparse.sampled_addmm(mask, a, table.T)
    return out.values().view(r, k)


def rows_matmul(a: Tensor, table: Tensor | SparseRows, sel: Tensor | None = None) -> Tensor:
    """``a @ table[sel].T``: (R, n) (``sel`` None: every row of ``table``), for a dense table
    (the gathered rows, one matmul) or a sparse one (one CSR product,
    :func:`~soulmem_torch.functional.sparse_rows.sparse_rows_matmul`).

    Args:
        a: (R, D) float.
        table: (P, D), dense or :class:`~soulmem_torch.functional.sparse_rows.SparseRows`.
        sel: (n,) int64 row numbers into ``table``, or None.
    """
    if isinstance(table, SparseRows):
        return sparse_rows_matmul(a, table, sel)
    if a.device.type == "cpu" and table.numel() < SPARSE_MIN_CELLS:
        # a table dense because it is small: the union's kernel (row_dots), each entry a
        # function of its two rows alone, so identical notes tie exactly wherever they sit and
        # a memory scores as it does in a bank (a GEMM's edge blocks sum in another order)
        cols = torch.arange(int(table.shape[0]), device=a.device) if sel is None else sel
        return row_dots(a, table, cols.unsqueeze(0).expand(int(a.shape[0]), -1))
    rows = table if sel is None else table.index_select(0, sel)
    return a @ rows.T


def _normalized_table(
    x: Tensor, device: torch.device, *, zero_row: bool, keep: Tensor | None = None
) -> Tensor | SparseRows:
    """``normalize_rows(x)`` (rows where ``keep`` is False zeroed), plus one zero row when
    ``zero_row``: a :class:`SparseRows` when ``x`` has at least ``SPARSE_MIN_CELLS`` cells and at
    most ``SPARSE_MAX_DENSITY`` of them are non-zero (normalized a block of rows at a time: no dense copy is ever whole), else a
    dense tensor. The values are ``normalize_rows``'s either way."""
    x = x.to(device, torch.float32)
    p, d = int(x.shape[0]), int(x.shape[1])
    big = p * d >= SPARSE_MIN_CELLS
    sparse_in = isinstance(x, SparseRows)  # raw vectors held sparse: a dense block at a time
    nnz = x.nnz if sparse_in else (int(torch.count_nonzero(x)) if big else 0)
    if big and nnz <= SPARSE_MAX_DENSITY * p * d:
        if sparse_in:  # the cells divided in place: the dense block only for the norms
            table = _normalized_cells(x, keep)
            return table.with_zero_row() if zero_row else table
        step = max(1, (1 << 22) // d)
        parts = []
        for lo in range(0, p, step):
            block = normalize_rows(x[lo : lo + step])
            if keep is not None:
                block *= keep[lo : lo + step].unsqueeze(-1)
            parts.append(SparseRows.from_dense(block))
        table = SparseRows.cat(parts)
        return table.with_zero_row() if zero_row else table
    out = torch.zeros(p + int(zero_row), d, dtype=torch.float32, device=device)
    if p:  # normalize_rows written straight into the table (no second copy)
        if sparse_in:  # small or dense: the dense table's own kernels (its cells laid out here)
            x.write_dense(out[:p])
            x = out[:p]
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
        torch.div(x, torch.where(norm > 0, norm, torch.ones_like(norm)), out=out[:p])
        if keep is not None:
            out[:p] *= keep.unsqueeze(-1)
    return out


def _normalized_cells(x: SparseRows, keep: Tensor | None) -> SparseRows:
    """``SparseRows.from_dense(normalize_rows(x.to_dense()) * keep)`` without the dense copy
    of the result: each row's norm taken, as :func:`normalize_rows` takes it, over its dense
    row (:meth:`SparseRows.row_norms`: a block of rows at a time), then the cells divided by
    it (the same quotients), rows not kept and quotients that are zero left out (what
    ``from_dense`` drops)."""
    norm = x.row_norms()
    return x.divide_rows(torch.where(norm > 0, norm, torch.ones_like(norm)), keep=keep)


def topk(scores: Tensor, k: int, *, dim: int = -1) -> tuple[Tensor, Tensor]:
    """The ``k`` largest scores along ``dim``, descending; ties keep index order; NaN last.

    Exactly the first ``k`` of a stable descending sort, found without a full sort
    (:func:`~soulmem_torch.functional.topk.stable_topk`).

    Returns:
        ``(values, indices)``, each with ``min(k, size)`` entries along ``dim``.
    """
    key = torch.where(torch.isnan(scores), torch.full_like(scores, float("-inf")), scores)
    _, order, _ = stable_topk(key, k, dim=dim)
    return scores.gather(dim, order), order


# -------------------------------------------------------------------------------------------
# structured similarity
# -------------------------------------------------------------------------------------------
_Q = QUERY_FIELD_INDEX
_F = FIELD_INDEX


def _check_inputs(
    query_tag: Tensor,
    query_kind: Tensor,
    query_field: Tensor,
    query_field_mask: Tensor,
    query_unit_mask: Tensor,
    tag_emb: Tensor,
    tag_mask: Tensor,
    field_emb: Tensor,
    field_mask: Tensor,
    node_type: Tensor,
) -> tuple[int, int, int, int]:
    if query_field.dim() != 4 or query_field.shape[2] != len(QUERY_FIELD_NAMES):
        raise ValidationError(
            f"query_field: expected shape (B, U, {len(QUERY_FIELD_NAMES)}, D), found "
            f"{tuple(query_field.shape)}"
        )
    b, u, _, d = (int(s) for s in query_field.shape)
    if field_emb.dim() != 3 or field_emb.shape[1] != len(FIELD_NAMES):
        raise ValidationError(
            f"field_emb: expected shape (N, {len(FIELD_NAMES)}, D), found {tuple(field_emb.shape)}"
        )
    n = int(field_emb.shape[0])
    expected = {
        "query_tag": (query_tag, (b, d)),
        "query_kind": (query_kind, (b,)),
        "query_field_mask": (query_field_mask, (b, u, len(QUERY_FIELD_NAMES))),
        "query_unit_mask": (query_unit_mask, (b, u)),
        "tag_emb": (tag_emb, (n, d)),
        "tag_mask": (tag_mask, (n,)),
        "field_emb": (field_emb, (n, len(FIELD_NAMES), d)),
        "field_mask": (field_mask, (n, len(FIELD_NAMES))),
        "node_type": (node_type, (n,)),
    }
    for name, (value, shape) in expected.items():
        if tuple(value.shape) != shape:
            raise ValidationError(
                f"{name}: expected shape {shape} (B={b}, U={u}, N={n}, D={d}), found "
                f"{tuple(value.shape)}"
            )
    for name in ("query_field_mask", "query_unit_mask", "tag_mask", "field_mask"):
        if expected[name][0].dtype != torch.bool:
            raise ValidationError(
                f"{name}: expected a bool tensor, found {expected[name][0].dtype}"
            )
    return b, u, n, d


class QueryFields:
    """The query unit fields of B queries, normalized one field at a time, on demand.

    Stands in for a normalized ``qn`` (b, U, Q, D) in the variant kernels: a field no unit of
    the batch has is never normalized or multiplied (its cosines are zeros, as a zero row's
    are), and the others are gathered as (b, U, D) slices — the padded (B, U, Q, D) tensor is
    never copied or normalized whole.

    ``field``: the (B, U, Q, D) tensor, or anything with ``field_slice(rows, i, *,
    absent_zero)`` returning ``field[rows, :, i]`` (a compact ``QueryEmbeddingBatch``: the
    padded block never made; with ``absent_zero=False`` absent units may hold any finite row,
    as they are zeroed here).
    """

    def __init__(self, field: Any, rows: Tensor, qm: Tensor) -> None:
        self.field, self.rows, self.qm = field, rows, qm  # qm: (b, U, Q), rows into field
        self.device = rows.device
        self.shape = (int(rows.shape[0]), int(qm.shape[1]))
        self.present = qm.any(dim=1).any(dim=0).tolist()  # (Q,): one host sync
        self._done: dict[int, Tensor] = {}

    def slice(self, i: int) -> Tensor | None:
        """Normalized field ``i`` of every unit, absent ones zeroed: (b, U, D); ``None`` when
        no unit has it."""
        if not self.present[i]:
            return None
        if i not in self._done:
            take = getattr(self.field, "field_slice", None)
            # (a compact batch's absent units hold other finite rows: zeroed below)
            raw = (
                self.field[self.rows, :, i]
                if take is None
                else take(self.rows, i, absent_zero=False)
            )
            x = normalize_rows(raw)  # row by row: a row's values depend on that row alone
            has = self.qm[:, :, i]
            if take is None or not bool(has.all()):
                x = x.masked_fill_(~has.unsqueeze(-1), 0.0)
            self._done[i] = x
        return self._done[i]


def semantic_variant(
    cos: Callable[[str, str], Tensor], qm: Tensor, um: Tensor, w: BlendWeights
) -> Tensor:
    """(b, n): mean over units of the Semantic unit score.

    ``cos(query field, note field)``: the cosines ``(b, U, n)`` of every unit against every
    note; ``qm`` (b, U, Q) / ``um`` (b, U): the query masks.
    """
    has_concept = qm[:, :, _Q["concept"]].unsqueeze(-1)
    has_desc = qm[:, :, _Q["description"]].unsqueeze(-1)
    concept = torch.maximum(cos("concept", "content"), cos("concept", "aliases"))
    concept = torch.where(has_concept, concept, 0.0)
    unit = torch.where(
        has_desc,
        w.sem_concept * concept + w.sem_description * cos("description", "description"),
        concept,
    )
    unit = torch.where(um.unsqueeze(-1), unit, 0.0)
    count = um.sum(dim=1, keepdim=True).to(torch.float32)
    return unit.sum(dim=1) / torch.where(count > 0, count, torch.ones_like(count))


def situation_variant(
    cos: Callable[[str, str], Tensor],
    has: Callable[[str], Tensor],
    ntype: Tensor,
    qm: Tensor,
    um: Tensor,
    w: BlendWeights,
) -> Tensor:
    """(b, n): sum (or mean) over units of the SpecificSituation / AbstractSituation score.

    ``cos`` as in :func:`semantic_variant`; ``has(note field)`` and ``ntype``: the notes'
    field presence and ``NODE_*`` codes, shaped to broadcast against ``(b, U, n)`` (``(n,)``
    for one memory, ``(b, 1, n)`` for candidate rows).
    """

    def q(name: str) -> Tensor:  # (b, U, 1)
        return qm[:, :, _Q[name]].unsqueeze(-1)

    q_nar, q_ln, q_lc = q("narrative"), q("location_name"), q("location_coordinates")
    q_pn, q_pr = q("participant_name"), q("participant_role")
    q_ea, q_et = q("environment_atmosphere"), q("environment_tone")
    q_aa, q_ai, q_at = q("event_action"), q("event_initiator"), q("event_target")

    name = cos("location_name", "location_name")
    location = torch.where(
        q_lc,
        w.sit_location_name * name
        + w.sit_location_coord * cos("location_coordinates", "location_coordinates"),
        name,
    )
    p_name = cos("participant_name", "participant_name")
    p_role = cos("participant_role", "participant_role")
    participant = torch.where(
        q_pn & q_pr,
        w.sit_participant_name * p_name + w.sit_participant_role * p_role,
        torch.where(q_pn, p_name, torch.where(q_pr, p_role, 0.0)),
    )
    atm = cos("environment_atmosphere", "environment_atmosphere")
    tone = cos("environment_tone", "environment_tone")
    environment = torch.where(
        q_ea & q_et,
        w.sit_env_atmosphere * atm + w.sit_env_tone * tone,
        torch.where(q_ea, atm, torch.where(q_et, tone, 0.0)),
    )
    action = cos("event_action", "event_action")
    initiator = cos("event_initiator", "event_initiator")
    target = cos("event_target", "event_target")
    a_i = f32(w.sit_event_initiator_only_action)
    a_t = f32(w.sit_event_target_only_action)
    event = torch.where(
        q_ai & q_at,
        w.sit_event_initiator * initiator
        + w.sit_event_target * target
        + w.sit_event_action * action,
        torch.where(
            q_ai,
            one_minus_f32(a_i) * initiator + a_i * action,
            torch.where(q_at, one_minus_f32(a_t) * target + a_t * action, action),
        ),
    )

    q_loc, q_part, q_env = q_ln, q_pn | q_pr, q_ea | q_et
    n_loc, n_part, n_event = has("location_name"), has("participant_name"), has("event_action")
    zero = torch.zeros((), dtype=torch.float32, device=qm.device)

    # SpecificSituation: max(0, every score that exists)
    specific = torch.where(q_nar, cos("narrative", "narrative"), zero).clamp_min(0.0)
    specific = torch.maximum(specific, torch.where(q_loc & n_loc, location, zero))
    specific = torch.maximum(specific, torch.where(q_part & n_part, participant, zero))
    specific = torch.maximum(specific, torch.where(q_env, environment, zero))
    specific = torch.maximum(specific, torch.where(q_aa & n_event, event, zero))

    # AbstractSituation: max(0, its leaf's structured score, cos(narrative, fused_self))
    is_abs = ntype == NODE_ABSTRACT
    leaf_loc = n_loc
    leaf_part = ~leaf_loc & n_part
    leaf_env = ~leaf_loc & ~leaf_part & (has("environment_atmosphere") | has("environment_tone"))
    leaf_event = ~leaf_loc & ~leaf_part & ~leaf_env & n_event
    structured = torch.where(
        leaf_loc & q_loc,
        location,
        torch.where(
            leaf_part & q_part,
            participant,
            torch.where(leaf_env & q_env, environment, torch.where(leaf_event & q_aa, event, zero)),
        ),
    )
    abstract = torch.maximum(
        structured.clamp_min(0.0), torch.where(q_nar, cos("narrative", "fused_self"), zero)
    )

    unit = torch.where(ntype == NODE_SPECIFIC, specific, torch.where(is_abs, abstract, zero))
    unit = torch.where(um.unsqueeze(-1), unit, zero)
    total = unit.sum(dim=1)
    if w.situation_units == "mean":
        count = um.sum(dim=1, keepdim=True).to(torch.float32)
        total = total / torch.where(count > 0, count, torch.ones_like(count))
    return total


class NoteSide(NamedTuple):
    """The note side of the structured similarity in the compact layout (docs/spec.md §3,
    DECISION "compact note layout"): computed once per snapshot (:func:`note_side` /
    :func:`note_side_compact`; ``QueryEmbeddingBatch.score`` caches it in ``MemoryGraph.cache``,
    a ``MemoryBank``'s union holds every agent's, concatenated once).

    Only the fields notes have are held: ``rows`` are distinct L2-normalized field vectors,
    ``index`` points each (note, field) at one of them, or at the last row (all zeros) when the
    note lacks the field. A kernel gathers, per note field it needs, the rows of the notes it
    scores (``(n, D)``, never the ``(n, F, D)`` block) and matches them in the same matmul
    shapes as a dense block would: the scores are bit for bit those of the dense layout.

    ``rows`` and ``tag`` are each a dense tensor or, when their vectors are sparse (a
    ``HashingEmbedder``'s: ≤ 25% non-zero cells), a
    :class:`~soulmem_torch.functional.sparse_rows.SparseRows` of the same values (DECISION
    "sparse note side", docs/spec.md §3): ``row_dots`` / ``rows_matmul`` read either; sums
    over the non-zero cells differ from the dense sums in the last float32 bits (~1e-8).
    """

    rows: Tensor | SparseRows  # (P + 1, D) f32: normalized distinct field rows, then a zero row
    index: Tensor  # (N, F) int64: row of each note field, P where absent
    mask: Tensor  # (N, F) bool: the note has the field
    tag: Tensor | SparseRows  # (N, D) f32: normalized tags, zero for notes without an embedding
    no_tag: Tensor  # (N,) bool: no tag vector (all zeros, or no embedding)
    has_emb: Tensor  # (N,) bool: the note has an embedding (``tag_mask``)

    @property
    def num_nodes(self) -> int:
        return int(self.index.shape[0])

    @property
    def field(self) -> Tensor:
        """The dense ``(N, F, D)`` normalized fields (absent ones zero): a fresh copy, for
        inspection only — no kernel reads it."""
        n, f = (int(x) for x in self.index.shape)
        rows = self.rows
        if isinstance(rows, SparseRows):
            return rows.select(self.index.reshape(-1)).to_dense().view(n, f, -1)
        return rows.index_select(0, self.index.reshape(-1)).view(n, f, -1)

    @property
    def sparse(self) -> bool:
        """Whether the field rows are held sparse."""
        return isinstance(self.rows, SparseRows)

    def to(self, device: torch.device | str) -> NoteSide:
        """A copy on ``device`` (``self`` when already there)."""
        dev = torch.device(device)
        if self.rows.device == dev or (dev.index is None and self.rows.device.type == dev.type):
            return self
        return NoteSide(
            self.rows.to(dev), self.index.to(dev), self.mask.to(dev), self.tag.to(dev),
            self.no_tag.to(dev), self.has_emb.to(dev),
        )  # fmt: skip

    def nbytes(self) -> int:
        """Bytes of its tensors."""
        return sum(
            t.nbytes() if isinstance(t, SparseRows) else t.numel() * t.element_size()
            for t in self[:6]
        )


def note_side_compact(
    tag_emb: Tensor,
    tag_mask: Tensor,
    field_rows: Tensor,
    field_pos: Tensor,
    *,
    device: torch.device | str | None = None,
) -> NoteSide:
    """The note side of a compact layout (``MemoryGraph.field_rows`` / ``field_pos``):
    ``field_rows`` normalized once, the tags normalized and masked; each table held sparse
    when its vectors are (:class:`NoteSide`).

    Args:
        tag_emb: shape (N, D), float. Tag vectors.
        tag_mask: shape (N,), bool. The note has an embedding.
        field_rows: shape (P, D), float. Field vectors, grouped by field (as
            :func:`~soulmem_torch.embedding.fields.stack_compact_field_embeddings` makes them).
        field_pos: shape (N, F), integer. Row of each (note, field), ``-1`` where absent.
    """
    device = tag_emb.device if device is None else torch.device(device)
    p, d = int(field_rows.shape[0]), int(tag_emb.shape[-1])
    if len(field_rows.shape) != 2 or (p and int(field_rows.shape[1]) != d):
        raise ValidationError(
            f"field_rows: expected shape (P, {d}) (the width of tag_emb), found "
            f"{tuple(field_rows.shape)}"
        )
    if not isinstance(field_rows, SparseRows):
        field_rows = field_rows.reshape(p, d)
    rows = _normalized_table(field_rows, device, zero_row=True)
    index = field_pos.to(device, torch.int64)
    mask = index >= 0
    index = torch.where(mask, index, p)
    has_emb = tag_mask.to(device)
    tag = tag_emb.to(device, torch.float32)
    tn = _normalized_table(tag, device, zero_row=False, keep=has_emb)
    if isinstance(tag, SparseRows):  # held sparse: a row is non-zero iff it has cells
        nonzero = tag.crow[1:] > tag.crow[:-1]
    else:
        nonzero = (tag != 0).any(dim=-1)
    no_tag = ~(nonzero & has_emb)
    return NoteSide(rows, index, mask, tn, no_tag, has_emb)


def note_side(
    tag_emb: Tensor,
    tag_mask: Tensor,
    field_emb: Tensor,
    field_mask: Tensor,
    *,
    device: torch.device | str | None = None,
) -> NoteSide:
    """The note side of a dense ``(N, F, D)`` field block and its ``(N, F)`` mask (compacted:
    only the present cells are normalized and kept)."""
    from soulmem_torch.embedding.fields import dense_to_compact

    device = field_emb.device if device is None else torch.device(device)
    rows, index = dense_to_compact(field_emb.to(device), field_mask.to(device))
    return note_side_compact(tag_emb, tag_mask, rows, index, device=device)


def _check_note_side(notes: NoteSide, node_type: Tensor, d: int) -> int:
    n = int(node_type.shape[0])
    for name, t, shape in (
        ("notes.index", notes.index, (n, len(FIELD_NAMES))),
        ("notes.mask", notes.mask, (n, len(FIELD_NAMES))),
        ("notes.tag", notes.tag, (n, d)),
        ("notes.no_tag", notes.no_tag, (n,)),
        ("notes.has_emb", notes.has_emb, (n,)),
    ):
        if tuple(t.shape) != shape:
            raise ValidationError(
                f"{name}: expected shape {shape} (N={n} notes of node_type, D={d}), found "
                f"{tuple(t.shape)}"
            )
    if int(notes.rows.shape[-1]) != d:
        raise ValidationError(
            f"notes.rows: expected width D = {d} (that of the queries), found "
            f"{int(notes.rows.shape[-1])}"
        )
    return n


def _single_cos(qs: QueryFields, notes: NoteSide, sel: Tensor) -> Callable[[str, str], Tensor]:
    """``cos(query field, note field)`` of the queries ``qs`` against the notes ``sel`` of one
    memory: the notes' rows of that field (the zero row where absent), one
    :func:`rows_matmul` — on a small table the union's per-pair kernel, so a memory's scores
    are a bank's and identical notes tie exactly."""
    b, u = qs.shape
    n = int(sel.shape[0])
    index = notes.index.index_select(0, sel)  # (n, F)

    def cos(q_name: str, f_name: str) -> Tensor:
        q = qs.slice(_Q[q_name])
        if q is None:  # no unit has the field: the cosines of zero rows
            return torch.zeros(b, u, n, dtype=torch.float32, device=qs.device)
        return rows_matmul(q.reshape(b * u, -1), notes.rows, index[:, _F[f_name]]).view(b, u, n)

    return cos


def embedding_scores_compact(
    query_tag: Tensor,
    query_kind: Tensor,
    query_field: Tensor,
    query_field_mask: Tensor,
    query_unit_mask: Tensor,
    notes: NoteSide,
    node_type: Tensor,
    *,
    weights: BlendWeights | None = None,
) -> Tensor:
    """:func:`embedding_scores` on the compact note side (:func:`note_side_compact`): shape
    (B, N), float32, on the queries' device. What ``QueryEmbeddingBatch.score`` runs."""
    w = weights if weights is not None else BlendWeights()
    if query_field.dim() != 4 or query_field.shape[2] != len(QUERY_FIELD_NAMES):
        raise ValidationError(
            f"query_field: expected shape (B, U, {len(QUERY_FIELD_NAMES)}, D), found "
            f"{tuple(query_field.shape)}"
        )
    b, u, _, d = (int(x) for x in query_field.shape)
    for name, value, shape in (
        ("query_tag", query_tag, (b, d)),
        ("query_kind", query_kind, (b,)),
        ("query_field_mask", query_field_mask, (b, u, len(QUERY_FIELD_NAMES))),
        ("query_unit_mask", query_unit_mask, (b, u)),
    ):
        if tuple(value.shape) != shape:
            raise ValidationError(f"{name}: expected shape {shape}, found {tuple(value.shape)}")
    n = _check_note_side(notes, node_type, d)
    device = query_field.device
    notes = notes.to(device)
    um = query_unit_mask
    qm = query_field_mask & um.unsqueeze(-1)
    ntype = node_type.to(device)
    kind = query_kind.to(device)

    variant = torch.zeros(b, n, dtype=torch.float32, device=device)
    sem_q = (kind == QUERY_SEMANTIC).nonzero().squeeze(1)
    sit_q = (kind == QUERY_SITUATION).nonzero().squeeze(1)
    sem_n = (ntype == NODE_SEMANTIC).nonzero().squeeze(1)
    sit_n = ((ntype == NODE_SPECIFIC) | (ntype == NODE_ABSTRACT)).nonzero().squeeze(1)
    if sem_q.numel() and sem_n.numel():
        qs = QueryFields(query_field, sem_q, qm[sem_q])
        variant[sem_q.unsqueeze(1), sem_n.unsqueeze(0)] = semantic_variant(
            _single_cos(qs, notes, sem_n), qs.qm, um[sem_q], w
        )
    if sit_q.numel() and sit_n.numel():
        qs = QueryFields(query_field, sit_q, qm[sit_q])
        fm = notes.mask.index_select(0, sit_n)
        variant[sit_q.unsqueeze(1), sit_n.unsqueeze(0)] = situation_variant(
            _single_cos(qs, notes, sit_n), lambda name: fm[:, _F[name]], ntype[sit_n],
            qs.qm, um[sit_q], w,
        )  # fmt: skip

    tag_cos = rows_matmul(normalize_rows(query_tag), notes.tag)
    q_zero = ~(query_tag != 0).any(dim=-1)
    no_tag = q_zero.unsqueeze(1) | notes.no_tag.unsqueeze(0)
    score = torch.where(no_tag, variant, w.tag * tag_cos + w.variant * variant)
    return torch.where(notes.has_emb.unsqueeze(0), score, 0.0)


def embedding_scores(
    query_tag: Tensor,
    query_kind: Tensor,
    query_field: Tensor,
    query_field_mask: Tensor,
    query_unit_mask: Tensor,
    tag_emb: Tensor,
    tag_mask: Tensor,
    field_emb: Tensor,
    field_mask: Tensor,
    node_type: Tensor,
    *,
    weights: BlendWeights | None = None,
    notes: NoteSide | None = None,
) -> Tensor:
    """The embedding score (tag blend of the variant score) of B queries vs N notes.

    See the module docstring for the arguments and the rules. ``notes``: the note side already
    built (:func:`note_side` of the same ``tag_emb`` / ``tag_mask`` / ``field_emb`` /
    ``field_mask``, or :func:`note_side_compact` of the same notes' compact layout);
    ``None`` → built here (the dense block compacted first). The kernel itself is
    :func:`embedding_scores_compact`.

    Returns:
        shape (B, N), float32, on the inputs' device.

    Raises:
        ValidationError: inconsistent shapes (naming the argument) or non-bool masks.
    """
    _check_inputs(
        query_tag, query_kind, query_field, query_field_mask, query_unit_mask,
        tag_emb, tag_mask, field_emb, field_mask, node_type,
    )  # fmt: skip
    device = query_field.device
    if notes is None:
        notes = note_side(tag_emb, tag_mask, field_emb, field_mask, device=device)
    score = embedding_scores_compact(
        query_tag, query_kind, query_field, query_field_mask, query_unit_mask,
        notes, node_type, weights=weights,
    )  # fmt: skip
    return torch.where(tag_mask.to(device).unsqueeze(0), score, 0.0)


def fuse_string_scores(emb_scores: Tensor, string_scores: Tensor, *, alpha: float = 0.6) -> Tensor:
    """``str <= 0 → emb``, else ``max(emb, α·emb + (1 − α)·str)`` (float32, elementwise).

    Args:
        emb_scores: shape (B, N). Embedding scores.
        string_scores: shape (B, N). String-channel scores (0 where not applicable).
        alpha: in [0, 1]. ``string_blend_alpha``.
    """
    if emb_scores.shape != string_scores.shape:
        raise ValidationError(
            f"string_scores: expected shape {tuple(emb_scores.shape)} (that of the embedding "
            f"scores), found {tuple(string_scores.shape)}"
        )
    s = string_scores.to(emb_scores.device, torch.float32)
    a = f32(alpha)
    blended = a * emb_scores + one_minus_f32(a) * s
    return torch.where(s <= 0, emb_scores, torch.maximum(emb_scores, blended))


def fused_similarity(
    query_tag: Tensor,
    query_kind: Tensor,
    query_field: Tensor,
    query_field_mask: Tensor,
    query_unit_mask: Tensor,
    tag_emb: Tensor,
    tag_mask: Tensor,
    field_emb: Tensor,
    field_mask: Tensor,
    node_type: Tensor,
    *,
    string_scores: Tensor | None = None,
    weights: BlendWeights | None = None,
    notes: NoteSide | None = None,
) -> Tensor:
    """The original's ``compute_fused`` for B queries vs N notes: shape (B, N), float32.

    :func:`embedding_scores` fused with the string channel (``string_scores``, shape (B, N),
    ``None`` = no string channel) by ``weights.string_blend_alpha``; notes without an embedding
    score 0. ``notes``: the cached note side (see :func:`embedding_scores`).
    """
    w = weights if weights is not None else BlendWeights()
    emb = embedding_scores(
        query_tag, query_kind, query_field, query_field_mask, query_unit_mask,
        tag_emb, tag_mask, field_emb, field_mask, node_type, weights=w, notes=notes,
    )  # fmt: skip
    if string_scores is None:
        return emb
    fused = fuse_string_scores(emb, string_scores, alpha=w.string_blend_alpha)
    return torch.where(tag_mask.to(emb.device).unsqueeze(0), fused, 0.0)


def fused_similarity_compact(
    query_tag: Tensor,
    query_kind: Tensor,
    query_field: Tensor,
    query_field_mask: Tensor,
    query_unit_mask: Tensor,
    notes: NoteSide,
    node_type: Tensor,
    *,
    string_scores: Tensor | None = None,
    weights: BlendWeights | None = None,
) -> Tensor:
    """:func:`fused_similarity` on the compact note side (:func:`note_side_compact`)."""
    w = weights if weights is not None else BlendWeights()
    emb = embedding_scores_compact(
        query_tag, query_kind, query_field, query_field_mask, query_unit_mask,
        notes, node_type, weights=w,
    )  # fmt: skip
    if string_scores is None:
        return emb
    fused = fuse_string_scores(emb, string_scores, alpha=w.string_blend_alpha)
    return torch.where(notes.has_emb.to(emb.device).unsqueeze(0), fused, 0.0)
