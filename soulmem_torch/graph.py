"""``MemoryGraph``: the tensor snapshot of a memory cluster, as a ``torch_geometric.data.Data``.

The snapshot is what every kernel reads (docs/spec.md §5–6): edges in CSR order by source, their link
kind, intensity, confidence and probability, node types with masks, and the field embeddings
with presence masks. Build it from a cluster (:meth:`MemoryGraph.from_cluster`, or
:meth:`MemoryGraph.of` / ``working_memory.graph()``, which cache it per cluster version and
device) or straight from tensors
(:meth:`MemoryGraph.from_tensors`) for synthetic graphs with millions of edges.

Tensors (``N`` nodes, ``E`` edges, ``F = len(FIELD_NAMES)`` fields, ``D`` embedding width):

=====================  ==============  ============================================================
key                    shape/dtype     meaning
=====================  ==============  ============================================================
``edge_index``         (2, E) i64      source / target; sorted by source, **stable** (CSR order)
``rowptr``             (N+1,) i64      ``rowptr[u]:rowptr[u+1]`` are ``u``'s out-edges
``edge_kind``          (E,) i64        ``LINK_*`` code (``functional.codes``)
``intensity``          (E,) f64        link intensity (finite, >= 0)
``confidence``         (E,) f32        Sem-link confidence in [0, 1]; 0 for other kinds
``prob``               (E,) f64        TrigToAction probability in [0, 1]; 0 for other kinds
``node_type``          (N,) i64        ``NODE_*`` code
``is_semantic``        (N,) bool       ``node_type == NODE_SEMANTIC``; also ``is_specific``,
                                       ``is_abstract``, ``is_procedure``
``tag_emb``            (N, D) f32      tag vector (zeros where absent); ``None`` if no note has one
``tag_mask``           (N,) bool       note has an embedding
``field_rows``         (P, D) f32      the fields notes have, distinct vectors grouped by field
                                       (compact layout, docs/spec.md §3); ``None`` if no embedding
``field_pos``          (N, F) i32      row of ``field_rows`` of each (note, field), ``-1`` absent
``create_time_ns``     (N,) i64        note creation time, ns since the Unix epoch
``retrieval_count``    (N,) i64        the note's own retrieval count
=====================  ==============  ============================================================

When the vectors are sparse (the offline embedder's hashed features; docs/spec.md §3, DECISION
"compact raw vectors") a snapshot built from a cluster holds ``tag_emb`` and ``field_rows`` as
:class:`~soulmem_torch.functional.sparse_rows.SparseRows` (outside PyG's storage:
:attr:`MemoryGraph.tag_table` / :attr:`MemoryGraph.field_table` read them as held); the two
attributes then read as dense copies made on each read, and assigning one replaces the table.

``field_emb`` (N, F, D) and ``field_mask`` (N, F) — the dense block in ``FIELD_NAMES`` order,
zeros where absent — are compatibility views: materialized from the compact layout on each
read (never cached, never used by a kernel); assigning a dense block compacts it.

Within one source, edges keep the cluster's link insertion order (a stable sort), so the
sequential PPR oracle can visit them newest first by reversing each row.

Besides the tensors, a snapshot carries plain-Python bookkeeping that PyG does not see:
``ids`` / ``index_of`` (node index ↔ ``MemoryId``), ``link_ids`` (per CSR edge), ``version``
(the cluster version it was built from) and ``cache`` (a dict where callers memoize derived
operators, e.g. PPR transition matrices per preference).

**Why a subclass of ``Data``** (and not a wrapper): a snapshot *is* a graph — PyG utilities,
``validate()``, samplers and user code take it as a plain ``Data`` without unwrapping. Two
deliberate differences from ``Data``: ``to`` / ``cpu`` / ``cuda`` return a **new** snapshot and
never move one in place (snapshots are shared through the cluster's cache), and ``cache`` is
emptied on every copy, move, ``apply`` and pickle, because what it holds belongs to one device
and one set of tensors. PyG's structural helpers (``subgraph``, ``edge_subgraph``, batching)
return objects whose ``rowptr`` and id maps are not updated: rebuild with :meth:`from_tensors`.
"""

from __future__ import annotations

import copy
import itertools
import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch_geometric.data import Data

from soulmem_torch.device import resolve_device
from soulmem_torch.embedding.compact import stack_sparse_tables
from soulmem_torch.embedding.fields import (
    FIELD_NAMES,
    compact_to_dense,
    dense_to_compact,
    stack_compact_field_embeddings,
)
from soulmem_torch.errors import NotFoundError, ValidationError
from soulmem_torch.functional.codes import (
    LINK_PROC,
    LINK_SEM,
    LINK_SIT_ABSTRACT_TO_SPECIFIC,
    LINK_SIT_SPECIFIC_TO_ABSTRACT,
    NODE_ABSTRACT,
    NODE_PROCEDURE,
    NODE_SEMANTIC,
    NODE_SPECIFIC,
)
from soulmem_torch.functional.sparse_rows import SparseRows
from soulmem_torch.model.ids import LinkId, MemoryId
from soulmem_torch.model.links import (
    AbstractToSpecific,
    SemMemLink,
    SpecificToAbstract,
    TrigToAction,
)

if TYPE_CHECKING:
    from soulmem_torch.runtime.cluster import MemoryCluster

__all__ = ["MemoryGraph"]

_I64 = torch.int64
_F64 = torch.float64
_F32 = torch.float32

_NODE_CODES = {
    "Semantic": NODE_SEMANTIC,
    "SpecificSituation": NODE_SPECIFIC,
    "AbstractSituation": NODE_ABSTRACT,
    "Procedure": NODE_PROCEDURE,
}
_LINK_CODES: dict[type, int] = {
    TrigToAction: LINK_PROC,
    SemMemLink: LINK_SEM,
    AbstractToSpecific: LINK_SIT_ABSTRACT_TO_SPECIFIC,
    SpecificToAbstract: LINK_SIT_SPECIFIC_TO_ABSTRACT,
}
_NODE_CODE_SET = (NODE_SEMANTIC, NODE_SPECIFIC, NODE_ABSTRACT, NODE_PROCEDURE)
_LINK_CODE_SET = (LINK_PROC, LINK_SEM, LINK_SIT_ABSTRACT_TO_SPECIFIC, LINK_SIT_SPECIFIC_TO_ABSTRACT)
_OPTIONAL_KEYS = frozenset({"tag_emb", "tag_mask", "field_rows", "field_pos"})
_RAW_KEYS = frozenset({"tag_emb", "field_rows"})


