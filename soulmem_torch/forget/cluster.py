"""Forgetting over a whole cluster: :func:`forget_cluster`.

1. The missing degree of every note is computed as one tensor operation
   (:func:`~soulmem_torch.forget.decay.missing_degree_batch`).
2. :func:`~soulmem_torch.forget.lazy.lazy_forget` runs over every eligible note (a Semantic or
   SpecificSituation note with ``md >= MASK_THRESHOLD``) concurrently, at most
   ``config.concurrency`` at a time, with a tqdm progress bar; with ``config.align`` a revised
   Semantic note is then realigned (:func:`~soulmem_torch.forget.align.align_sem_fields`).
3. With an ``embedder``, every note whose text changed (masked or revised) is re-embedded in one
   batch through ``soulmem_torch.embedding.embed_notes`` and the new embedding stored, so
   retrieval sees the new text.
4. Optional, off by default (``config.prune_below``): links whose decayed intensity
   (``intensity · R(source note)``) falls below the threshold are removed — the original's older
   "delete weak links" design — and reported.

**All or nothing.** Steps 2–4 work on private copies of the notes' texts; nothing the caller
holds is touched until everything is computed. Then one commit step — synchronous (no
``await``, so a ``task.cancel()`` cannot land inside it), under the cluster's lock, with SIGINT
deferred to its end — writes every new text, every new embedding, the pruned links, and marks
the notes changed (the cluster's ``version`` moves on). Cancelling :func:`forget_cluster`
(``task.cancel()``, Ctrl-C, an LLM raising ``KeyboardInterrupt`` / ``SystemExit``) before that
step leaves every note untouched; after it, every note is fully updated. If re-embedding fails,
nothing is written (``ForgetReport.written`` is ``False``): a new text never sits beside its
stale embedding.

The input is duck-typed: any iterable of ``MemoryNote`` / ``EmbeddedMemoryNote``, or a
``MemoryCluster``. The cluster-specific parts sit behind :class:`ClusterAdapter`:
``set_embedding(id, embedding)``, ``mark_changed(id)``, ``links()`` and ``remove_link(link_id)``
are used when the input has them (a changed note is reported through ``mark_changed`` so the
cluster's ``version`` moves on and its graph snapshot is rebuilt); otherwise embeddings go to ``item.embedding`` (if the item has that attribute)
and links are read from / removed on the owning note's ``mem_links``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from tqdm.auto import tqdm

from soulmem_torch._signals import sigint_deferred
from soulmem_torch.errors import LLMError, ValidationError
from soulmem_torch.forget.align import align_sem_fields
from soulmem_torch.forget.decay import (
    DEFAULT_ACTIVE_FACTOR,
    DEFAULT_BASE_HALF_LIFE_HOURS,
    DEFAULT_MAX_ACTIVATION_CAP,
    edge_decay_intensity_batch,
    missing_degree_batch,
    note_time_tensors,
    to_epoch_ns,
)
from soulmem_torch.forget.lazy import (
    DEFAULT_LLM_TIMEOUT_S,
    MASK_THRESHOLD,
    ForgetAction,
    MaskOnly,
    NoAction,
    Revised,
    get_summary,
    lazy_forget,
    set_summary,
)
from soulmem_torch.forget.mask import resolve_tokenizer
from soulmem_torch.model import SemMemory
from soulmem_torch.model.serde import to_float32

__all__ = [
    "ClusterAdapter",
    "ForgetConfig",
    "ForgetFailure",
    "ForgetReport",
    "LinkRef",
    "PrunedLink",
    "forget_cluster",
]


class ForgetConfig(BaseModel):
    """Options of :func:`forget_cluster`.

    The decay parameters default to the original's constants (docs/spec.md §8).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_half_life_hours: float = Field(
        DEFAULT_BASE_HALF_LIFE_HOURS,
        gt=0,
        allow_inf_nan=False,
        description="Half-life of a never-retrieved note.",
    )
    active_factor: float = Field(
        DEFAULT_ACTIVE_FACTOR,
        ge=0,
        allow_inf_nan=False,
        description="Half-life gain per retrieval (fraction of base).",
    )
    max_activation_cap: int = Field(
        DEFAULT_MAX_ACTIVATION_CAP, ge=0, description="Retrievals beyond this are ignored."
    )
    concurrency: int = Field(8, ge=1, description="At most this many notes in flight at once.")
    timeout: float | None = Field(
        DEFAULT_LLM_TIMEOUT_S,
        gt=0,
        allow_inf_nan=False,
        description="Seconds one LLM call may take (default 60); None = no limit.",
    )
    system_prompt: str | None = Field(
        None, description="Replaces the default reconstruction system message."
    )
    align: bool = Field(
        False, description="Realign aliases/description/type of revised Semantic notes."
    )
    align_system_prompt: str | None = Field(
        None, description="Replaces the default alignment system message."
    )
    reembed: bool = Field(
        True, description="With an embedder: re-embed every note whose text changed."
    )
    prune_below: float | None = Field(
        None,
        ge=0,
        allow_inf_nan=False,
        description="Remove links whose decayed intensity is below this; None = keep all links.",
    )


