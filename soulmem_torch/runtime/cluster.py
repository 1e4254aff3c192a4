"""``MemoryCluster``: the in-memory directed multigraph of embedded notes (docs/spec.md §2).

Notes are nodes; each note's own ``mem_links`` are its out-edges. The note is the source of
truth for its links; the cluster keeps the materialized edges, the *pending* (parked) links
whose target is not present yet, and the id → index maps.

Semantics (the original's ``MemoryCluster``, read from ``soul-mem-runtime``):

* **Adding** a note whose id is present does not replace it. Its out-links whose link id is new
  are merged into the existing note (appended to its ``mem_links``) and into the graph, as the
  original's ``merge_edges`` does for a duplicate; nothing else changes.
* A new note first **materializes** the links parked for it (in the order they were parked),
  then adds its own out-links in ``mem_links`` order: a link whose target is present and whose
  link id is new becomes an edge; a link whose target is absent is **parked** under the target
  id (a link to a missing note is never an error). A link id already in the graph is skipped
  (the first link with an id wins).
* **Removing** a note drops the links it owned (edges and parked links) and re-parks the edges
  that pointed at it, keeping their id, source, intensity and type, newest first (the order in
  which the original's graph library yields them), so re-adding the note restores them.
  (**DECISION**, with docs/spec.md §2: the original re-parks them with a fresh id and intensity 1.0.)
* The link's source is always the note that holds it (as in the original, ``from`` is not
  consulted); ``GraphMemoryLink.from_`` is that note's id.

Node index = the order notes were added; after a removal indices are compacted, keeping order.
Within one source, edges keep their materialization order (the sequential PPR oracle visits them
newest first by reversing it). ``version`` increases on every change; :meth:`MemoryCluster.derived`
caches data computed from one version (the tensor snapshot,
:meth:`soulmem_torch.graph.MemoryGraph.of`, per device). This module never imports the snapshot.

Example:
    >>> from soulmem_torch.model import MemoryLink, MemoryNote, SemMemLink, SemMemory
    >>> def sem(text):
    ...     return MemoryNote.build(SemMemory(content=text, aliases=[], concept_type="Entity",
    ...                                       description=""))
    >>> a, b = sem("a"), sem("b")
    >>> a.mem_links.append(MemoryLink.new(a.id, b.id, SemMemLink(verb="knows", confidence=0.9)))
    >>> cluster = MemoryCluster()
    >>> cluster.add_note(a)          # target b is absent: the link is parked
    True
    >>> len(cluster.links()), len(cluster.pending_links())
    (0, 1)
    >>> cluster.add_note(b)          # ... and materialized when b arrives
    True
    >>> len(cluster.links()), len(cluster.pending_links())
    (1, 0)
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np
import torch

from soulmem_torch.embedding.compact import (
    CompactVectors,
    compact_ref,
    pack_embeddings,
    share_tables,
)
from soulmem_torch.embedding.fields import FIELD_INDEX, EmbeddedMemoryNote, MemoryEmbedding
from soulmem_torch.errors import NotFoundError, ValidationError
from soulmem_torch.functional.sparse_rows import SparseRows
from soulmem_torch.model.ids import LinkId, MemoryId
from soulmem_torch.model.links import MemoryLink
from soulmem_torch.model.notes import MemoryNote
from soulmem_torch.runtime.deferred import untouched_width

_T = TypeVar("_T")

__all__ = ["GraphMemoryLink", "MemoryCluster"]


@dataclass(frozen=True)
class GraphMemoryLink:
    """A materialized edge ``from_ -> to`` of a cluster.

    ``link_type`` is the note's link-type object (``TrigToAction`` / ``SemMemLink`` /
    ``AbstractToSpecific`` / ``SpecificToAbstract``), shared, not copied.
    """

    id: LinkId
    from_: MemoryId
    to: MemoryId
    link_type: Any
    intensity: float

    def to_memory_link(self) -> MemoryLink:
        """The equivalent ``MemoryLink`` (same id, ends, intensity and type)."""
        return MemoryLink(
            id=self.id, from_=self.from_, to=self.to, intensity=self.intensity,
            link_type=self.link_type,
        )  # fmt: skip


def _check_shape(where: Any, name: str | None, value: Any, dim: int | None) -> int:
    """A 1-D float tensor of width ``dim`` (finiteness is checked in bulk by the caller);
    errors name ``<where>.tag`` (``name`` ``None``) or ``<where>.fields[<name>]``."""
    if (
        isinstance(value, torch.Tensor)
        and value.ndim == 1
        and value.dtype.is_floating_point
        and (dim is None or value.shape[0] == dim)
    ):
        return value.shape[0]
    what = f"{where}.tag" if name is None else f"{where}.fields[{name!r}]"
    if not isinstance(value, torch.Tensor):
        raise ValidationError(f"{what}: expected a 1-D float tensor, found {type(value).__name__}")
    if value.ndim != 1 or not value.dtype.is_floating_point:
        raise ValidationError(
            f"{what}: expected a 1-D float tensor, found shape {tuple(value.shape)} "
            f"of {value.dtype}"
        )
    raise ValidationError(f"{what}: expected width {dim}, found {value.shape[0]}")


def _shapes(
    embedding: Any, dim: int | None, where: Any, out: list[tuple[Any, str | None, torch.Tensor]]
) -> int | None:
    """The structural checks of :func:`check_embedding`; the vectors go to ``out`` as
    ``(where, field name or None for the tag, vector)`` for one bulk finiteness check."""
    if embedding is None:
        return None
    if not isinstance(embedding, MemoryEmbedding):
        raise ValidationError(
            f"{where}: expected a MemoryEmbedding or None, found {type(embedding).__name__}"
        )
    tag = embedding.tag
    if dim is not None and type(tag) is _Tensor and tag.shape == (dim,) and tag.dtype in _FLOATS:
        width = dim  # the common case in one comparison (the full check below says why not)
    else:
        width = _check_shape(where, None, tag, dim)
    out.append((where, None, tag))
    fields = embedding.fields
    if type(fields) is not dict and not isinstance(fields, dict):
        raise ValidationError(
            f"{where}.fields: expected a dict of name -> tensor, found {type(fields).__name__}"
        )
    want = (width,)
    for name, vector in fields.items():
        if name not in FIELD_INDEX:
            raise ValidationError(
                f"{where}.fields[{name!r}]: expected a name in FIELD_NAMES, found an unknown field"
            )
        if not (type(vector) is _Tensor and vector.shape == want and vector.dtype in _FLOATS):
            _check_shape(where, name, vector, width)
        out.append((where, name, vector))
    return int(width)


_Tensor = torch.Tensor
_FLOATS = frozenset(
    d for d in (torch.float16, torch.bfloat16, torch.float32, torch.float64) if d.is_floating_point
)


_CHUNK = 1 << 20  # elements per finiteness pass (its bool temporary stays in cache)
_NUMPY_DTYPES = (torch.float16, torch.float32, torch.float64)


def _finite(flat: torch.Tensor) -> bool:
    """Whether every element of a 1-D tensor is finite (numpy on the CPU: one pass, several
    times faster than ``torch.isfinite`` there; chunked so no big temporary is made)."""
    if flat.device.type == "cpu" and flat.dtype in _NUMPY_DTYPES:
        array = flat.numpy()
        return all(
            bool(np.isfinite(array[i : i + _CHUNK]).all()) for i in range(0, array.size, _CHUNK)
        )
    return all(
        bool(torch.isfinite(flat[i : i + _CHUNK]).all()) for i in range(0, flat.numel(), _CHUNK)
    )


_VERIFIED: dict[tuple[int, torch.dtype], tuple[weakref.ref[torch.Tensor], int]] = {}


def mark_finite(base: torch.Tensor, dtype: torch.dtype | None = None) -> None:
    """Records that the whole storage of ``base``, read as ``dtype`` (default: its own), holds
    only finite values, so views of it skip the finiteness check of :meth:`MemoryCluster.add_notes`
    until the tensor is changed in place (its version counter moves on; writes that bypass
    torch, e.g. through a numpy view, are not seen). A store's decoder calls it for the buffer
    it just checked; the check itself records every storage it verified."""
    dtype = base.dtype if dtype is None else dtype
    key = (id(base), dtype)
    _VERIFIED[key] = (weakref.ref(base, lambda _ref, key=key: _VERIFIED.pop(key, None)),
                      base._version)  # fmt: skip


def _is_verified(base: torch.Tensor, dtype: torch.dtype) -> bool:
    entry = _VERIFIED.get((id(base), dtype))
    return entry is not None and entry[0]() is base and entry[1] == base._version


def first_non_finite(vectors: Sequence[torch.Tensor]) -> int | None:
    """The index of the first vector holding a NaN or inf (``None``: all finite), checked in
    bulk: views of one tensor (what a store's decoder and the embedders hand out) by one pass
    over their storage (remembered, see :func:`mark_finite`), the others stacked in chunks; the
    vectors of a failing group are then checked one by one to name the first offender."""
    groups: dict[tuple[int, torch.dtype], list[int]] = {}
    bases: dict[tuple[int, torch.dtype], torch.Tensor] = {}
    loose: list[int] = []
    last_base: Any = None
    last_dtype: Any = None
    members: list[int] = []
    for k, v in enumerate(vectors):
        base = v._base
        if base is last_base and base is not None and v.dtype is last_dtype:
            members.append(k)  # the common case: the next view of the same buffer
            continue
        if base is None:
            loose.append(k)
            continue
        last_base, last_dtype = base, v.dtype
        key = (id(base), last_dtype)
        members = groups.get(key)  # type: ignore[assignment]
        if members is None:
            groups[key] = members = []
            bases[key] = base
        members.append(k)
    suspects: list[int] = []
    for key, members in groups.items():
        dtype = key[1]
        base = bases[key]
        if _is_verified(base, dtype):
            continue
        storage = base.untyped_storage()
        size = torch.empty((), dtype=dtype).element_size()
        width = int(vectors[members[0]].shape[0])
        count = storage.nbytes() // size
        if count > 4 * width * len(members) + _CHUNK:  # a few views of a big tensor
            loose.extend(members)
            continue
        flat = torch.empty(0, dtype=dtype, device=base.device)
        flat.set_(storage, 0, (count,), (1,))
        if _finite(flat.detach()):
            mark_finite(base, dtype)
        else:
            suspects.extend(members)
    if loose:
        by_kind: dict[tuple[torch.dtype, torch.device, int], list[int]] = {}
        for k in loose:
            v = vectors[k]
            by_kind.setdefault((v.dtype, v.device, int(v.shape[0])), []).append(k)
        with torch.no_grad():
            for members in by_kind.values():
                for i in range(0, len(members), 4096):
                    part = members[i : i + 4096]
                    stacked = torch.stack([vectors[k].detach() for k in part]).reshape(-1)
                    if not _finite(stacked):
                        suspects.extend(part)
    for k in sorted(suspects):
        if not bool(torch.isfinite(vectors[k].detach()).all()):
            return k
    return None


def _raise_non_finite(checked: Sequence[tuple[Any, str | None, torch.Tensor]]) -> None:
    bad = first_non_finite([v for _, _, v in checked])
    if bad is not None:
        where, name, _ = checked[bad]
        what = f"{where}.tag" if name is None else f"{where}.fields[{name!r}]"
        raise ValidationError(f"{what}: expected finite values, found NaN or inf")


def check_embedding(embedding: Any, *, dim: int | None, where: str = "embedding") -> int | None:
    """Validates a note's embedding; returns its width (``None`` for no embedding).

    Args:
        embedding: a ``MemoryEmbedding`` or ``None``.
        dim: the width every vector must have, or ``None`` to take the tag's width.
        where: prefix for error messages (e.g. ``"embedding of note <id>"``).

    Raises:
        ValidationError: naming the field, on a wrong type, shape, width, an unknown field name,
            or a NaN / inf value.
    """
    checked: list[tuple[Any, str | None, torch.Tensor]] = []
    try:
        width = _shapes(embedding, dim, where, checked)
    except ValidationError:
        _raise_non_finite(checked)  # an earlier vector's NaN is reported first, as before
        raise
    _raise_non_finite(checked)
    return width


class _Where:
    """``"embedding of note <id>"``, formatted only when an error names it."""

    __slots__ = ("id",)

    def __init__(self, id: MemoryId) -> None:
        self.id = id

    def __str__(self) -> str:
        return f"embedding of note {self.id}"


class MemoryCluster:
    """A directed multigraph of embedded notes with pending-link bookkeeping (docs/spec.md §2).

    Args:
        embedding_dim: > 0 or ``None``. Width every embedding must have; ``None`` = taken from
            the first embedded note (and forgotten again when no embedded note is left).

    All methods are guarded by one re-entrant lock, so a cluster can be shared with worker
    threads; snapshots (``MemoryGraph.of(cluster)``) are immutable views.
    """

    def __init__(self, *, embedding_dim: int | None = None) -> None:
        if embedding_dim is not None and (
            not isinstance(embedding_dim, int) or isinstance(embedding_dim, bool)
            or embedding_dim <= 0
        ):  # fmt: skip
            raise ValidationError(f"embedding_dim: expected an int > 0, found {embedding_dim!r}")
        self._fixed_dim = embedding_dim
        self._dim: int | None = embedding_dim
        self._num_embedded = 0
        self._nodes: dict[MemoryId, EmbeddedMemoryNote] = {}
        self._index: dict[MemoryId, int] | None = {}
        self._links: dict[LinkId, GraphMemoryLink] = {}
        self._out: dict[MemoryId, dict[LinkId, None]] = {}
        self._in: dict[MemoryId, dict[LinkId, None]] = {}
        # target id -> [(source id, link)], in parking order
        self._pending: dict[MemoryId, list[tuple[MemoryId, MemoryLink]]] = {}
        self._version = 0
        self._changed: set[MemoryId] = set()  # notes changed since the last take_changes()
        self._derived: dict[Hashable, Any] = {}
        self._derived_version = -1
        self._kept: dict[Hashable, Any] = {}
        self._lock = threading.RLock()

    # -- read access ----------------------------------------------------------------------
    @property
    def version(self) -> int:
        """Increases on every change (notes, links, pending links, embeddings, mark_changed)."""
        return self._version

    @property
    def embedding_dim(self) -> int | None:
        """Width of the stored embeddings (``None`` while no note has one and none was fixed)."""
        return self._dim

    @property
    def num_links(self) -> int:
        """Number of materialized edges."""
        return len(self._links)

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, id: object) -> bool:
        return id in self._nodes

    def __iter__(self) -> Iterator[EmbeddedMemoryNote]:
        """The embedded notes in node-index order (a snapshot of the current list)."""
        with self._lock:
            return iter(list(self._nodes.values()))

    def __getitem__(self, id: MemoryId) -> EmbeddedMemoryNote:
        try:
            return self._nodes[id]
        except KeyError:
            raise NotFoundError(f"id: note {id} is not in the cluster") from None

    def __repr__(self) -> str:
        return (
            f"MemoryCluster(notes={len(self._nodes)}, links={len(self._links)}, "
            f"pending={sum(len(v) for v in self._pending.values())}, version={self._version})"
        )

    def get(self, id: MemoryId) -> EmbeddedMemoryNote | None:
        """The embedded note with this id, or ``None``."""
        return self._nodes.get(id)

    def ids(self) -> list[MemoryId]:
        """Note ids in node-index order."""
        with self._lock:
            return list(self._nodes)

    def notes(self) -> list[MemoryNote]:
        """Notes in node-index order."""
        with self._lock:
            return [item.note for item in self._nodes.values()]

    def index_of(self, id: MemoryId) -> int:
        """Node index of ``id`` (position in adding order, compacted after removals).

        Raises:
            NotFoundError: if the note is not in the cluster.
        """
        with self._lock:
            if self._index is None:
                self._index = {nid: i for i, nid in enumerate(self._nodes)}
            try:
                return self._index[id]
            except KeyError:
                raise NotFoundError(f"id: note {id} is not in the cluster") from None

    def links(self) -> list[GraphMemoryLink]:
        """Every materialized edge, in materialization order."""
        with self._lock:
            return list(self._links.values())

    def has_link(self, link_id: LinkId) -> bool:
        """Whether an edge with this id is materialized."""
        return link_id in self._links

    def get_link(self, link_id: LinkId) -> GraphMemoryLink | None:
        """The materialized edge with this id, or ``None``."""
        return self._links.get(link_id)

    def out_links(self, id: MemoryId) -> list[GraphMemoryLink]:
        """Materialized out-edges of ``id`` in materialization order (empty for an absent id)."""
        with self._lock:
            return [self._links[lid] for lid in self._out.get(id, ())]

    def in_links(self, id: MemoryId) -> list[GraphMemoryLink]:
        """Materialized in-edges of ``id`` in materialization order (empty for an absent id)."""
        with self._lock:
            return [self._links[lid] for lid in self._in.get(id, ())]

    def pending_links(self) -> list[MemoryLink]:
        """Parked links (target absent), grouped by target in parking order.

        ``from_`` of each returned link is the note that holds it.
        """
        with self._lock:
            out = []
            for entries in self._pending.values():
                for source, link in entries:
                    out.append(
                        link if link.from_ == source else link.model_copy(update={"from_": source})
                    )
            return out

    # -- mutation -------------------------------------------------------------------------
    def add_note(
        self, note: MemoryNote | EmbeddedMemoryNote, embedding: MemoryEmbedding | None = None
    ) -> bool:
        """Adds a note (with an optional embedding); ``False`` if its id is already present.

        A present id is not replaced: only the new note's out-links with new link ids are merged
        into the existing note and the graph (see the module docstring).

        Args:
            note: a ``MemoryNote``, or an ``EmbeddedMemoryNote`` (its embedding is used when
                ``embedding`` is ``None``).
            embedding: a ``MemoryEmbedding`` of width :attr:`embedding_dim`, or ``None``.

        Raises:
            ValidationError: on a wrong note type or a bad embedding (wrong width, NaN / inf,
                unknown field); the cluster is unchanged.
        """
        return self.add_notes([note], None if embedding is None else [embedding])[0]

    def add_single_node(self, node: EmbeddedMemoryNote | MemoryNote) -> bool:
        """The original's name for :meth:`add_note` (takes an ``EmbeddedMemoryNote``)."""
        return self.add_note(node)

    def add_notes(
        self,
        notes: Iterable[MemoryNote | EmbeddedMemoryNote],
        embeddings: Sequence[MemoryEmbedding | None] | None = None,
        *,
        links_after_nodes: bool = False,
    ) -> list[bool]:
        """Adds several notes; everything is validated before anything changes.

        By default the notes are added one after the other, exactly as repeated
        :meth:`add_note` calls (the original's ``add_single_node`` loop, which its evaluation
        loader uses; the resulting edge order is what the PPR parity oracle expects).

        Args:
            notes: ``MemoryNote`` or ``EmbeddedMemoryNote`` items.
            embeddings: one entry per note (``None`` entries allowed), or ``None``.
            links_after_nodes: the original's ``merge``: insert every note first (each
                materializing the links parked for it), then merge the notes' own out-links
                note by note, so links within the batch become edges directly, in batch order.

        Returns:
            One bool per input note: ``True`` if it was added, ``False`` if its id was present
            (or appeared earlier in ``notes``).

        Raises:
            ValidationError: on a wrong type, a length mismatch or a bad embedding.
        """
        items = list(notes)
        if embeddings is not None:
            embeddings = list(embeddings)
            if len(embeddings) != len(items):
                raise ValidationError(
                    f"embeddings: expected one entry per note ({len(items)}), "
                    f"found {len(embeddings)}"
                )
        with self._lock:
            prepared: list[tuple[MemoryNote, MemoryEmbedding | None]] = []
            dim = self._dim
            seen: set[MemoryId] = set()
            nodes = self._nodes
            untouched = untouched_width
            checked: list[tuple[Any, str | None, torch.Tensor]] = []  # finite-checked in bulk
            try:
                for i, item in enumerate(items):
                    emb = embeddings[i] if embeddings is not None else None
                    if isinstance(item, EmbeddedMemoryNote):
                        if emb is None:
                            emb = item.embedding
                        item = item.note
                    if not isinstance(item, MemoryNote):
                        raise ValidationError(
                            f"notes[{i}]: expected a MemoryNote or EmbeddedMemoryNote, "
                            f"found {type(item).__name__}"
                        )
                    nid = item.id
                    if not nodes or nid not in nodes:  # (one hash of the id, not two)
                        before = len(seen)
                        seen.add(nid)
                        if emb is not None and len(seen) != before:
                            width = untouched(emb)  # a load's, as its decoder checked it
                            if width is None:  # a compact one's: its table was checked
                                ref = compact_ref(emb)
                                width = None if ref is None else ref.table.dim
                            if width is not None and (dim is None or width == dim):
                                dim = width
                            else:
                                dim = _shapes(emb, dim, _Where(nid), checked)
                    prepared.append((item, emb))
            except ValidationError:
                _raise_non_finite(checked)  # an earlier note's NaN is reported first
                raise
            _raise_non_finite(checked)
            if dim is not None and len(prepared) > 1:
                prepared = self._packed(prepared, dim)

            self._changed.update(note.id for note, _ in prepared)
            added, changed = self._insert_all(prepared, links_after_nodes, dim)
            if links_after_nodes:
                for (note, _), is_new in zip(prepared, added):
                    if is_new:
                        for link in note.mem_links:
                            self._merge_link(note.id, link)
                    else:
                        changed |= self._merge_duplicate(note)
            if changed:
                self._touch()
            return added

    @staticmethod
    def _packed(
        prepared: list[tuple[MemoryNote, MemoryEmbedding | None]], dim: int
    ) -> list[tuple[MemoryNote, MemoryEmbedding | None]]:
        """The batch's sparse float32 CPU vectors packed into one compact table
        (embedding/compact.py, docs/spec.md §3 DECISION "compact raw vectors"): the notes
        hold compact embeddings, not the caller's dense buffers. Unchanged when the vectors
        do not qualify (dense, narrow, another dtype or device, a store's deferred ones)."""
        packed = pack_embeddings([e for _, e in prepared], dim)
        if packed is None:
            return prepared
        return [(note, emb) for (note, _), emb in zip(prepared, packed)]

    def _insert_all(
        self,
        prepared: Sequence[tuple[MemoryNote, MemoryEmbedding | None]],
        links_after_nodes: bool,
        width: int | None,
    ) -> tuple[list[bool], bool]:
        """Inserts validated notes one after the other: :meth:`_insert_node` then (unless
        ``links_after_nodes``) :meth:`_merge_link` of each out-link, or :meth:`_merge_duplicate`
        for a present id — the same steps in the same order, inlined (a store's load inserts
        every note here: ~2× faster than the method calls). ``width``: the width every
        embedding was checked to have (no vector is read here). Returns ``(added, changed)``."""
        nodes, index, links = self._nodes, self._index, self._links
        out, into, pending = self._out, self._in, self._pending
        node_type, new_edge, edge_type = EmbeddedMemoryNote, _new_object, GraphMemoryLink
        merge_links = not links_after_nodes
        added: list[bool] = []
        changed = False
        num_embedded, dim = self._num_embedded, self._dim
        for note, emb in prepared:
            nid = note.id
            if nid in nodes:
                added.append(False)
                if merge_links:
                    changed |= self._merge_duplicate(note)
                continue
            changed = True
            nodes[nid] = node_type(note, emb)
            if index is not None:
                index[nid] = len(index)
            if emb is not None:  # checked to be ``width`` wide (read without a vector)
                num_embedded += 1
                dim = width
            parked = pending.pop(nid, None) if pending else None
            if parked:  # the links parked for it, in parking order (_materialize_pending)
                for source, link in parked:
                    lid = link.id
                    if source in nodes and lid not in links:
                        self._materialize(source, link)
            added.append(True)
            if not merge_links:
                continue
            for link in note.mem_links:  # _merge_link, inlined
                lid = link.id
                if lid in links:
                    continue
                to = link.to
                if to in nodes:  # _materialize, inlined
                    edge = new_edge(edge_type)  # GraphMemoryLink(...) without its __init__
                    edge.__dict__.update(id=lid, from_=nid, to=to, link_type=link.link_type,
                                         intensity=float(link.intensity))  # fmt: skip
                    links[lid] = edge
                    out.setdefault(nid, {})[lid] = None
                    into.setdefault(to, {})[lid] = None
                    continue
                entries = pending.setdefault(to, [])
                if any(s == nid and lk.id == lid for s, lk in entries):
                    continue
                entries.append((nid, link))
        self._num_embedded, self._dim = num_embedded, dim
        return added, changed

    def remove_note(self, id: MemoryId) -> EmbeddedMemoryNote | None:
        """Removes a note; returns it (``None`` if absent).

        The links it owned are dropped (edges and parked links); the edges that pointed at it
        are re-parked under its id (same id, source, intensity and type; newest first), so
        adding a note with this id again restores them.
        """
        with self._lock:
            item = self._nodes.get(id)
            if item is None:
                return None
            self._drop_pending_from(id, lambda _lid: True)
            for lid in list(self._out.get(id, ())):
                self._unlink(lid)
            parked: list[tuple[MemoryId, MemoryLink]] = []
            for lid in reversed(list(self._in.get(id, ()))):
                edge = self._unlink(lid)
                parked.append((edge.from_, edge.to_memory_link()))
            if parked:
                self._pending.setdefault(id, []).extend(parked)
            self._out.pop(id, None)
            self._in.pop(id, None)
            del self._nodes[id]
            self._changed.add(id)
            self._tell_kept((item.note,))
            self._index = None
            if item.embedding is not None:
                self._num_embedded -= 1
                if self._num_embedded == 0:
                    self._dim = self._fixed_dim
            self._touch()
            return item

    def remove_link(self, link_id: LinkId) -> GraphMemoryLink | None:
        """Removes a link everywhere: the edge, any parked copy, and the source note's entry.

        Returns:
            The removed edge, or ``None`` if no edge had this id (parked copies are still
            discarded and the owning notes' ``mem_links`` cleaned).
        """
        with self._lock:
            edge = self._links.get(link_id)
            owners: set[MemoryId] = set()
            if edge is not None:
                self._unlink(link_id)
                owners.add(edge.from_)
            for target, entries in list(self._pending.items()):
                kept = [(s, lk) for s, lk in entries if lk.id != link_id]
                if len(kept) != len(entries):
                    owners.update(s for s, lk in entries if lk.id == link_id)
                    self._set_pending(target, kept)
            for owner in owners:
                note = self._nodes[owner].note
                note.mem_links = [lk for lk in note.mem_links if lk.id != link_id]
            self._changed.update(owners)
            if owners:
                self._touch()
            return edge

    def share_vectors(
        self,
        version: int,
        ids: Sequence[MemoryId],
        tag_emb: torch.Tensor,
        field_rows: torch.Tensor | None,
        field_pos: torch.Tensor | None,
    ) -> bool:
        """Lets the notes' embeddings view a snapshot's tables (``MemoryGraph.from_cluster``
        calls it): each note's tag becomes row ``i`` of ``tag_emb`` and each field its row of
        ``field_rows`` (``field_pos``), so every vector is held once, by the snapshot's
        compact layout, instead of once by the cluster and again by the snapshot.

        The values are the same (the tables were stacked from these vectors), so nothing
        changes for a reader and the version is not touched. Only float32 CPU vectors are
        swapped; nothing is done when the cluster changed since ``version``.

        Returns:
            whether the vectors were swapped.
        """
        with self._lock:
            if version != self.version:
                return False
            if isinstance(tag_emb, SparseRows):  # sparse tables: compact embeddings of them
                assert isinstance(field_rows, SparseRows) and field_pos is not None
                nodes = self._nodes
                items = [nodes.get(mid) for mid in ids]
                table = _table_of(items, tag_emb, field_rows, field_pos)
                for item, emb in zip(items, share_tables(table, [
                    None if item is None else item.embedding for item in items
                ])):  # fmt: skip
                    if item is not None and emb is not None:
                        item.embedding = emb
                return True
            pos = field_pos.tolist() if field_pos is not None else None
            # every row view made in one call each (not one indexing per vector)
            tag_views = tag_emb.unbind(0)
            row_views = field_rows.unbind(0) if field_rows is not None else ()
            nodes, index_of = self._nodes, FIELD_INDEX.get
            for i, mid in enumerate(ids):
                item = nodes.get(mid)
                emb = None if item is None else item.embedding
                if emb is None or not _plain_f32(emb.tag):
                    continue
                fields = dict(emb.fields)
                if pos is not None:
                    row = pos[i]
                    for name, vec in emb.fields.items():
                        j = index_of(name)
                        if j is not None and row[j] >= 0 and _plain_f32(vec):
                            fields[name] = row_views[row[j]]
                item.embedding = MemoryEmbedding(tag=tag_views[i], fields=fields)
            return True

    def set_embedding(self, id: MemoryId, embedding: MemoryEmbedding | None) -> None:
        """Replaces (or clears, with ``None``) the embedding of a note.

        Raises:
            NotFoundError: if the note is absent.
            ValidationError: on a bad embedding (wrong width, NaN / inf, unknown field).
        """
        with self._lock:
            item = self[id]
            self._changed.add(id)
            others = self._num_embedded - (item.embedding is not None)
            dim = self._dim if (others > 0 or self._fixed_dim is not None) else None
            width = check_embedding(embedding, dim=dim, where=f"embedding of note {id}")
            item.embedding = embedding
            self._num_embedded = others + (embedding is not None)
            if width is not None:
                self._dim = width
            elif self._num_embedded == 0:
                self._dim = self._fixed_dim
            self._touch()

    def mark_changed(self, id: MemoryId) -> None:
        """Declares that a note was mutated in place (text, counts, times or ``mem_links``).

        Re-syncs the graph with the note's ``mem_links`` (new link ids are merged; changed
        intensity or type is taken over in place; a changed target re-routes the link; links no
        longer listed are removed) and bumps :attr:`version` so the next snapshot rebuilds.
        This is the original's ``refresh_node``, which also picks up changed intensities.

        Raises:
            NotFoundError: if the note is absent.
            ValidationError: if the note's id was changed in place.
        """
        with self._lock:
            note = self[id].note
            if note.id != id:
                raise ValidationError(
                    f"id: note {id} now reports id {note.id}; remove it and add it again instead"
                )
            self._changed.add(id)
            self._tell_kept((note,))
            wanted: dict[LinkId, MemoryLink] = {}
            for link in note.mem_links:
                wanted.setdefault(link.id, link)
            for lid in list(self._out.get(id, ())):
                if lid not in wanted:
                    self._unlink(lid)
            self._drop_pending_from(id, lambda lid: lid not in wanted)
            for lid, link in wanted.items():
                edge = self._links.get(lid)
                if edge is not None:
                    if edge.from_ != id:
                        continue  # this id belongs to another note's link
                    if edge.to != link.to:
                        self._unlink(lid)
                        self._merge_link(id, link)
                    else:
                        self._links[lid] = replace(
                            edge, link_type=link.link_type, intensity=float(link.intensity)
                        )
                    continue
                if not self._replace_parked(id, link):
                    self._merge_link(id, link)
            self._touch()

    def note_changed(self, ids: Iterable[MemoryId]) -> None:
        """Declares notes changed in place without a change the snapshot reads (a retrieval
        count, an access time): the version stays, but the next save writes them."""
        with self._lock:
            self._changed.update(ids)

    def take_changes(self) -> set[MemoryId]:
        """The ids of the notes added, replaced, removed or declared changed since the last
        call (what an incremental save writes), and a fresh start."""
        with self._lock:
            out, self._changed = self._changed, set()
            return out

    # -- derived data -------------------------------------------------------------------
    def derived(self, key: Hashable, build: Callable[[], _T]) -> _T:
        """A value computed from this version of the cluster, cached until the cluster changes.

        ``build()`` runs (under the cluster's lock) the first time ``key`` is asked for at the
        current :attr:`version`; later calls return the same object. Every change drops the
        whole cache. This is how the tensor snapshot is cached
        (:meth:`soulmem_torch.graph.MemoryGraph.of`, keyed by device) without the cluster
        knowing about graphs: the snapshot depends on the cluster, not the other way round.

        Args:
            key: any hashable key, e.g. ``("graph", torch.device("cpu"))``.
            build: a function of no arguments that computes the value.
        """
        with self._lock:
            if self._derived_version != self._version:
                self._derived = {}
                self._derived_version = self._version
            if key not in self._derived:
                self._derived[key] = build()
            return self._derived[key]

    def kept(self, key: Hashable, make: Callable[[], _T]) -> _T:
        """A value kept across versions of the cluster: ``make()`` on the first call for
        ``key``, the same object after it, whatever changes. For caches that check their own
        validity (content-addressed ones: e.g. the text channel's terms of each note text,
        looked up by the text itself), so a change re-derives only what changed.

        A kept value with a ``notes_changed(notes)`` method is told of every note removed or
        declared changed in place (:meth:`mark_changed`), with the note objects, so a cache by
        note (the text channel's text of each note) can drop what it read of them."""
        with self._lock:
            value = self._kept.get(key)
            if value is None:
                value = self._kept[key] = make()
            return value

    def _tell_kept(self, notes: tuple[MemoryNote, ...]) -> None:
        for value in self._kept.values():
            tell = getattr(value, "notes_changed", None)
            if tell is not None:
                tell(notes)

    def locked(self) -> threading.RLock:
        """The cluster's lock, as a context manager: no write changes the cluster while it is
        held (what a reader of many clusters' notes holds for each, e.g.
        :meth:`soulmem_torch.graph.MemoryGraph.from_clusters`). Reentrant."""
        return self._lock

    def cached(self, key: Hashable) -> Any:
        """What :meth:`derived` holds for ``key`` at the current version, or ``None`` (nothing
        is built)."""
        with self._lock:
            if self._derived_version != self._version:
                return None
            return self._derived.get(key)

    # -- internals ------------------------------------------------------------------------
    def _touch(self) -> None:
        self._version += 1

    def _insert_node(self, note: MemoryNote, emb: MemoryEmbedding | None) -> None:
        """Adds the node, then materializes the links parked for it (parking order)."""
        self._nodes[note.id] = EmbeddedMemoryNote(note=note, embedding=emb)
        if self._index is not None:
            self._index[note.id] = len(self._index)
        if emb is not None:
            self._num_embedded += 1
            self._dim = emb.dim
        self._materialize_pending(note.id)

    def _materialize(self, source: MemoryId, link: MemoryLink) -> None:
        edge = GraphMemoryLink(
            id=link.id, from_=source, to=link.to, link_type=link.link_type,
            intensity=float(link.intensity),
        )  # fmt: skip
        self._links[link.id] = edge
        self._out.setdefault(source, {})[link.id] = None
        self._in.setdefault(link.to, {})[link.id] = None

    def _unlink(self, link_id: LinkId) -> GraphMemoryLink:
        edge = self._links.pop(link_id)
        self._out[edge.from_].pop(link_id, None)
        self._in[edge.to].pop(link_id, None)
        return edge

    def _merge_link(self, source: MemoryId, link: MemoryLink) -> bool:
        """Materializes or parks one out-link of ``source``; ``False`` if nothing changed."""
        if link.id in self._links:
            return False
        if link.to in self._nodes:
            self._materialize(source, link)
            return True
        entries = self._pending.setdefault(link.to, [])
        if any(s == source and lk.id == link.id for s, lk in entries):
            return False
        entries.append((source, link))
        return True

    def _merge_duplicate(self, note: MemoryNote) -> bool:
        """Merges the new-id links of a duplicate of a present note into it."""
        existing = self._nodes[note.id].note
        if note is existing:
            return False
        known = {lk.id for lk in existing.mem_links}
        changed = False
        for link in note.mem_links:
            if link.id in known:
                continue
            known.add(link.id)
            existing.mem_links.append(link)
            self._merge_link(note.id, link)
            changed = True
        return changed

    def _materialize_pending(self, target: MemoryId) -> None:
        for source, link in self._pending.pop(target, ()):
            if source in self._nodes and link.id not in self._links:
                self._materialize(source, link)

    def _set_pending(self, target: MemoryId, entries: list[tuple[MemoryId, MemoryLink]]) -> None:
        if entries:
            self._pending[target] = entries
        else:
            self._pending.pop(target, None)

    def _drop_pending_from(self, source: MemoryId, drop: Any) -> None:
        for target, entries in list(self._pending.items()):
            kept = [(s, lk) for s, lk in entries if not (s == source and drop(lk.id))]
            if len(kept) != len(entries):
                self._set_pending(target, kept)

    def _replace_parked(self, source: MemoryId, link: MemoryLink) -> bool:
        """Updates a parked link of ``source`` with the same id in place; ``False`` if none."""
        for target, entries in self._pending.items():
            for k, (s, lk) in enumerate(entries):
                if s == source and lk.id == link.id:
                    if target == link.to:
                        entries[k] = (source, link)
                    else:
                        del entries[k]
                        self._set_pending(target, entries)
                        self._merge_link(source, link)
                    return True
        return False


def _table_of(
    items: Sequence[EmbeddedMemoryNote | None],
    tag: SparseRows,
    rows: SparseRows,
    pos: torch.Tensor,
) -> CompactVectors:
    """The notes' own table when the snapshot took its tables as they were (nothing to
    re-point), else a new one of the snapshot's tables."""
    for item in items:
        if item is not None and item.embedding is not None:
            ref = compact_ref(item.embedding)
            if ref is not None and ref.table.tag is tag and ref.table.rows is rows:
                return ref.table
            break
    return CompactVectors(tag, rows, pos)


_new_object = object.__new__
_CPU = torch.device("cpu")


def _plain_f32(t: Any) -> bool:
    """A float32 CPU tensor (what a snapshot's tables hold bit for bit)."""
    return isinstance(t, torch.Tensor) and t.dtype is torch.float32 and t.device == _CPU