# -------------------------------------------------------------------------------------------
# validators (boundary only)
# -------------------------------------------------------------------------------------------
def _shape(value: Any) -> str:
    return str(tuple(value.shape)) if isinstance(value, Tensor) else type(value).__name__


def _check_tensor(name: str, value: Any, shape: tuple[int, ...], kind: str) -> Tensor:
    """``kind``: ``"int"`` (integer, not bool), ``"float"`` or ``"bool"``."""
    if not isinstance(value, Tensor):
        raise ValidationError(f"{name}: expected a tensor of shape {shape}, found {_shape(value)}")
    if tuple(value.shape) != shape:
        raise ValidationError(f"{name}: expected shape {shape}, found {tuple(value.shape)}")
    dtype = value.dtype
    ok = {
        "int": not dtype.is_floating_point and not dtype.is_complex and dtype != torch.bool,
        "float": dtype.is_floating_point,
        "bool": dtype == torch.bool,
    }[kind]
    if not ok:
        expected = {"int": "an integer", "float": "a floating-point", "bool": "a bool"}[kind]
        raise ValidationError(f"{name}: expected {expected} tensor, found {dtype}")
    return value


def _first_bad(name: str, bad: Tensor, values: Tensor, what: str, expectation: str) -> None:
    if bool(bad.any()):
        pos = int(bad.nonzero()[0, 0])
        raise ValidationError(
            f"{name}: expected {expectation}, found {values[pos].item()!r} at {what} {pos}"
        )


def _check_codes(name: str, value: Tensor, allowed: tuple[int, ...], what: str) -> None:
    """``allowed`` is a contiguous range of codes: one ``aminmax`` pass on the happy path."""
    if value.numel() == 0:
        return
    lo, hi = (int(v) for v in torch.aminmax(value))
    if lo >= allowed[0] and hi <= allowed[-1]:
        return
    _first_bad(
        name, (value < allowed[0]) | (value > allowed[-1]), value, what, f"codes in {allowed}"
    )


def _check_range(
    name: str, value: Tensor, what: str, *, low: float = 0.0, high: float | None = None
) -> None:
    """Finite and in ``[low, high]``: one ``aminmax`` pass on the happy path (NaN propagates)."""
    if value.numel() == 0:
        return
    lo, hi = (float(v) for v in torch.aminmax(value))
    if lo >= low and math.isfinite(hi) and (high is None or hi <= high):
        return
    expectation = (
        f"finite values in [{low}, {high}]" if high is not None else f"finite values >= {low}"
    )
    bad = ~torch.isfinite(value) | (value < low)
    if high is not None:
        bad |= value > high
    _first_bad(name, bad, value, what, expectation)


def _check_finite(name: str, value: Tensor) -> None:
    """All finite. Fast path: a finite sum (NaN / inf propagate; an overflow falls through)."""
    if value.numel() == 0 or math.isfinite(float(value.sum(dtype=torch.float64))):
        return
    finite = torch.isfinite(value)
    if not bool(finite.all()):
        pos = tuple(int(i) for i in (~finite).nonzero()[0])
        raise ValidationError(
            f"{name}: expected finite values, found {value[pos].item()!r} at {pos}"
        )


# -------------------------------------------------------------------------------------------
# bookkeeping outside PyG's storage
# -------------------------------------------------------------------------------------------
class _Shared:
    """Id maps and version, shared by a snapshot and all its copies (so ids created lazily on
    one copy are the ids of every copy)."""

    __slots__ = ("ids", "index_of", "link_ids", "version")

    def __init__(
        self,
        ids: list[MemoryId] | None,
        index_of: dict[MemoryId, int] | None,
        link_ids: list[LinkId] | None,
        version: int | None,
    ) -> None:
        self.ids = ids
        self.index_of = index_of
        self.link_ids = link_ids
        self.version = version

    def __getstate__(self) -> dict[str, Any]:
        return {"ids": self.ids, "link_ids": self.link_ids, "version": self.version}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.ids = state["ids"]
        self.index_of = None  # rebuilt on demand
        self.link_ids = state["link_ids"]
        self.version = state["version"]


class _GraphMeta:
    """Per-snapshot Python bookkeeping. ``cache`` never survives a copy, move or pickle."""

    __slots__ = ("cache", "shared")

    def __init__(
        self,
        ids: list[MemoryId] | None = None,
        index_of: dict[MemoryId, int] | None = None,
        link_ids: list[LinkId] | None = None,
        version: int | None = None,
        *,
        shared: _Shared | None = None,
    ) -> None:
        self.shared = shared if shared is not None else _Shared(ids, index_of, link_ids, version)
        self.cache: dict[Any, Any] = {}

    def fork(self) -> _GraphMeta:
        """Same (shared, immutable) id maps, fresh empty cache."""
        return _GraphMeta(shared=self.shared)

    def __copy__(self) -> _GraphMeta:
        return self.fork()

    def __deepcopy__(self, memo: dict[int, Any]) -> _GraphMeta:
        return self.fork()

    def __getstate__(self) -> dict[str, Any]:
        return {"shared": self.shared}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.shared = state["shared"]
        self.cache = {}


