"""``SoulMem``: the library in one object — notes in, batched retrieval and forgetting out.

It holds a ``WorkingMemory`` and an embedder, embeds notes in batched calls when they are added,
and answers queries through the default pipeline (or any strategy) in one batch::

    from soulmem_torch import SoulMem
    from soulmem_torch.data import sample_memory_path

    mem = SoulMem.from_graph_file(sample_memory_path())      # the bundled sample memory
    for result in mem.ask(["a rainy afternoon at the café", "谁是我的朋友？"]):
        print(mem.describe(result.association[:3]), mem.describe(result.action))
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from soulmem_torch._gcpause import gc_paused
from soulmem_torch.device import resolve_device
from soulmem_torch.errors import SoulMemError, ValidationError
from soulmem_torch.model import MemoryId, MemoryNote
from soulmem_torch.model.ids import bulk_parsing
from soulmem_torch.model.label import note_label
from soulmem_torch.model.query import MemoryRetrieveQuery
from soulmem_torch.retrieve import (
    AssociationConfig,
    DefaultPipelineConfig,
    DefaultPipelineResult,
    RetrAssociation,
    RetrDefaultPipeline,
    RetrSimilarity,
    SimilarityConfig,
)
from soulmem_torch.retrieve.questions import per_query_times, text_queries

__all__ = ["EventLoopRunningError", "SoulMem", "note_label", "record_results", "text_queries"]


class EventLoopRunningError(SoulMemError, RuntimeError):
    """A synchronous convenience (:meth:`SoulMem.forget_sync`) was called inside a running
    event loop, where it would block that loop: ``await`` the async method instead."""


def record_results(working_memory: Any, results: Iterable[Any]) -> None:
    """Records the retrievals of pipeline answers (docs/spec.md §10).

    For each result, every distinct note among its ``association`` and ``action`` lists counts
    one retrieval: its record (``working_memory.records[id]``: count, first and last access)
    and the note's own ``retrieval_count`` / ``last_accessed_time`` (what forgetting reads:
    the reinforced half-life) move on, and the working memory's ``retrieval_revision`` with
    them; the working memory is then ``Working`` (a consolidation makes it ``Idle``). The
    cluster's version does not move (retrieval caches stay valid).
    """
    for result in results:
        ids = list(
            dict.fromkeys([i for i, _ in result.association] + [i for i, _ in result.action])
        )
        if ids:
            working_memory.record_retrieval(ids, touch_notes=True, mark_changed=False)
            working_memory.transition_to_working()


class SoulMem:
    """A working memory with an embedder, answering batched queries.

    Notes are embedded (in batched embedder calls) when they are added; :meth:`ask` (free
    text), :meth:`query` (structured queries), :meth:`similar` and :meth:`associate` answer a
    whole batch at once; :meth:`save` / :meth:`load` keep it in a store directory;
    :meth:`forget` (async) or :meth:`forget_sync` ages it.

    Args:
        embedder: batch of strings → ``(n, D)`` tensor; ``None`` → the offline
            :class:`~soulmem_torch.embedding.HashingEmbedder`.
        device: where retrieval runs: ``None`` (CPU), ``"auto"``, ``"cuda"``, ``"cuda:1"``, …,
            resolved here (:func:`soulmem_torch.device.resolve_device`: a bad name or a CUDA
            device on a machine without one is a ``DeviceResolutionError`` now, not at the
            first query).
        window_capacity: size of the short-term sliding window.
        llm: async ``(system, user) -> str`` used for window summaries.

    Example:
        >>> from soulmem_torch import SoulMem
        >>> from soulmem_torch.data import sample_memory_path
        >>> mem = SoulMem.from_graph_file(sample_memory_path())
        >>> mem  # doctest: +ELLIPSIS
        SoulMem(77 notes, 212 links, embedder=HashingEmbedder, device=cpu, window 0/20)
        >>> (result,) = mem.ask("谁教我做桂花糕？")
        >>> [name for name, score in mem.describe(result.association[:2])]  # doctest: +SKIP
        ['sit_grandma_recipe', 'sem_grandma']
    """

    def __init__(
        self,
        *,
        embedder: Any = None,
        device: Any = None,
        window_capacity: int = 20,
        llm: Any = None,
    ) -> None:
        from soulmem_torch.embedding import HashingEmbedder
        from soulmem_torch.runtime import WorkingMemory

        self.embedder = embedder if embedder is not None else HashingEmbedder()
        self.device = resolve_device(device)
        self.working_memory = WorkingMemory(window_capacity=window_capacity, llm=llm)
        self.readable_ids: dict[MemoryId, str] = {}
        self.reembedded: str | None = None
        """Set by :meth:`load` when the store's vectors came from another embedder."""
        self._origin: tuple[Path, str | None] | None = None  # (store path, version) read
        # what the last load / save of _origin left: the tracked cluster and records dict, the
        # readable ids and the records' meta then (None: unknown, the next save is whole)
        self._saved: tuple[Any, Any, dict[MemoryId, str], dict[str, Any]] | None = None

    # -- building ------------------------------------------------------------------------
    @property
    def cluster(self) -> Any:
        return self.working_memory.cluster

    @property
    def loaded_from(self) -> Path | None:
        """The store directory (resolved) this memory was loaded from or last saved to, whose
        :meth:`save` writes only what changed since; ``None`` for a memory never saved."""
        return None if self._origin is None else self._origin[0]

    def __len__(self) -> int:
        return len(self.cluster)

    def __repr__(self) -> str:
        window = self.working_memory.sliding_window
        return (
            f"SoulMem({len(self)} notes, {self.cluster.num_links} links, "
            f"embedder={type(self.embedder).__name__}, device={self.device}, "
            f"window {len(window)}/{window.capacity})"
        )

    def add_notes(
        self, notes: Iterable[MemoryNote], *, readable_ids: dict[MemoryId, str] | None = None
    ) -> int:
        """Embeds the notes in batched calls and adds them; returns how many were new. Their
        text terms are read now too (the text index is written with the notes, docs/spec.md
        §7 DECISION "terms read on write")."""
        from soulmem_torch.embedding import embed_notes
        from soulmem_torch.retrieve.text import remember_note_terms

        notes = list(notes)
        embeddings = embed_notes(notes, self.embedder) if notes else []
        remember_note_terms(self.cluster, notes)  # (a cache: before the write, which may fail)
        added = self.working_memory.add_nodes(notes, embeddings)
        if readable_ids:
            self.readable_ids.update(readable_ids)
        return sum(bool(a) for a in added)

    def add_sessions(
        self,
        sessions: Iterable[Any],
        *,
        level: str = "turn",
        roles: Sequence[str] | None = None,
    ) -> int:
        """Adds a chat history (``ChatSession`` objects, e.g. from
        :func:`soulmem_torch.chat.read_chat_jsonl`) as notes; returns how many were new.

        The mapping is docs/spec.md §11: at ``level="turn"`` every turn (of ``roles``; ``None``:
        all, user and assistant alike) becomes a dated situation with its speaker, each
        session an episode linked to its turns, neighbouring turns linked, each speaker a
        concept; ``level="session"``: one situation per session. Every note keeps its source
        session / turn id (:meth:`chat_source`).

        Example:
            >>> from datetime import datetime, timezone
            >>> from soulmem_torch import SoulMem
            >>> from soulmem_torch.chat import ChatSession, ChatTurn
            >>> day = datetime(2024, 5, 1, tzinfo=timezone.utc)
            >>> chat = ChatSession("s1", day, (ChatTurn("Ann", "user", "I adopted a cat"),
            ...                                 ChatTurn("bot", "assistant", "Lovely!")))
            >>> mem = SoulMem()
            >>> mem.add_sessions([chat])  # two turns, one episode, two speakers
            5
            >>> (r,) = mem.ask("my cat")
            >>> mem.chat_source(r.association[0][0])
            ('s1', 's1_1')
        """
        from soulmem_torch.chat.mapping import SPEAKER_TAG, sessions_to_notes

        known = {  # the speakers an earlier call made: linked to, not made again
            t[len(SPEAKER_TAG) :]: e.note.id
            for e in self.cluster
            for t in e.note.tags
            if t.startswith(SPEAKER_TAG)
        }
        made = sessions_to_notes(
            sessions,
            level=level,  # type: ignore[arg-type]
            roles=roles,
            known_speakers=known,
        )
        return self.add_notes(made.notes)

    def chat_source(self, id: MemoryId) -> tuple[str | None, str | None]:
        """``(session id, turn id)`` a note added by :meth:`add_sessions` came from (``None``
        where it has none, e.g. a speaker; ``(None, None)`` for other notes).

        Raises:
            NotFoundError: ``id`` is not in this memory.
        """
        from soulmem_torch.chat import chat_source
        from soulmem_torch.errors import NotFoundError

        entry = self.cluster.get(id)
        if entry is None:
            raise NotFoundError(f"id: {id} is not in this memory")
        return chat_source(entry.note)

    def remember(
        self,
        text: str,
        *,
        kind: str = "semantic",
        time: Any = None,
        tags: Sequence[str] = (),
        name: str | None = None,
        link_to: Any = None,
        verb: str | None = None,
        trigger: float | None = None,
        situation_link: str | None = None,
        confidence: float = 1.0,
        link_intensity: float = 1.0,
        **options: Any,
    ) -> MemoryId:
        """Builds a note from plain text, embeds it and adds it; returns its id.

        Args:
            text: the concept, the episode's narrative, the action, or the abstract
                situation's place / person / atmosphere / event.
            kind: ``"semantic"`` (default), ``"situation"``, ``"action"``, or an abstract
                situation: ``"location"``, ``"participant"``, ``"environment"``, ``"event"``.
            time: when (aware ``datetime`` or RFC 3339 string; ``None`` → now): the note's
                creation time and a situation's ``time_span``.
            tags: the note's tags.
            name: a readable id (``"sem_osmanthus"``), unique in this memory; results and
                :meth:`describe` show it, and ``link_to`` / :meth:`id_of` accept it.
            link_to: one outgoing link to an existing note (a readable id, a ``MemoryId`` or
                its UUID text), of the kind given by exactly one of ``verb`` (a semantic link,
                with ``confidence``), ``trigger`` (the probability that this note triggers the
                target action) or ``situation_link`` (``"to-abstract"`` / ``"to-specific"``);
                ``link_intensity`` is its intensity.
            **options: the kind's own fields (see
                :func:`~soulmem_torch.model.remember.note_from_text`): ``aliases``,
                ``description``, ``abstract``; ``location``, ``participants``;
                ``action_type``; ``role``; ``tone``; ``initiator``, ``target``, ``intensity``.

        Raises:
            ValidationError: a bad argument (named), a taken ``name``;
            NotFoundError: an unknown ``link_to``. Nothing is added on any error.

        Example:
            >>> from soulmem_torch import SoulMem
            >>> mem = SoulMem()
            >>> cake = mem.remember("osmanthus cake", name="sem_osmanthus", tags=["food"])
            >>> _ = mem.remember("Baked the cake with Grandma", kind="situation",
            ...                  link_to="sem_osmanthus", verb="about")
            >>> len(mem), mem.cluster.num_links
            (2, 1)
        """
        from soulmem_torch.model.remember import add_link, link_type, note_from_text

        if name is not None:
            if not isinstance(name, str) or not name.strip():
                raise ValidationError(f"name: expected a non-empty string, found {name!r}")
            if name in self.readable_ids.values():
                raise ValidationError(f"name: {name!r} already names another note")
        link_args = (verb, trigger, situation_link)
        if link_to is None and any(v is not None for v in link_args):
            raise ValidationError("link_to: verb / trigger / situation_link need a link_to note")
        note = note_from_text(text, kind=kind, time=time, tags=tags, **options)
        if link_to is not None:
            target = self.id_of(link_to)
            kind_of_link = link_type(
                verb=verb, trigger=trigger, situation_link=situation_link, confidence=confidence
            )
            add_link(note, target, kind_of_link, intensity=link_intensity)
        self.add_notes([note], readable_ids={note.id: name} if name is not None else None)
        return note.id

    def id_of(self, ref: Any) -> MemoryId:
        """The id of a note given by its readable id, its ``MemoryId`` or its UUID text.

        Raises:
            NotFoundError: no note of this memory is called or numbered so.
        """
        from soulmem_torch.errors import NotFoundError

        if isinstance(ref, MemoryId):
            if self.cluster.get(ref) is None:
                raise NotFoundError(f"note {ref}: not in this memory")
            return ref
        if not isinstance(ref, str) or not ref:
            raise ValidationError(
                f"note: expected a readable id, a MemoryId or a UUID string, found {ref!r}"
            )
        for mid, rid in self.readable_ids.items():
            if rid == ref and self.cluster.get(mid) is not None:
                return mid
        try:
            mid = MemoryId(ref)
        except (ValueError, TypeError):
            mid = None
        if mid is not None and self.cluster.get(mid) is not None:
            return mid
        raise NotFoundError(f"note {ref!r}: no note of this memory has that readable id or id")

    @classmethod
    def from_notes(cls, notes: Iterable[MemoryNote], **kwargs: Any) -> SoulMem:
        """A memory holding ``notes``, embedded now in batched calls.

        Args:
            notes: the notes (links to notes not among them are kept pending until those
                notes are added, see :class:`~soulmem_torch.runtime.MemoryCluster`).
            **kwargs: the constructor's (``embedder``, ``device``, ``window_capacity``,
                ``llm``).

        Example:
            >>> from soulmem_torch import MemoryNote, SemMemory, SoulMem
            >>> cake = SemMemory(content="osmanthus cake", aliases=["桂花糕"],
            ...                  concept_type="Entity", description="Grandma's recipe")
            >>> mem = SoulMem.from_notes([MemoryNote.build(cake, tags=["food"])])
            >>> len(mem)
            1
        """
        mem = cls(**kwargs)
        mem.add_notes(notes)
        return mem

    @classmethod
    def from_graph_file(cls, path: str | Path, **kwargs: Any) -> SoulMem:
        """From an evaluation-graph file (docs/spec.md §9), keeping the readable ids."""
        from soulmem_torch.model.soul_tune import load_soul_tune_graph

        graph = load_soul_tune_graph(path)
        mem = cls(**kwargs)
        mem.add_notes(graph.notes, readable_ids=graph.readable_ids)
        return mem

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        on_embedder_mismatch: str = "reembed",
        progress: bool = False,
        **kwargs: Any,
    ) -> SoulMem:
        """From a store directory.

        Stored vectors are reused only when the store's recorded embedder identity matches
        this memory's embedder; otherwise every note is re-embedded (``on_embedder_mismatch=
        "reembed"``, the default; a warning names both embedders and :attr:`reembedded` says
        why) or loading fails (``"refuse"``: ``EmbedderMismatchError``). See
        :func:`soulmem_torch.store.embeddings_for_embedder`. A later :meth:`save` to the same
        store fails with ``StoreChangedError`` if another writer saved in between.
        """
        from soulmem_torch.store import MemoryStore, embeddings_for_embedder

        # a load builds ~10 small acyclic objects a note (see _gcpause), and meets each note
        # id several times (its note, links, record: built once, see bulk_parsing)
        with gc_paused(), bulk_parsing():
            contents = MemoryStore(path).load()
            mem = cls(**kwargs)
            embeddings, mem.reembedded = embeddings_for_embedder(
                contents,
                mem.embedder,
                on_mismatch=on_embedder_mismatch,
                progress=progress,
                where=str(path),
            )
            wm = mem.working_memory
            if contents.records is not None:
                from soulmem_torch.runtime.records import Record, records_from_json

                records, pending = records_from_json(contents.records, where=f"{path}: records")
                # the records in the order adding the notes and then the stored records gives
                # (each note's stored record, or a fresh one; then the other stored ones)
                note_ids = [n.id for n in contents.notes]
                if [r.memory_id for r in records[: len(note_ids)]] == note_ids:
                    wm.records.update(zip(note_ids, records))  # what a save writes: note order
                    wm.records.update((r.memory_id, r) for r in records[len(note_ids) :])
                else:
                    stored = {r.memory_id: r for r in records}
                    for nid in note_ids:
                        rec = stored.pop(nid, None)
                        wm.records[nid] = Record.new(nid) if rec is None else rec
                    wm.records.update(stored)
                if pending:
                    wm.retrieval_revision = wm.plasticity_revision + 1
                summary = contents.records.get("window_summary")
                if isinstance(summary, str) and summary:
                    wm.sliding_window.set_summary(summary)
            if contents.records is not None:  # every note has its record now
                wm.cluster.add_notes(contents.notes, embeddings)
            else:
                wm.add_nodes(contents.notes, embeddings)
            mem.readable_ids.update(contents.readable_ids or {})
            mem._origin = (Path(path).resolve(), contents.version)
            if mem.reembedded is None:  # the store holds what this memory holds
                mem._checkpoint()
            return mem

    def save(
        self,
        path: str | Path,
        *,
        overwrite: bool = False,
        keep_versions: int | None = None,
    ) -> dict[str, Any]:
        """Writes notes, embeddings, readable ids and the embedder's identity to a store
        directory, as one transaction that writes only the notes that changed since the
        store's live version (under the store's writer lock).

        Args:
            path: the store directory (created when missing).
            overwrite: replace a store that holds *another* memory (one this memory was not
                loaded from or saved to). Without it that is refused with
                ``StoreExistsError`` and nothing is written; with it the store's previous
                contents stay restorable (``soulmem versions`` / ``soulmem restore``).
            keep_versions: versions the store's change log keeps (``None`` →
                ``$SOULMEM_KEEP_VERSIONS`` or 50).

        Saving back to the store this memory was loaded from fails with ``StoreChangedError``
        (nothing written) if another writer saved a version in between.
        """
        return self._save_with(path, overwrite=overwrite, keep_versions=keep_versions)

    def _save_with(
        self,
        path: str | Path,
        replace: dict[MemoryId, MemoryNote] | None = None,
        extra: list[tuple[MemoryNote, Any]] | None = None,
        plasticity_done: bool = False,
        consolidated: bool = False,
        *,
        overwrite: bool = False,
        keep_versions: int | None = None,
    ) -> dict[str, Any]:
        """:meth:`save`, with some notes replaced by (changed) copies and extra embedded notes
        appended — how a plasticity update or a consolidation persists before it applies."""
        from soulmem_torch.embedding.identity import embedder_identity
        from soulmem_torch.runtime.records import records_to_json
        from soulmem_torch.store import MemoryStore, StoreExistsError

        if not isinstance(overwrite, bool):
            raise ValidationError(f"overwrite: expected True or False, found {overwrite!r}")
        target = Path(path).resolve()
        if (
            not replace
            and not extra
            and not plasticity_done
            and not consolidated
            and self._origin is not None
            and self._origin[0] == target
            and self._saved is not None
            and self._saved[0] is self.cluster
            and self._saved[1] is self.working_memory.records
        ):
            manifest = self._save_changes(path, keep_versions)
            if manifest is not None:
                return manifest
        records = records_to_json(self.working_memory)
        if plasticity_done:  # saved with the update's values: nothing left pending
            records["plasticity_pending"] = False
        if consolidated:  # saved with the consolidation's notes: the summary is used up
            records["window_summary"] = ""
        entries = list(self.cluster)
        replace = replace or {}
        notes = [replace.get(e.note.id, e.note) for e in entries]
        embeddings = [e.embedding for e in entries]
        for note, embedding in extra or ():
            notes.append(note)
            embeddings.append(embedding)
        store = MemoryStore(path, keep_versions=keep_versions)
        ours = self._origin is not None and self._origin[0] == target
        base: Any = self._origin[1] if ours else ...
        with store.lock():
            if not ours and not overwrite and store.exists():
                held = store.count()
                if held:
                    raise StoreExistsError(
                        f"{path}: already holds another memory ({held} notes, version "
                        f"{store.current_version()}); nothing was written — pass "
                        "overwrite=True to replace it (its notes stay restorable with "
                        f"`soulmem restore {path} VERSION`), or SoulMem.load it and add to it"
                    )
            manifest = store.save(
                notes,
                embeddings,
                readable_ids=self.readable_ids or None,
                embedder_name=type(self.embedder).__name__,
                embedder_identity=embedder_identity(self.embedder),
                base_version=base,
                records=records,
            )
        self._origin = (target, store.last_version)
        if replace or extra:  # saved ahead of the memory (its caller applies them next)
            self._saved = None
        else:
            self._checkpoint()
        return manifest

    def _records_meta(self) -> dict[str, Any]:
        from soulmem_torch.runtime.records import RECORDS_FORMAT, RECORDS_VERSION

        wm = self.working_memory
        return {
            "format": RECORDS_FORMAT,
            "version": RECORDS_VERSION,
            "plasticity_pending": wm.retrieval_revision != wm.plasticity_revision,
            "window_summary": wm.sliding_window.summary,
        }

    def _checkpoint(self) -> None:
        """The store at ``_origin`` now holds this memory: changes count from here."""
        wm = self.working_memory
        wm.cluster.take_changes()
        wm.records_changed = set()
        self._saved = (wm.cluster, wm.records, dict(self.readable_ids), self._records_meta())

    def _save_changes(self, path: str | Path, keep_versions: int | None) -> dict[str, Any] | None:
        """:meth:`save` back to the store this memory was loaded from or saved to, writing only
        what changed since (docs/spec.md §12 "incremental saves"): the notes added, replaced,
        removed or declared changed (``MemoryCluster.take_changes``), the records opened or
        changed, the readable ids given. ``None``: not expressible as changes (a readable id
        was dropped from a kept note) — the caller saves the whole memory."""
        from soulmem_torch.embedding.identity import embedder_identity
        from soulmem_torch.store import MemoryStore

        assert self._saved is not None and self._origin is not None
        wm, cluster = self.working_memory, self.cluster
        _, _, saved_rids, saved_meta = self._saved
        rid_changed: set[MemoryId] = set()
        if self.readable_ids != saved_rids:
            if any(k not in self.readable_ids and k in cluster for k in saved_rids):
                return None
            rid_changed = {k for k, v in self.readable_ids.items() if saved_rids.get(k) != v}
        meta = self._records_meta()
        changed = cluster.take_changes()
        rec_changed, wm.records_changed = wm.records_changed, set()
        try:
            if not changed and not rec_changed and not rid_changed and meta == saved_meta:
                return MemoryStore(path).manifest()  # nothing to write: no new version
            ids = changed | {k for k in rid_changed if k in cluster}
            kept = [i for i in ids if i in cluster]
            kept.sort(key=cluster.index_of)  # new notes take their places in cluster order
            removed = [i for i in ids if i not in cluster]
            entries = [cluster[i] for i in kept]
            records = wm.records
            meta["records"] = [
                records[i].model_dump(mode="json") for i in rec_changed if i in records
            ]
            store = MemoryStore(path, keep_versions=keep_versions)
            manifest = store.apply_changes(
                [e.note for e in entries],
                [e.embedding for e in entries],
                removed,
                readable_ids={i: self.readable_ids[i] for i in kept if i in self.readable_ids}
                or None,
                embedder_name=type(self.embedder).__name__,
                embedder_identity=embedder_identity(self.embedder),
                base_version=self._origin[1],
                records=meta,
                removed_records=[i for i in rec_changed if i not in records],
            )
        except BaseException:  # nothing was written: the changes still count
            cluster.note_changed(changed)
            wm.records_changed |= rec_changed
            raise
        self._origin = (self._origin[0], store.last_version)
        self._checkpoint()
        return manifest

    # -- reading -------------------------------------------------------------------------
    def name(self, id: MemoryId) -> str:
        """The readable id of a note when known, else its label."""
        if id in self.readable_ids:
            return self.readable_ids[id]
        entry = self.cluster.get(id)
        return note_label(entry.note) if entry is not None else str(id)

    def describe(self, scored: Iterable[tuple[MemoryId, float]]) -> list[tuple[str, float]]:
        """``[(name, score)]`` for a result list."""
        return [(self.name(i), float(s)) for i, s in scored]

    def query(
        self,
        queries: Sequence[MemoryRetrieveQuery | dict[str, Any]],
        *,
        config: DefaultPipelineConfig | None = None,
        priorities: Sequence[int] | None = None,
        now: datetime | Sequence[datetime | None] | None = None,
        record: bool = True,
    ) -> list[DefaultPipelineResult]:
        """The default pipeline for a batch of structured queries (one batch, one device);
        the cyclic garbage collector is held off for the call (``soulmem_torch._gcpause``).

        ``now``: when the queries are asked (one aware datetime for all, or one per query);
        the ``time`` channel reads it (docs/spec.md §7).

        With ``record`` (the default) every note a query returns (its memories and actions)
        counts one retrieval: see :func:`record_results`."""
        config = config or DefaultPipelineConfig()
        priorities = list(priorities) if priorities is not None else [0] * len(queries)
        if len(priorities) != len(queries):
            raise ValidationError(
                f"priorities: expected {len(queries)} values, found {len(priorities)}"
            )
        nows = per_query_times(now, len(queries))
        with gc_paused():  # many short-lived acyclic objects (see _gcpause)
            requests = [
                config.into_request(
                    self.working_memory, q, p, embedder=self.embedder, device=self.device, now=t
                )
                for q, p, t in zip(queries, priorities, nows)
            ]
            results = RetrDefaultPipeline().retrieve_batch(requests)
        if record:
            record_results(self.working_memory, results)
        return results

    def ask(
        self,
        texts: Sequence[str] | str,
        *,
        config: DefaultPipelineConfig | None = None,
        now: datetime | Sequence[datetime | None] | None = None,
        record: bool = True,
        only_matching: bool = True,
    ) -> list[DefaultPipelineResult]:
        """Free-text questions: each runs as a concept query and an episode query (one batch);
        their memories and actions are mixed, max per note (see :func:`text_queries`). The
        default config is :meth:`DefaultPipelineConfig.for_questions` (seeds from the
        similarity and the text channel together: a free-text question has no fields to
        match).

        With ``record`` (the default) every note an answer returns counts one retrieval (once
        per question, see :func:`record_results`); ``record=False`` leaves the records alone.

        ``only_matching`` (default): results that matched nothing the question said are left
        out — a memory is kept when it shares a word (or CJK bigram) with the question or is
        linked to a note that does (:mod:`soulmem_torch.retrieve.evidence`); a question that
        matches no note gets no memories. ``False`` returns every fused result.

        Like :meth:`query`, holds Python's cyclic garbage collector off for the call (its many
        short-lived objects are acyclic; see ``soulmem_torch._gcpause``)."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        with gc_paused():  # tens of thousands of short-lived acyclic objects (see _gcpause)
            queries = [q for t in texts for q in text_queries(t)]
            config = DefaultPipelineConfig.for_questions() if config is None else config
            nows = per_query_times(now, len(texts))
            requests = [
                config.into_request(
                    self.working_memory, q, 0, embedder=self.embedder, device=self.device, now=t
                )
                for q, t in zip(queries, (t for t in nows for _ in (0, 1)))
            ]
            # each question's two queries mixed, and filtered, on the tensors (run_stages)
            out = RetrDefaultPipeline().retrieve_questions(
                requests, [bool(only_matching)] * len(texts)
            )
            # freed before the collector resumes, so its first young collection sees only `out`
            del queries, requests
        if record:
            record_results(self.working_memory, out)
        return out

    def similar(
        self,
        queries: Sequence[Any],
        *,
        config: SimilarityConfig | None = None,
    ) -> list[list[tuple[MemoryId, float]]]:
        """Similarity only (structured queries, or plain vectors / texts in plain mode)."""
        config = config or SimilarityConfig()
        requests = [
            config.into_request(self.working_memory, q, embedder=self.embedder, device=self.device)
            for q in queries
        ]
        return RetrSimilarity().retrieve_batch(requests)

    def associate(
        self,
        sources: Sequence[Sequence[tuple[MemoryId, float]]],
        *,
        config: AssociationConfig | None = None,
    ) -> list[list[tuple[MemoryId, float]]]:
        """Association (PPR) from scored sources, one list per request."""
        config = config or AssociationConfig()
        requests = [
            config.into_request(self.working_memory, s, device=self.device) for s in sources
        ]
        return RetrAssociation().retrieve_batch(requests)

    def update_plasticity(self, top_k: int = 8, *, save_to: str | Path | None = None) -> list[Any]:
        """One plasticity update (LTP / LTD) of the links between the hot notes (docs/spec.md
        §10): see :mod:`soulmem_torch.consolidate.plasticity`.

        Args:
            top_k: >= 0. Hot notes (records ranked by retrieval frequency).
            save_to: a store directory: the memory, with the new link values, is saved there
                first (:meth:`save`); only if that succeeds are the values applied here.

        Returns:
            the changed links (:class:`~soulmem_torch.consolidate.LinkChange`: link id, ends,
            old and new intensity, confidence, prob). Empty when nothing was retrieved since
            the last update.
        """
        from soulmem_torch.consolidate import update_plasticity

        persist = None
        if save_to is not None:

            def persist(copies: dict[int, list[MemoryNote]]) -> None:
                self._save_with(save_to, {n.id: n for n in copies.get(0, [])}, plasticity_done=True)

        return update_plasticity([self], top_k=top_k, persist=persist)

    async def consolidate(self, *, llm: Any, **options: Any) -> Any:
        """Consolidates the window's summary into long-term notes (docs/spec.md §10):
        see :func:`soulmem_torch.consolidate.consolidate_memory` for ``options`` and the
        bounds (timeout, reply size, all or nothing). A **coroutine**."""
        from soulmem_torch.consolidate import consolidate_memory

        return await consolidate_memory(self, llm, **options)

    async def forget(
        self,
        *,
        now: datetime | None = None,
        llm: Any = None,
        progress: bool = False,
        **options: Any,
    ) -> Any:
        """Lazy forgetting over every note (masking, LLM reconstruction, re-embedding).

        A **coroutine**: ``report = await mem.forget(now=...)`` inside async code. Calling it
        without ``await`` does nothing (Python only warns "coroutine ... was never awaited");
        from plain synchronous code use :meth:`forget_sync`.

        Args:
            now: the time to forget at (aware UTC; ``None`` → now).
            llm: async (or plain) ``(system, user) -> str`` that reconstructs heavily masked
                text; ``None`` → mask only.
            progress: show a progress bar.
            **options: passed to :func:`~soulmem_torch.forget.forget_cluster`
                (``concurrency``, ``timeout`` — 60 s per LLM call by default, ``None`` = no
                limit —, …).

        Returns:
            the :class:`~soulmem_torch.forget.ForgetReport`.

        All or nothing: every new text and embedding is computed first and written in one
        uninterruptible step that also moves the cluster's version on. Cancelling the task,
        Ctrl-C or an LLM raising ``KeyboardInterrupt`` / ``SystemExit`` before that step
        leaves every note untouched (the exception propagates); a failed re-embedding writes
        nothing (``report.written`` is ``False``).
        """
        from soulmem_torch.forget import forget_cluster

        return await forget_cluster(
            self.cluster, llm, now=now, embedder=self.embedder, progress=progress, **options
        )

    def forget_sync(
        self,
        *,
        now: datetime | None = None,
        llm: Any = None,
        progress: bool = False,
        **options: Any,
    ) -> Any:
        """:meth:`forget` for synchronous code: runs the coroutine to completion and returns
        its report.

        Raises:
            RuntimeError (also a ``SoulMemError``): when called while an event loop is running
                in this thread (inside ``async`` code or a notebook cell's loop), where
                ``await mem.forget(...)`` is the call to make.
        """
        import asyncio

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise EventLoopRunningError(
                "forget_sync: an event loop is already running in this thread; use "
                "`await mem.forget(...)` here instead"
            )
        return asyncio.run(self.forget(now=now, llm=llm, progress=progress, **options))