@dataclass(frozen=True)
class ForgetFailure:
    """Something that went wrong for one note (or, for ``stage == "embed"``, for the batch).

    Attributes:
        note_id: the note's id; ``None`` for a batch failure.
        stage: ``"llm"`` (reconstruction failed → masked only), ``"align"``, ``"forget"`` (an
            unexpected error; the note is unchanged) or ``"embed"``.
        error: the message.
    """

    note_id: Any
    stage: str
    error: str


@dataclass(frozen=True)
class LinkRef:
    """A link as seen by :class:`ClusterAdapter`: id, ends, stored intensity."""

    id: Any
    from_: Any
    to: Any
    intensity: float


@dataclass(frozen=True)
class PrunedLink:
    """A removed link with its stored and decayed intensity."""

    id: Any
    from_: Any
    to: Any
    intensity: float
    decayed_intensity: float


@dataclass
class ForgetReport:
    """What :func:`forget_cluster` did.

    Attributes:
        total: notes seen.
        eligible: notes handed to ``lazy_forget`` (forgettable kind, ``md >= 0.05``).
        actions: note id → action, for every note that completed (ineligible ones get
            ``NoAction``).
        failures: LLM failures (the note was masked only), alignment and embedding failures,
            and unexpected errors (``stage == "forget"``; the note was left unchanged).
        reembedded: ids of notes given a new embedding.
        embeddings: note id → new embedding (also stored through the adapter where possible).
        aligned: ids of notes whose fields alignment changed.
        pruned: removed links.
        written: whether the results were written (``False`` when re-embedding failed: then
            no note, embedding or link was changed).
        elapsed_s: wall time of the whole run.
    """

    total: int = 0
    eligible: int = 0
    actions: dict[Any, ForgetAction] = field(default_factory=dict)
    failures: list[ForgetFailure] = field(default_factory=list)
    reembedded: list[Any] = field(default_factory=list)
    embeddings: dict[Any, Any] = field(default_factory=dict)
    aligned: list[Any] = field(default_factory=list)
    pruned: list[PrunedLink] = field(default_factory=list)
    written: bool = True
    elapsed_s: float = 0.0

    @property
    def counts(self) -> dict[str, int]:
        """Number of notes per action: ``{"NoAction": …, "MaskOnly": …, "Revised": …}``."""
        counts = {"NoAction": 0, "MaskOnly": 0, "Revised": 0}
        for action in self.actions.values():
            counts[type(action).__name__] += 1
        return counts

    @property
    def no_action(self) -> int:
        return self.counts["NoAction"]

    @property
    def mask_only(self) -> int:
        return self.counts["MaskOnly"]

    @property
    def revised(self) -> int:
        return self.counts["Revised"]

    @property
    def notes_per_second(self) -> float:
        """Throughput over all notes seen."""
        return self.total / self.elapsed_s if self.elapsed_s > 0 else float("inf")

    def summary(self) -> str:
        """One line for logs and the CLI."""
        c = self.counts
        line = (
            f"{self.total} notes ({self.eligible} eligible): {c['Revised']} revised, "
            f"{c['MaskOnly']} masked only, {c['NoAction']} unchanged; "
            f"{len(self.failures)} failures, {len(self.reembedded)} re-embedded, "
            f"{len(self.pruned)} links pruned in {self.elapsed_s:.2f} s"
        )
        if not self.written:
            line += "; nothing written (re-embedding failed)"
        return line