class MemoryGraph(Data):
    """Tensor snapshot of a memory cluster; a ``torch_geometric.data.Data`` (see module doc).

    Build with :meth:`from_cluster` / :meth:`of` or :meth:`from_tensors`; the bare
    constructor only exists for PyG's internals.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.__dict__["_meta"] = _GraphMeta()

    # -- optional tensors read as None ---------------------------------------------------
    def __getattr__(self, key: str) -> Any:
        if key in _RAW_KEYS:
            raw = self.__dict__.get("_raw")
            if raw is not None and key in raw:  # held sparse: a dense copy on each read
                return raw[key].to_dense()
        if key in _OPTIONAL_KEYS:
            store = self.__dict__.get("_store")
            if store is not None and key not in store:
                return None
        return super().__getattr__(key)

    def __setattr__(self, key: str, value: Any) -> None:
        if key in _RAW_KEYS:
            self._drop_raw(key)
        super().__setattr__(key, value)

    def _drop_raw(self, key: str) -> None:
        raw = self.__dict__.get("_raw")
        if raw is not None and key in raw:  # copied: copies of this snapshot keep theirs
            rest = {k: v for k, v in raw.items() if k != key}
            self.__dict__["_raw"] = rest or None

    # -- the raw tables as held ----------------------------------------------------------
    @property
    def tag_table(self) -> Tensor | SparseRows | None:
        """``tag_emb`` as the snapshot holds it, never copied: a dense ``(N, D)`` tensor or,
        for sparse vectors (docs/spec.md §3, DECISION "compact raw vectors"), a
        :class:`~soulmem_torch.functional.sparse_rows.SparseRows` of the same values."""
        raw = self.__dict__.get("_raw")
        if raw is not None and "tag_emb" in raw:
            return raw["tag_emb"]  # type: ignore[no-any-return]
        return self.tag_emb  # type: ignore[no-any-return]

    @property
    def field_table(self) -> Tensor | SparseRows | None:
        """``field_rows`` as the snapshot holds it (dense or :class:`SparseRows`, see
        :attr:`tag_table`)."""
        raw = self.__dict__.get("_raw")
        if raw is not None and "field_rows" in raw:
            return raw["field_rows"]  # type: ignore[no-any-return]
        return self.field_rows  # type: ignore[no-any-return]

    def _set_compact(
        self, tag: SparseRows, tag_mask: Tensor, rows: SparseRows, field_pos: Tensor
    ) -> None:
        """Holds the raw tables sparse (``tag_emb`` / ``field_rows`` read as dense copies)."""
        self._store.tag_mask = tag_mask
        self._store.field_pos = field_pos
        self.__dict__["_raw"] = {"tag_emb": tag, "field_rows": rows}

    def _densify(self) -> None:
        """The raw tables as dense tensors in PyG's storage (before an ``apply``)."""
        raw = self.__dict__.get("_raw")
        if raw:
            for key, table in raw.items():
                self._store[key] = table.to_dense()
            self.__dict__["_raw"] = None

    # -- the dense field block: a compatibility view of the compact layout ------------------
    @property
    def field_emb(self) -> Tensor | None:
        """``(N, F, D)`` float32 field vectors in ``FIELD_NAMES`` order, zeros where absent:
        a fresh dense copy materialized from ``field_rows`` / ``field_pos`` on each read
        (compatibility view; kernels read the compact layout). ``None`` without fields.
        Assigning a dense block stores every cell as present (as ``from_tensors`` without a
        mask); assigning :attr:`field_mask` after it keeps only the masked cells."""
        rows, index = self.field_rows, self.field_pos
        if rows is None or index is None:
            return None
        return compact_to_dense(rows, index)[0]

    @field_emb.setter
    def field_emb(self, value: Tensor | None) -> None:
        self._m.cache.clear()
        self._drop_raw("field_rows")
        if value is None:
            for key in ("field_rows", "field_pos"):
                if key in self._store:
                    del self._store[key]
            return
        n, f = int(value.shape[0]), int(value.shape[1])
        every = torch.ones(n, f, dtype=torch.bool, device=value.device)
        rows, pos = dense_to_compact(value.to(torch.float32), every)
        self._store.field_rows, self._store.field_pos = rows, pos

    @property
    def field_mask(self) -> Tensor | None:
        """``(N, F)`` bool: the note has the field (``field_pos >= 0``); ``None`` without
        fields. Assigning a mask keeps only those fields' vectors."""
        index = self.field_pos
        return None if index is None else index >= 0

    @field_mask.setter
    def field_mask(self, value: Tensor | None) -> None:
        self._m.cache.clear()
        if value is None:
            return
        dense = self.field_emb
        if dense is None:
            return
        rows, index = dense_to_compact(dense, value.to(dense.device))
        self._drop_raw("field_rows")
        self._store.field_rows, self._store.field_pos = rows, index

    @property
    def _m(self) -> _GraphMeta:
        meta = self.__dict__.get("_meta")
        if meta is None:
            meta = self.__dict__["_meta"] = _GraphMeta()
        return meta

    # -- bookkeeping ----------------------------------------------------------------------
    @property
    def ids(self) -> list[MemoryId]:
        """``MemoryId`` of every node (index order). A graph built from tensors without ``ids``
        gets fresh random ids on first access (so strategies can run on synthetic graphs)."""
        shared = self._m.shared
        if shared.ids is None:
            shared.ids = [MemoryId.new() for _ in range(int(self.num_nodes or 0))]
        return shared.ids

    @property
    def index_of(self) -> dict[MemoryId, int]:
        """``MemoryId`` -> node index."""
        shared = self._m.shared
        if shared.index_of is None:
            shared.index_of = {mid: i for i, mid in enumerate(self.ids)}
        return shared.index_of

    @property
    def link_ids(self) -> list[LinkId]:
        """``LinkId`` of every edge, in CSR order (fresh random ids for a tensor-built graph
        without ``link_ids``, created on first access)."""
        shared = self._m.shared
        if shared.link_ids is None:
            shared.link_ids = [LinkId.new() for _ in range(int(self.num_edges))]
        return shared.link_ids

    @property
    def version(self) -> int | None:
        """The cluster version this snapshot was built from (``None`` for tensor-built graphs
        unless given)."""
        return self._m.shared.version

    @property
    def cache(self) -> dict[Any, Any]:
        """Per-snapshot memo for derived operators (e.g. PPR transition matrices per
        preference). Emptied on every copy, move (``to``), ``apply`` and pickle."""
        return self._m.cache

    @property
    def device(self) -> torch.device:
        """Device of the tensors (that of ``edge_index``)."""
        return self.edge_index.device

    @property
    def num_links(self) -> int:
        """``E`` (same as ``num_edges``)."""
        return int(self.edge_index.shape[1])

    def indices(
        self, ids: Iterable[MemoryId], *, return_mask: bool = False, strict: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Node indices of ``ids`` (int64, on :attr:`device`), unknown ids dropped.

        Args:
            ids: ``MemoryId`` values, in the order wanted.
            return_mask: also return a bool mask of shape ``(len(ids),)``: which ids are known.
            strict: raise ``NotFoundError`` on the first unknown id instead of dropping it.
        """
        index_of = self.index_of
        ids = list(ids)
        raw = [index_of.get(mid, -1) for mid in ids]
        if strict:
            for mid, i in zip(ids, raw):
                if i < 0:
                    raise NotFoundError(f"ids: {mid} is not a node of this graph")
        full = torch.tensor(raw, dtype=_I64)
        mask = full >= 0
        out = full[mask].to(self.device)
        if return_mask:
            return out, mask.to(self.device)
        return out

    def to_ids(self, indices: Tensor | Iterable[int]) -> list[MemoryId]:
        """``MemoryId`` of each node index (one ``.tolist()``; convert once, outside loops)."""
        if isinstance(indices, Tensor):
            indices = indices.tolist()
        ids = self.ids
        return [ids[i] for i in indices]

    # -- device moves: copies, never in place ---------------------------------------------
    def apply(self, func: Any, *args: str) -> MemoryGraph:
        """PyG's in-place ``apply``; also empties :attr:`cache` (its contents may be stale)."""
        self._m.cache.clear()
        self._densify()
        return super().apply(func, *args)

    def to(
        self, device: torch.device | str | int, *args: str, non_blocking: bool = False
    ) -> MemoryGraph:
        """A snapshot on ``device`` (``self`` if already there). Never moves ``self``.

        The copy shares the id maps and has an empty :attr:`cache`.
        """
        dev = resolve_device(device)
        if not args and _same_device(self.device, dev):
            return self
        out = copy.copy(self)
        Data.to(out, dev, *args, non_blocking=non_blocking)
        raw = out.__dict__.get("_raw")
        if raw:
            out.__dict__["_raw"] = {k: v.to(dev) for k, v in raw.items()}
        return out

    def cpu(self, *args: str) -> MemoryGraph:
        return self.to("cpu", *args)

    def cuda(
        self, device: int | str | None = None, *args: str, non_blocking: bool = False
    ) -> MemoryGraph:
        return self.to("cuda" if device is None else device, *args, non_blocking=non_blocking)

    def __copy__(self) -> MemoryGraph:
        out = super().__copy__()
        out.__dict__["_meta"] = self._m.fork()
        return out

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_meta"] = self._m.fork()
        return state

    def with_edge_values(
        self, *, intensity: Tensor, confidence: Tensor, prob: Tensor, version: int | None
    ) -> MemoryGraph:
        """A copy with new per-edge ``intensity`` / ``confidence`` / ``prob`` (same shapes,
        dtypes and device), the same nodes, edges and ids, stamped with ``version``.

        What a plasticity update (:mod:`soulmem_torch.consolidate.plasticity`) registers as the
        snapshot of the cluster's next version, instead of rebuilding it from the notes: only
        the link values changed.
        """
        for name, new in (("intensity", intensity), ("confidence", confidence), ("prob", prob)):
            old = getattr(self, name)
            if new.shape != old.shape or new.dtype != old.dtype or new.device != old.device:
                raise ValidationError(
                    f"{name}: expected shape {tuple(old.shape)} of {old.dtype} on {old.device}, "
                    f"found shape {tuple(new.shape)} of {new.dtype} on {new.device}"
                )
        out = copy.copy(self)
        shared = self._m.shared
        out.__dict__["_meta"] = _GraphMeta(
            ids=shared.ids, index_of=shared.index_of, link_ids=shared.link_ids, version=version
        )
        out.intensity, out.confidence, out.prob = intensity, confidence, prob
        return out

    # -- builders -------------------------------------------------------------------------
    @classmethod
    def of(cls, cluster: MemoryCluster, device: torch.device | str | None = None) -> MemoryGraph:
        """The cached snapshot of ``cluster``'s current version on ``device``.

        Built once per cluster version on the CPU (:meth:`from_cluster`), then copied once per
        device; repeated calls return the same object until the cluster changes (the cache is
        :meth:`MemoryCluster.derived <soulmem_torch.runtime.cluster.MemoryCluster.derived>`).

        Args:
            cluster: the memory cluster.
            device: ``None`` -> CPU; ``"auto"`` -> CUDA if available; or any torch device.
        """
        dev = resolve_device(device)
        cpu = torch.device("cpu")
        base = cluster.derived(("graph", cpu), lambda: cls.from_cluster(cluster))
        if dev == cpu:
            return base
        return cluster.derived(("graph", dev), lambda: base.to(dev))

    @classmethod
    def of_many(cls, clusters: Sequence[MemoryCluster]) -> list[MemoryGraph]:
        """:meth:`of` (CPU) of each cluster, the snapshots not cached yet built in one pass
        (:meth:`from_clusters`) and cached as :meth:`of` caches them."""
        cpu = torch.device("cpu")
        key = ("graph", cpu)
        todo = list({id(c): c for c in clusters if c.cached(key) is None}.values())
        if len(todo) > 1:
            for cluster, graph in zip(todo, cls.from_clusters(todo)):
                # (kept only when the cluster has not changed since it was read)
                cluster.derived(
                    key,
                    lambda c=cluster, g=graph: g if g.version == c.version else cls.from_cluster(c),
                )
        return [cls.of(c, cpu) for c in clusters]

    @classmethod
    def from_cluster(cls, cluster: MemoryCluster) -> MemoryGraph:
        """Snapshot of a cluster (on the CPU). Prefer :meth:`of`, which caches it.

        Node ``i`` is ``cluster.ids()[i]``; edges are ``cluster.links()`` stably sorted by
        source index. :meth:`from_clusters` of one cluster.
        """
        return cls.from_clusters([cluster])[0]

    @classmethod
    def from_clusters(cls, clusters: Sequence[MemoryCluster]) -> list[MemoryGraph]:
        """:meth:`from_cluster` of each cluster (CPU), the same graphs: every cluster's columns
        read off its notes and links, then each column of all of them made one tensor and
        checked once (a bank's first question to many new agents builds its snapshots in one
        pass); each graph then holds its own rows of them. A value a check refuses (a
        negative intensity, a confidence above 1, …) is found and named by building each
        cluster on its own (:meth:`from_tensors`' errors)."""
        columns = [_cluster_columns(c) for c in clusters]
        if not columns:
            return []
        sizes = [len(c.ids) for c in columns]
        edges = [len(c.src) for c in columns]
        node_type = torch.tensor([k for c in columns for k in c.node_type], dtype=_I64)
        create_ns = torch.tensor([t for c in columns for t in c.create_ns], dtype=_I64)
        counts = torch.tensor([k for c in columns for k in c.counts], dtype=_I64)
        kind = torch.tensor([k for c in columns for k in c.kind], dtype=_I64)
        intensity = torch.tensor([x for c in columns for x in c.intensity], dtype=_F64)
        confidence = torch.tensor([x for c in columns for x in c.confidence], dtype=_F32)
        prob = torch.tensor([x for c in columns for x in c.prob], dtype=_F64)
        try:
            _check_range("intensity", intensity, "edge")
            _check_range("confidence", confidence, "edge", high=1.0)
            _check_range("prob", prob, "edge", high=1.0)
            _first_bad("retrieval_count", counts < 0, counts, "node", "values >= 0")
        except ValidationError:
            for c in columns:  # the first cluster with the value raises, naming it
                _checked_graph(c)
            raise  # pragma: no cover - a bulk check and a cluster's own agree
        # each cluster's edges in CSR order (a stable sort by source, per cluster: by the
        # source's row in all the clusters' nodes) and each node's first edge
        node_base = torch.tensor([0, *itertools.accumulate(sizes)], dtype=_I64)
        edge_base = [0, *itertools.accumulate(edges)]
        src = torch.tensor([i for c in columns for i in c.src], dtype=_I64)
        dst = torch.tensor([i for c in columns for i in c.dst], dtype=_I64)
        owner = torch.repeat_interleave(
            torch.arange(len(columns), dtype=_I64), torch.tensor(edges, dtype=_I64)
        )
        key = src + node_base[owner]
        moved: set[int] = set()
        if key.numel() > 1 and bool((key[1:] < key[:-1]).any()):
            perm = torch.sort(key, stable=True).indices
            moved = set(torch.unique(owner[perm != torch.arange(key.numel())]).tolist())
            src, dst, key = src[perm], dst[perm], key[perm]
            kind, intensity = kind[perm], intensity[perm]
            confidence, prob = confidence[perm], prob[perm]
        else:
            perm = None
        is_sem_edge, is_proc_edge = kind == LINK_SEM, kind == LINK_PROC
        confidence = torch.where(is_sem_edge, confidence, 0.0)
        prob = torch.where(is_proc_edge, prob, 0.0)
        rowptr = torch.zeros(int(node_base[-1]) + 1, dtype=_I64)
        torch.cumsum(torch.bincount(key, minlength=int(node_base[-1])), 0, out=rowptr[1:])
        out = []
        bases = node_base.tolist()
        for a, c in enumerate(columns):
            n0, n1, e0, e1 = bases[a], bases[a + 1], edge_base[a], edge_base[a + 1]
            link_ids = c.link_ids
            if a in moved:  # (perm's entries for this cluster, local)
                link_ids = [link_ids[i - e0] for i in perm[e0:e1].tolist()]  # type: ignore[index]
            graph = cls._assemble(
                edge_index=torch.stack([src[e0:e1], dst[e0:e1]]),
                rowptr=rowptr[n0 : n1 + 1] - rowptr[n0],
                edge_kind=kind[e0:e1].clone(),
                intensity=intensity[e0:e1].clone(),
                confidence=confidence[e0:e1].clone(),
                prob=prob[e0:e1].clone(),
                node_type=node_type[n0:n1].clone(),
                create_time_ns=create_ns[n0:n1].clone(),
                retrieval_count=counts[n0:n1].clone(),
                tag_emb=c.tag_emb,
                tag_mask=c.tag_mask,
                field_rows=c.field_rows,
                field_pos=c.field_pos,
                num_nodes=n1 - n0,
                ids=c.ids,
                link_ids=link_ids,
                version=c.version,
            )
            out.append(_finish_cluster_graph(graph, c))
        return out

    @classmethod
    def from_tensors(
        cls,
        edge_index: Tensor,
        *,
        num_nodes: int,
        edge_kind: Tensor,
        node_type: Tensor,
        intensity: Tensor | None = None,
        confidence: Tensor | None = None,
        prob: Tensor | None = None,
        tag_emb: Tensor | None = None,
        tag_mask: Tensor | None = None,
        field_emb: Tensor | None = None,
        field_mask: Tensor | None = None,
        field_rows: Tensor | None = None,
        field_pos: Tensor | None = None,
        create_time_ns: Tensor | None = None,
        retrieval_count: Tensor | None = None,
        ids: Sequence[MemoryId] | None = None,
        link_ids: Sequence[LinkId] | None = None,
        version: int | None = None,
        check_finite: bool = True,
    ) -> MemoryGraph:
        """A snapshot straight from tensors (no note objects), validated and put in CSR order.

        Every tensor is moved to the device of ``edge_index``. Edges may come in any order:
        they are stably sorted by source (skipped when already sorted), and every edge
        attribute (and ``link_ids``) follows that permutation.

        Args:
            edge_index: shape (2, E), integer. Source / target node indices in ``[0, N)``.
            num_nodes: >= 0. ``N``.
            edge_kind: shape (E,), integer. ``LINK_*`` codes.
            node_type: shape (N,), integer. ``NODE_*`` codes.
            intensity: shape (E,), float; finite, >= 0. ``None`` -> 1.0 (the original's default).
            confidence: shape (E,), float; in [0, 1]. Stored as float32, zeroed on non-Sem edges.
                ``None`` -> 1.0 on Sem edges.
            prob: shape (E,), float; in [0, 1]. Stored as float64, zeroed on non-Proc edges.
                ``None`` -> 1.0 on Proc edges.
            tag_emb: shape (N, D), float, finite. Stored as float32.
            tag_mask: shape (N,), bool. ``None`` -> all True when ``tag_emb`` is given.
            field_emb: shape (N, F, D), float, finite; ``F == len(FIELD_NAMES)``.
            field_mask: shape (N, F), bool. ``None`` -> all True when ``field_emb`` is given.
                The dense block is compacted (only the present cells are kept).
            field_rows: shape (P, D), float, finite. The compact layout instead of
                ``field_emb`` / ``field_mask``: field vectors grouped by field
                (:func:`~soulmem_torch.embedding.fields.stack_compact_field_embeddings`).
            field_pos: shape (N, F), integer. Row of ``field_rows`` per (note, field), -1
                where absent; given with ``field_rows``.
            create_time_ns: shape (N,), integer. ``None`` -> zeros.
            retrieval_count: shape (N,), integer, >= 0. ``None`` -> zeros.
            ids: ``N`` distinct ``MemoryId``; ``None`` -> random ids created on first access.
            link_ids: ``E`` ``LinkId`` in input edge order; ``None`` -> created on first access.
            version: the cluster version this is a snapshot of, if any.
            check_finite: ``False`` skips the NaN / inf pass over ``tag_emb`` and the field
                tables (the caller vouches for them, as :meth:`from_cluster` does for the
                tables :func:`~soulmem_torch.embedding.fields.stack_compact_field_embeddings`
                just stacked and checked); every other check still runs.

        Raises:
            ValidationError: naming the argument, on any wrong shape, dtype or value (an
                out-of-range node index, an unknown code, a negative / NaN intensity, a
                confidence or probability outside [0, 1], a NaN / inf embedding, ...).
        """
        try:
            n = operator.index(num_nodes)
        except TypeError:
            raise ValidationError(f"num_nodes: expected an int >= 0, found {num_nodes!r}") from None
        if n < 0:
            raise ValidationError(f"num_nodes: expected an int >= 0, found {n}")
        if not isinstance(edge_index, Tensor):
            raise ValidationError(
                f"edge_index: expected a tensor of shape (2, E), found {_shape(edge_index)}"
            )
        if edge_index.dim() != 2 or edge_index.shape[0] != 2:
            raise ValidationError(
                f"edge_index: expected shape (2, E), found {tuple(edge_index.shape)}"
            )
        e = int(edge_index.shape[1])
        _check_tensor("edge_index", edge_index, (2, e), "int")
        device = edge_index.device
        edge_index = edge_index.to(_I64)
        if e:
            lo, hi = (int(v) for v in torch.aminmax(edge_index))
            if lo < 0 or hi >= n:
                bad = (edge_index < 0) | (edge_index >= n)
                row, col = (int(i) for i in bad.nonzero()[0])
                raise ValidationError(
                    f"edge_index: expected node indices in [0, {n}), found "
                    f"{int(edge_index[row, col])} at edge_index[{row}, {col}]"
                )

        def on_dev(t: Tensor) -> Tensor:
            return t.to(device)

        edge_kind = on_dev(_check_tensor("edge_kind", edge_kind, (e,), "int")).to(_I64)
        _check_codes("edge_kind", edge_kind, _LINK_CODE_SET, "edge")
        node_type = on_dev(_check_tensor("node_type", node_type, (n,), "int")).to(_I64)
        _check_codes("node_type", node_type, _NODE_CODE_SET, "node")
        is_sem_edge = edge_kind == LINK_SEM
        is_proc_edge = edge_kind == LINK_PROC

        if intensity is None:
            intensity = torch.ones(e, dtype=_F64, device=device)
        else:
            intensity = on_dev(_check_tensor("intensity", intensity, (e,), "float")).to(_F64)
            _check_range("intensity", intensity, "edge")
        if confidence is None:
            confidence = is_sem_edge.to(_F32)
        else:
            confidence = on_dev(_check_tensor("confidence", confidence, (e,), "float"))
            _check_range("confidence", confidence, "edge", high=1.0)
            confidence = torch.where(is_sem_edge, confidence.to(_F32), 0.0)
        if prob is None:
            prob = is_proc_edge.to(_F64)
        else:
            prob = on_dev(_check_tensor("prob", prob, (e,), "float"))
            _check_range("prob", prob, "edge", high=1.0)
            prob = torch.where(is_proc_edge, prob.to(_F64), 0.0)

        if create_time_ns is None:
            create_time_ns = torch.zeros(n, dtype=_I64, device=device)
        else:
            create_time_ns = on_dev(_check_tensor("create_time_ns", create_time_ns, (n,), "int"))
            create_time_ns = create_time_ns.to(_I64)
        if retrieval_count is None:
            retrieval_count = torch.zeros(n, dtype=_I64, device=device)
        else:
            retrieval_count = on_dev(
                _check_tensor("retrieval_count", retrieval_count, (n,), "int")
            ).to(_I64)
            _first_bad(
                "retrieval_count", retrieval_count < 0, retrieval_count, "node", "values >= 0"
            )

        num_fields = len(FIELD_NAMES)
        dim: int | None = None
        if tag_emb is not None:
            if not isinstance(tag_emb, Tensor) or tag_emb.dim() != 2:
                raise ValidationError(f"tag_emb: expected shape (N, D), found {_shape(tag_emb)}")
            dim = int(tag_emb.shape[1])
            tag_emb = on_dev(_check_tensor("tag_emb", tag_emb, (n, dim), "float")).to(_F32)
            if check_finite:
                _check_finite("tag_emb", tag_emb)
            if tag_mask is None:
                tag_mask = torch.ones(n, dtype=torch.bool, device=device)
            else:
                tag_mask = on_dev(_check_tensor("tag_mask", tag_mask, (n,), "bool"))
        elif tag_mask is not None:
            raise ValidationError("tag_mask: given without tag_emb")
        if field_emb is not None:
            if field_rows is not None or field_pos is not None:
                raise ValidationError(
                    "field_emb: give either field_emb / field_mask or field_rows / field_pos"
                )
            if not isinstance(field_emb, Tensor) or field_emb.dim() != 3:
                raise ValidationError(
                    f"field_emb: expected shape (N, F, D), found {_shape(field_emb)}"
                )
            fdim = int(field_emb.shape[2])
            if dim is not None and fdim != dim:
                raise ValidationError(
                    f"field_emb: expected width D = {dim} (that of tag_emb), found {fdim}"
                )
            field_emb = on_dev(
                _check_tensor("field_emb", field_emb, (n, num_fields, fdim), "float")
            ).to(_F32)
            if check_finite:
                _check_finite("field_emb", field_emb)
            if field_mask is None:
                field_mask = torch.ones(n, num_fields, dtype=torch.bool, device=device)
            else:
                field_mask = on_dev(
                    _check_tensor("field_mask", field_mask, (n, num_fields), "bool")
                )
            field_rows, field_pos = dense_to_compact(field_emb, field_mask)
        elif field_mask is not None:
            raise ValidationError("field_mask: given without field_emb")
        elif field_rows is not None or field_pos is not None:
            if field_rows is None or field_pos is None:
                raise ValidationError("field_rows / field_pos: expected both or neither")
            if not isinstance(field_rows, Tensor) or field_rows.dim() != 2:
                raise ValidationError(
                    f"field_rows: expected shape (P, D), found {_shape(field_rows)}"
                )
            p, fdim = (int(x) for x in field_rows.shape)
            if dim is not None and fdim != dim:
                raise ValidationError(
                    f"field_rows: expected width D = {dim} (that of tag_emb), found {fdim}"
                )
            field_rows = on_dev(_check_tensor("field_rows", field_rows, (p, fdim), "float"))
            field_rows = field_rows.to(_F32)
            if check_finite:
                _check_finite("field_rows", field_rows)
            field_pos = on_dev(_check_tensor("field_pos", field_pos, (n, num_fields), "int")).to(
                torch.int32
            )
            if field_pos.numel():
                lo, hi = (int(v) for v in torch.aminmax(field_pos))
                if lo < -1 or hi >= p:
                    _first_bad(
                        "field_pos", ((field_pos < -1) | (field_pos >= p)).reshape(-1),
                        field_pos.reshape(-1), "cell", f"rows in [-1, {p})",
                    )  # fmt: skip

        if ids is not None:
            ids = list(ids)
            if len(ids) != n:
                raise ValidationError(f"ids: expected {n} MemoryId values, found {len(ids)}")
            if len(set(ids)) != n:
                raise ValidationError("ids: expected distinct MemoryId values, found duplicates")
        if link_ids is not None:
            link_ids = list(link_ids)
            if len(link_ids) != e:
                raise ValidationError(
                    f"link_ids: expected {e} LinkId values, found {len(link_ids)}"
                )

        # CSR order: a stable sort by source, skipped when already sorted.
        src = edge_index[0]
        if e > 1 and bool((src[1:] < src[:-1]).any()):
            perm = torch.sort(src, stable=True).indices
            edge_index = edge_index[:, perm]
            edge_kind, intensity = edge_kind[perm], intensity[perm]
            confidence, prob = confidence[perm], prob[perm]
            if link_ids is not None:
                link_ids = [link_ids[i] for i in perm.tolist()]
        counts = torch.bincount(edge_index[0], minlength=n)
        rowptr = torch.zeros(n + 1, dtype=_I64, device=device)
        torch.cumsum(counts, 0, out=rowptr[1:])
        return cls._assemble(
            edge_index=edge_index, rowptr=rowptr, edge_kind=edge_kind, intensity=intensity,
            confidence=confidence, prob=prob, node_type=node_type,
            create_time_ns=create_time_ns, retrieval_count=retrieval_count, tag_emb=tag_emb,
            tag_mask=tag_mask, field_rows=field_rows, field_pos=field_pos, num_nodes=n,
            ids=ids, link_ids=link_ids, version=version,
        )  # fmt: skip

    @classmethod
    def _assemble(
        cls,
        *,
        edge_index: Tensor,
        rowptr: Tensor,
        edge_kind: Tensor,
        intensity: Tensor,
        confidence: Tensor,
        prob: Tensor,
        node_type: Tensor,
        create_time_ns: Tensor,
        retrieval_count: Tensor,
        tag_emb: Tensor | None,
        tag_mask: Tensor | None,
        field_rows: Tensor | None,
        field_pos: Tensor | None,
        num_nodes: int,
        ids: list[MemoryId] | None,
        link_ids: list[LinkId] | None,
        version: int | None,
    ) -> MemoryGraph:
        """A graph of checked columns in CSR order (what :meth:`from_tensors` and
        :meth:`from_clusters` build), without another check."""
        graph = cls()
        graph.edge_index = edge_index.contiguous()
        graph.rowptr = rowptr
        graph.edge_kind = edge_kind
        graph.intensity = intensity
        graph.confidence = confidence
        graph.prob = prob
        graph.node_type = node_type
        graph.is_semantic = node_type == NODE_SEMANTIC
        graph.is_specific = node_type == NODE_SPECIFIC
        graph.is_abstract = node_type == NODE_ABSTRACT
        graph.is_procedure = node_type == NODE_PROCEDURE
        graph.create_time_ns = create_time_ns
        graph.retrieval_count = retrieval_count
        if tag_emb is not None:
            graph.tag_emb = tag_emb
            graph.tag_mask = tag_mask
        if field_rows is not None:
            graph.field_rows = field_rows
            graph.field_pos = field_pos
        graph.num_nodes = num_nodes
        graph.__dict__["_meta"] = _GraphMeta(ids=ids, link_ids=link_ids, version=version)
        return graph


def _same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    if a.type == "cuda":
        ai = a.index if a.index is not None else torch.cuda.current_device()
        bi = b.index if b.index is not None else torch.cuda.current_device()
        return ai == bi
    return True


@dataclass(slots=True)
class _ClusterColumns:
    """What a snapshot reads off one cluster (:func:`_cluster_columns`): its node and link
    columns as Python lists in cluster order, and its stacked embedding tables."""

    cluster: Any
    version: int
    ids: list[MemoryId]
    index_of: dict[MemoryId, int]
    node_type: list[int]
    create_ns: list[int]
    counts: list[int]
    src: list[int]
    dst: list[int]
    kind: list[int]
    intensity: list[float]
    confidence: list[float]
    prob: list[float]
    link_ids: list[LinkId]
    sparse: tuple[Any, ...] | None
    tag_emb: Tensor | None
    tag_mask: Tensor | None
    field_rows: Tensor | None
    field_pos: Tensor | None


def _cluster_columns(cluster: MemoryCluster) -> _ClusterColumns:
    """One cluster's columns (node ``i`` = ``cluster.ids()[i]``, links in ``cluster.links()``
    order), a link to a note outside the cluster or of an unknown type named by
    :func:`_bad_link`."""
    with cluster.locked():  # (one version's notes and links: no write in between)
        version = cluster.version
        items = list(cluster)
        links = cluster.links()
    ids = [item.note.id for item in items]
    index_of = {mid: i for i, mid in enumerate(ids)}
    # the links' columns by comprehensions (no per-link Python statements); a bad link is
    # found and named by the loop of _bad_link
    try:
        src = list(map(index_of.__getitem__, [link.from_ for link in links]))
        dst = list(map(index_of.__getitem__, [link.to for link in links]))
    except KeyError:
        _bad_link(links, index_of)
        raise  # pragma: no cover - _bad_link raises
    types = [link.link_type for link in links]
    kind = list(map(_LINK_CODES.get, map(type, types)))
    if None in kind:
        _bad_link(links, index_of)
    embeddings = [item.embedding for item in items]
    tag_emb = tag_mask = field_rows = field_pos = None
    sparse = None
    if any(e is not None for e in embeddings):
        dim = cluster.embedding_dim or next(e.dim for e in embeddings if e is not None)
        sparse = stack_sparse_tables(embeddings, dim)
        if sparse is None:
            tag_emb, tag_mask, field_rows, field_pos = stack_compact_field_embeddings(
                embeddings, dim
            )
            tag_emb, field_rows = tag_emb.to(_F32), field_rows.to(_F32)
            field_pos = field_pos.to(torch.int32)
    return _ClusterColumns(
        cluster=cluster,
        version=version,
        ids=ids,
        index_of=index_of,
        node_type=[_NODE_CODES[item.note.kind] for item in items],
        create_ns=[item.note.create_time.ns_since_epoch for item in items],
        counts=[item.note.retrieval_count for item in items],
        src=src,
        dst=dst,
        kind=kind,  # type: ignore[arg-type]
        intensity=[link.intensity for link in links],
        confidence=[lt.confidence if code == LINK_SEM else 0.0 for lt, code in zip(types, kind)],
        prob=[lt.prob if code == LINK_PROC else 0.0 for lt, code in zip(types, kind)],
        link_ids=[link.id for link in links],
        sparse=sparse,
        tag_emb=tag_emb,
        tag_mask=tag_mask,
        field_rows=field_rows,
        field_pos=field_pos,
    )


def _checked_graph(c: _ClusterColumns) -> MemoryGraph:
    """One cluster's snapshot through :meth:`MemoryGraph.from_tensors` (every check, each
    naming its argument)."""
    graph = MemoryGraph.from_tensors(
        torch.tensor([c.src, c.dst], dtype=_I64).reshape(2, len(c.src)),
        num_nodes=len(c.ids),
        edge_kind=torch.tensor(c.kind, dtype=_I64),
        node_type=torch.tensor(c.node_type, dtype=_I64),
        intensity=torch.tensor(c.intensity, dtype=_F64),
        confidence=torch.tensor(c.confidence, dtype=_F32),
        prob=torch.tensor(c.prob, dtype=_F64),
        tag_emb=c.tag_emb,
        tag_mask=c.tag_mask,
        field_rows=c.field_rows,
        field_pos=c.field_pos,
        create_time_ns=torch.tensor(c.create_ns, dtype=_I64),
        retrieval_count=torch.tensor(c.counts, dtype=_I64),
        ids=c.ids,
        link_ids=c.link_ids,
        version=c.version,
        check_finite=c.tag_emb is None,  # the stacking checked the tables
    )
    return _finish_cluster_graph(graph, c)


def _finish_cluster_graph(graph: MemoryGraph, c: _ClusterColumns) -> MemoryGraph:
    """The snapshot's id lookup and tables: the sparse ones held as they are, and the
    cluster's notes reading their vectors from the snapshot's tables."""
    graph._m.shared.index_of = c.index_of
    if c.sparse is not None:  # held sparse; the notes read their vectors from these tables
        graph._set_compact(*c.sparse)
        c.cluster.share_vectors(c.version, c.ids, c.sparse[0], c.sparse[2], c.sparse[3])
    elif c.tag_emb is not None:  # the notes' vectors become views of the snapshot's tables
        c.cluster.share_vectors(c.version, c.ids, graph.tag_emb, graph.field_rows, graph.field_pos)
    return graph


def _bad_link(links: Sequence[Any], index_of: dict[Any, int]) -> None:
    """Raises for the first link of ``links`` that names a note outside ``index_of`` or has
    an unknown link type (what :meth:`MemoryGraph.from_cluster` reports)."""
    for link in links:
        for end in (link.from_, link.to):
            if end not in index_of:
                raise ValidationError(
                    f"links: edge {link.id} names note {end}, which is not in the cluster"
                )
        lt = link.link_type
        if _LINK_CODES.get(type(lt)) is None:
            raise ValidationError(
                f"links: edge {link.id} has link_type {type(lt).__name__}; expected "
                "TrigToAction, SemMemLink, AbstractToSpecific or SpecificToAbstract"
            )