# -------------------------------------------------------------------------------------------
# adapter
# -------------------------------------------------------------------------------------------
class ClusterAdapter:
    """The cluster-specific operations forgetting needs, over a cluster or plain notes.

    Args:
        source: a ``MemoryCluster`` (iterable of ``EmbeddedMemoryNote``; ``set_embedding``,
            ``links``, ``remove_link``) or any iterable of notes / embedded notes.
    """

    def __init__(self, source: Iterable[Any]) -> None:
        if isinstance(source, (str, bytes)) or not isinstance(source, Iterable):
            raise ValidationError(
                "source: expected a MemoryCluster or an iterable of notes, "
                f"found {type(source).__name__}"
            )
        self.source = source
        self.items: list[Any] = list(source)
        self.notes: list[Any] = [getattr(item, "note", item) for item in self.items]
        for i, note in enumerate(self.notes):
            if not hasattr(note, "mem_type") or not hasattr(note, "create_time"):
                raise ValidationError(
                    f"source[{i}]: expected a MemoryNote or EmbeddedMemoryNote, "
                    f"found {type(self.items[i]).__name__}"
                )
        self.index: dict[Any, int] = {note.id: i for i, note in enumerate(self.notes)}
        self._is_cluster = callable(getattr(source, "set_embedding", None))

    def set_embedding(self, i: int, embedding: Any) -> bool:
        """Stores the new embedding of note ``i``; ``False`` when there is nowhere to put it."""
        if self._is_cluster:
            self.source.set_embedding(self.notes[i].id, embedding)  # type: ignore[attr-defined]
            return True
        item = self.items[i]
        if item is not self.notes[i] and hasattr(item, "embedding"):
            item.embedding = embedding
            return True
        return False

    def mark_changed(self, i: int) -> None:
        """Tells a cluster that note ``i`` was mutated in place (its ``version`` moves on)."""
        mark = getattr(self.source, "mark_changed", None)
        if callable(mark):
            mark(self.notes[i].id)

    def links(self) -> list[LinkRef]:
        """Every link: the cluster's ``links()``, else each note's ``mem_links``."""
        cluster_links = getattr(self.source, "links", None)
        if callable(cluster_links):
            return [LinkRef(lk.id, lk.from_, lk.to, float(lk.intensity)) for lk in cluster_links()]
        return [
            LinkRef(lk.id, note.id, lk.to, float(lk.intensity))
            for note in self.notes
            for lk in note.mem_links
        ]

    def remove_link(self, link: LinkRef) -> None:
        """Removes a link: the cluster's ``remove_link``, else from the owning note."""
        remove = getattr(self.source, "remove_link", None)
        if callable(remove):
            remove(link.id)
            return
        owner = self.notes[self.index[link.from_]]
        owner.mem_links = [lk for lk in owner.mem_links if lk.id != link.id]

    def locked(self) -> contextlib.AbstractContextManager[Any]:
        """The cluster's own lock when it has one (readers never see a half commit)."""
        lock = getattr(self.source, "_lock", None)
        if lock is not None and hasattr(lock, "__enter__"):
            return lock  # type: ignore[no-any-return]
        return contextlib.nullcontext()

    def present(self, i: int) -> bool:
        """Whether note ``i`` is still in a cluster source (always True for plain notes)."""
        if not self._is_cluster or not hasattr(self.source, "__contains__"):
            return True
        return self.notes[i].id in self.source  # type: ignore[operator]

    def commit(
        self,
        changed: list[int],
        copies: dict[int, Any],
        embeddings: dict[int, Any],
        prune: list[LinkRef],
    ) -> None:
        """Writes computed results in one synchronous step (see the module docs).

        New embeddings are stored first, restored on any error (so a bad embedding leaves
        everything as it was); then the texts (and aligned Semantic fields) are copied over,
        the notes marked changed and the links removed -- plain attribute writes that do not
        fail.
        """
        done: list[tuple[int, Any]] = []
        try:
            for i, embedding in embeddings.items():
                before = getattr(self.items[i], "embedding", None)
                if self.set_embedding(i, embedding):
                    done.append((i, before))
        except BaseException:
            for i, before in reversed(done):
                self.set_embedding(i, before)
            raise
        for i in changed:
            _copy_text(self.notes[i], copies[i])
            self.mark_changed(i)
        for link in prune:
            self.remove_link(link)


def _working_copy(note: Any) -> Any:
    """A copy of ``note`` whose ``mem_type`` (the only part forgetting edits) is private.

    Shallow copies suffice: forgetting only *assigns* the mem_type's fields (the summary
    string; a Semantic note's aliases list, description and concept type), never mutates a
    shared value in place.
    """
    shallow = getattr(note.mem_type, "model_copy", None)
    mem_type = shallow() if callable(shallow) else copy.copy(note.mem_type)
    model_copy = getattr(note, "model_copy", None)
    if callable(model_copy):
        return model_copy(update={"mem_type": mem_type})
    twin = copy.copy(note)
    twin.mem_type = mem_type
    return twin


def _copy_text(note: Any, work: Any) -> None:
    """Copies what forgetting changes (the summary; a Semantic note's aligned fields)."""
    set_summary(note, get_summary(work))
    src, dst = work.mem_type, note.mem_type
    if isinstance(src, SemMemory) and isinstance(dst, SemMemory):
        if dst.aliases != src.aliases:
            dst.aliases = list(src.aliases)
        if dst.description != src.description:
            dst.description = src.description
        if dst.concept_type != src.concept_type:
            dst.concept_type = src.concept_type


def _default_embed_notes() -> Callable[[list[Any], Any], list[Any]]:
    from soulmem_torch.embedding import embed_notes  # lazy: wired by the embedding package

    return embed_notes


# -------------------------------------------------------------------------------------------
# forget_cluster
# -------------------------------------------------------------------------------------------
async def forget_cluster(
    source: Iterable[Any],
    llm: Callable[[str, str], Any] | None = None,
    *,
    now: datetime | int | None = None,
    tokenizer: Any = None,
    embedder: Any = None,
    config: ForgetConfig | None = None,
    progress: bool = True,
    **options: Any,
) -> ForgetReport:
    """Runs lazy forgetting over every eligible note of a cluster (mutates the notes).

    Args:
        source: a ``MemoryCluster`` or an iterable of ``MemoryNote`` / ``EmbeddedMemoryNote``.
        llm: ``async (system, user) -> str``; ``None`` = notes past the revise threshold are
            only masked (reported as ``"llm"`` failures).
        now: aware datetime (or int ns) for every note; ``None`` = the current time, read once.
        tokenizer: as for :func:`~soulmem_torch.forget.mask.mask_text`; resolved once.
        embedder: an ``Embedder`` for ``soulmem_torch.embedding.embed_notes``; ``None`` = no
            re-embedding.
        config: :class:`ForgetConfig`; ``options`` override single fields
            (``forget_cluster(c, llm, concurrency=4)``).
        progress: show a tqdm progress bar.

    Returns:
        A :class:`ForgetReport`.

    Raises:
        ValidationError: bad ``source``, ``now`` or options.
    """
    start = time.perf_counter()
    cfg = config or ForgetConfig()
    if options:
        try:
            cfg = ForgetConfig.model_validate({**cfg.model_dump(), **options})
        except Exception as exc:
            raise ValidationError(f"options: {exc}") from None
    now_ns = to_epoch_ns(datetime.now(timezone.utc) if now is None else now, name="now")
    adapter = ClusterAdapter(source)
    notes = adapter.notes
    report = ForgetReport(total=len(notes))
    cut = resolve_tokenizer(tokenizer)

    decay_kw = {
        "base_half_life_hours": cfg.base_half_life_hours,
        "active_factor": cfg.active_factor,
        "max_activation_cap": cfg.max_activation_cap,
    }
    create_ns, counts = note_time_tensors(notes)
    md_list: list[float] = missing_degree_batch(create_ns, counts, now=now_ns, **decay_kw).tolist()

    mask_threshold = to_float32(MASK_THRESHOLD)
    actions: list[ForgetAction | None] = [None] * len(notes)
    todo: list[int] = []
    for i, note in enumerate(notes):
        summary = get_summary(note)
        if summary is None or to_float32(md_list[i]) < mask_threshold:
            actions[i] = NoAction(summary, md_list[i])
        else:
            todo.append(i)
    report.eligible = len(todo)

    bar = tqdm(total=len(todo), desc="forget", unit="note", disable=not progress, leave=True)
    pending = iter(todo)
    copies: dict[int, Any] = {}  # private working copies: the caller's notes stay untouched

    async def forget_one(i: int) -> None:
        note = _working_copy(notes[i])
        try:
            action = await lazy_forget(
                note,
                now_ns,
                cut,
                llm,
                system_prompt=cfg.system_prompt,
                timeout=cfg.timeout,
                missing_degree=md_list[i],
                **decay_kw,
            )
        except Exception as exc:  # an unexpected error must not stop the other notes
            report.failures.append(ForgetFailure(note.id, "forget", f"{type(exc).__name__}: {exc}"))
            return
        actions[i] = action
        copies[i] = note
        if isinstance(action, MaskOnly) and action.llm_error is not None:
            report.failures.append(ForgetFailure(note.id, "llm", action.llm_error))
        if cfg.align and isinstance(action, Revised) and isinstance(note.mem_type, SemMemory):
            try:
                result = await align_sem_fields(
                    note,
                    llm,
                    missing_degree=md_list[i],
                    system_prompt=cfg.align_system_prompt,
                    timeout=cfg.timeout,
                )
            except LLMError as exc:
                report.failures.append(ForgetFailure(note.id, "align", str(exc)))
            else:
                if result is not None and result.changed:
                    report.aligned.append(note.id)

    abort: list[BaseException] = []
    workers: list[asyncio.Future[None]] = []

    async def worker() -> None:
        for i in pending:  # one shared iterator: each index is taken by exactly one worker
            if abort:
                return
            try:
                await forget_one(i)
            except (KeyboardInterrupt, SystemExit) as exc:
                # Raised by the LLM: stop every worker here, inside the tasks (escaping a task,
                # it would tear the event loop down with the other workers still pending).
                abort.append(exc)
                for other in workers:
                    other.cancel()
                return
            finally:
                bar.update(1)

    workers.extend(asyncio.ensure_future(worker()) for _ in range(min(cfg.concurrency, len(todo))))
    try:
        outcomes = await asyncio.gather(*workers, return_exceptions=True)
    finally:
        bar.close()
    if abort:  # nothing was written: re-raise to the caller
        raise abort[0]
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    report.actions = {notes[i].id: a for i, a in enumerate(actions) if a is not None}
    # completion order depends on the LLM's latency; report in note order instead
    report.failures.sort(key=lambda f: adapter.index.get(f.note_id, len(notes)))
    report.aligned.sort(key=adapter.index.__getitem__)
    changed = [i for i, a in enumerate(actions) if isinstance(a, (MaskOnly, Revised))]

    embeddings: dict[int, Any] = {}
    if embedder is not None and cfg.reembed and changed:
        embedded = await _reembed([copies[i] for i in changed], report, embedder)
        if embedded is None:
            report.written = False
            report.elapsed_s = time.perf_counter() - start
            return report
        embeddings = dict(zip(changed, embedded))
    prune = (
        _prune_plan(adapter, report, cfg.prune_below, create_ns, counts, now_ns, decay_kw)
        if cfg.prune_below is not None
        else []
    )

    # The commit: no await from here on, so a task.cancel() cannot split it.
    with sigint_deferred(), adapter.locked():
        gone = [i for i in changed if not adapter.present(i)]
        for i in gone:
            report.failures.append(
                ForgetFailure(notes[i].id, "forget", "the note was removed during forgetting")
            )
            report.actions.pop(notes[i].id, None)
            embeddings.pop(i, None)
        if gone:
            changed = [i for i in changed if i not in set(gone)]
            prune = [lk for lk in prune if adapter.present(adapter.index[lk.from_])]
        adapter.commit(changed, copies, embeddings, prune)
    for i, embedding in embeddings.items():
        report.embeddings[notes[i].id] = embedding
        report.reembedded.append(notes[i].id)
    report.elapsed_s = time.perf_counter() - start
    return report


async def _reembed(batch: list[Any], report: ForgetReport, embedder: Any) -> list[Any] | None:
    """Embeddings of the changed notes (one batched call in a worker thread); ``None`` (and
    an ``"embed"`` failure in the report) when it failed."""
    try:
        embed_notes = _default_embed_notes()
        embeddings = await asyncio.to_thread(embed_notes, batch, embedder)
        if len(embeddings) != len(batch):
            raise ValidationError(
                f"embed_notes: expected {len(batch)} embeddings, found {len(embeddings)}"
            )
    except Exception as exc:
        report.failures.append(ForgetFailure(None, "embed", f"{type(exc).__name__}: {exc}"))
        return None
    return list(embeddings)


def _prune_plan(
    adapter: ClusterAdapter,
    report: ForgetReport,
    threshold: float,
    create_ns: Any,
    counts: Any,
    now_ns: int,
    decay_kw: dict[str, Any],
) -> list[LinkRef]:
    """The links to remove (reported in ``report.pruned``); removed by the commit step."""
    import torch

    links = [lk for lk in adapter.links() if lk.from_ in adapter.index]
    if not links:
        return []
    src = torch.tensor([adapter.index[lk.from_] for lk in links], dtype=torch.int64)
    edge_index = torch.stack([src, src])
    intensity = torch.tensor([lk.intensity for lk in links], dtype=torch.float64)
    decayed = edge_decay_intensity_batch(
        intensity, edge_index, create_ns, counts, now=now_ns, **decay_kw
    ).tolist()
    plan = []
    for link, value in zip(links, decayed):
        if value < threshold:
            plan.append(link)
            report.pruned.append(PrunedLink(link.id, link.from_, link.to, link.intensity, value))
    return plan
