"""Consolidation: the window's rolling summary becomes long-term notes (docs/spec.md §10).

:func:`consolidate_memory` (what ``SoulMem.consolidate`` runs), when the summary is not blank:

1. ranks the hot notes (:func:`~.plasticity.hot_notes`) and the cycle's active notes
   (:func:`~.active.select_active_nodes`; a cycle's hits are the retrievals since the last
   successful consolidation);
2. asks the injected LLM to split the summary into notes (a JSON array, read tolerantly:
   :func:`~.notes.parse_note_reply`) — bounded like forgetting's calls: a timeout (60 s by
   default), a reply size (:data:`DEFAULT_MAX_REPLY_CHARS`) and at most
   :data:`~.notes.MAX_NOTES` notes, a malformed element refusing the whole reply;
3. merges identical notes (within the reply and with the memory's notes: tags, aliases and links
   merged into the note that stays);
4. links every new note to the active notes — the original's minimal rule
   (:func:`~.notes.minimal_links`), or with ``link_with_llm`` a second LLM call whose links are
   kept only where the legality matrix allows them (:func:`~.notes.legal_link_type`; at most
   :data:`~.notes.MAX_LINKS`); new links start at :data:`~.notes.BASE_INTENSITY`;
5. embeds the new and changed notes, plans the plasticity update of the hot links;
6. **persists first** (``save_to``: one new store version with everything), **then applies** in
   one synchronous step (no ``await``, SIGINT deferred): the notes, the links, the plasticity
   values, and clears the summary. Any failure before — the LLM, the reply, the embedder, the
   store — keeps the summary and changes nothing (``report.error`` says why); cancelling the
   task changes nothing either.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from soulmem_torch.consolidate.active import select_active_nodes
from soulmem_torch.consolidate.notes import (
    deduplicate,
    identity_key,
    link_identity,
    merge_into,
    minimal_links,
    parse_link_reply,
    parse_note_reply,
    resolve_links,
)
from soulmem_torch.consolidate.plasticity import DEFAULT_TOP_K, LinkChange, hot_notes
from soulmem_torch.errors import LLMError, SoulMemError, ValidationError
from soulmem_torch.forget.lazy import DEFAULT_LLM_TIMEOUT_S, call_llm

__all__ = [
    "DEFAULT_MAX_REPLY_CHARS",
    "LINK_SYSTEM_PROMPT",
    "SPLIT_SYSTEM_PROMPT",
    "ConsolidationReport",
    "consolidate_many",
    "consolidate_memory",
]

DEFAULT_MAX_REPLY_CHARS = 65536
"""Longest LLM reply a consolidation reads; longer is a failure (nothing changes)."""

SPLIT_SYSTEM_PROMPT = (
    "You consolidate an agent's short-term memory into long-term memory notes. Split the "
    "conversation summary below into separate, self-contained memories. Answer with a JSON "
    'array only. Each element is an object: "type" is "semantic" (a concept: "content" is its '
    'name, "description", "concept_type" "Entity" or "Abstract", optional "aliases"), '
    '"situation" (an episode: "content" is its narrative, optional "context" with "location", '
    '"participants", "atmosphere", "tone") or "procedure" (an action: "content", "action_type" '
    '"Speak", "Think" or "Skill"); optional "tags" (a list of strings).'
)
LINK_SYSTEM_PROMPT = (
    "You link new memory notes to an agent's memory. Below are new notes (n0, n1, …) and active "
    "notes (a0, a1, …). Answer with a JSON array only: each element "
    '{"from": name, "to": name, "verb": a short relation, "confidence": 0..1} for a semantic '
    'relation, or {"from": a situation, "to": an action, "prob": 0..1} for a trigger.'
)


@dataclass
class ConsolidationReport:
    """What one consolidation did.

    Attributes:
        summary_was_empty: the summary was blank: nothing was asked or changed.
        hot_memories_used: hot notes shown to the LLM.
        active: the cycle's active note ids.
        notes_added: ids of the new notes.
        notes_merged: ids of existing notes that absorbed a proposed duplicate.
        links_added: links created (new notes' links and links merged into existing notes).
        links_changed: the plasticity update's changes.
        error: why nothing was changed, or ``None``.
        written: the result is applied (and persisted, with ``save_to``).
    """

    summary_was_empty: bool = False
    hot_memories_used: int = 0
    active: list[Any] = field(default_factory=list)
    notes_added: list[Any] = field(default_factory=list)
    notes_merged: list[Any] = field(default_factory=list)
    links_added: int = 0
    links_changed: list[LinkChange] = field(default_factory=list)
    error: str | None = None
    written: bool = False


def _format_hot(note: Any, count: int, freq: float, name: str) -> str:
    return (
        f"- {name}: retrieval_count={count}, frequency={freq:.6f}, tags={note.tags}, "
        f"{note.kind}: {_label(note)}"
    )


def _label(note: Any) -> str:
    from soulmem_torch.model.label import note_label

    return note_label(note, width=200)


def _check_positive(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValidationError(f"{name}: expected an int > 0, found {value!r}")
    return value


async def consolidate_memory(
    mem: Any,
    llm: Any,
    *,
    top_k: int = DEFAULT_TOP_K,
    min_cycle_hits: int = 1,
    link_with_llm: bool = False,
    plasticity: bool = True,
    timeout: float | None = DEFAULT_LLM_TIMEOUT_S,
    max_reply_chars: int = DEFAULT_MAX_REPLY_CHARS,
    save_to: str | Path | None = None,
) -> ConsolidationReport:
    """Consolidates one ``SoulMem``'s summary into notes (see the module docstring).

    Args:
        mem: the ``SoulMem``.
        llm: async (or plain) ``(system, user) -> str``.
        top_k: >= 0. Hot notes (prompt, plasticity) and active notes.
        min_cycle_hits: >= 0. Retrievals this cycle that make a note active.
        link_with_llm: link by a second LLM call (legality matrix) instead of the minimal rule.
        plasticity: also run the plasticity update of the hot links in the same commit.
        timeout: seconds per LLM call (``None``: no limit).
        max_reply_chars: > 0. Longest reply read.
        save_to: a store directory written before anything is applied, or a callable
            ``(replaced notes by id, [(new note, embedding)])`` that persists them (a bank's).

    Returns:
        the :class:`ConsolidationReport` (``error`` set, nothing changed, on a failure of the
        LLM, its reply, the embedder or the store).

    Raises:
        ValidationError: bad arguments. ``asyncio.CancelledError``, ``KeyboardInterrupt`` and
            ``SystemExit`` propagate (nothing changed).
    """
    from soulmem_torch.embedding import embed_notes

    max_reply_chars = _check_positive("max_reply_chars", max_reply_chars)
    if llm is None or not callable(llm):
        raise ValidationError(
            f"llm: expected an async callable (system, user) -> str, found {llm!r}"
        )
    wm = mem.working_memory
    report = ConsolidationReport()
    summary = wm.sliding_window.summary
    if not summary.strip():
        report.summary_was_empty = True
        return report
    cluster = wm.cluster
    records = wm.records
    present = {mid: None for mid in cluster.ids()}
    hot = hot_notes(records, top_k, among=present)
    report.hot_memories_used = len(hot)
    baseline = getattr(wm, "consolidation_baseline", {})
    cycle_hits = {
        mid: r.retrieval_count - baseline.get(mid, 0)
        for mid, r in records.items()
        if mid in present and r.retrieval_count > baseline.get(mid, 0)
    }
    active_ids = select_active_nodes(records, cycle_hits, top_k, min_cycle_hits)
    report.active = list(active_ids)
    active = [cluster[mid].note for mid in active_ids]

    hot_lines = [
        _format_hot(cluster[mid].note, count, freq, f"h{i}")
        for i, (mid, count, freq) in enumerate(hot)
    ]
    user = (
        "Summary:\n" + summary.strip() + "\n\nHot memories:\n" + ("\n".join(hot_lines) or "(none)")
    )
    try:
        reply = await call_llm(
            llm, SPLIT_SYSTEM_PROMPT, user, timeout=timeout, max_chars=max_reply_chars
        )
        proposed = parse_note_reply(reply)
    except LLMError as exc:
        report.error = str(exc)
        return report

    # -- de-duplication, within the reply and against the memory ----------------------------
    proposed, remap = deduplicate(proposed)
    existing = {identity_key(item.note): item.note for item in cluster}
    new_notes: list[Any] = []
    merged: dict[Any, Any] = {}  # existing id -> changed copy
    for note in proposed:
        twin = existing.get(identity_key(note))
        if twin is None:
            new_notes.append(note)
            continue
        remap[note.id] = twin.id
        merged[twin.id] = merge_into(merged.get(twin.id, twin), note)

    # -- links --------------------------------------------------------------------------------
    if link_with_llm and (new_notes or merged):
        names = {f"n{i}": n for i, n in enumerate(new_notes)}
        names.update({f"a{i}": n for i, n in enumerate(active)})
        lines = [f"{k}: {n.kind}: {_label(n)}" for k, n in names.items()]
        try:
            reply = await call_llm(
                llm, LINK_SYSTEM_PROMPT, "Notes:\n" + "\n".join(lines),
                timeout=timeout, max_chars=max_reply_chars,
            )  # fmt: skip
            links = resolve_links(parse_link_reply(reply), names)
        except LLMError as exc:
            report.error = str(exc)
            return report
        new_ids = {n.id for n in new_notes}
        links = [lk for lk in links if lk.from_ in new_ids or lk.to in new_ids]
    else:
        links = minimal_links(new_notes, active, records)
    by_id = {n.id: n for n in new_notes}
    added = 0
    for link in links:
        source = link.from_
        owner = by_id.get(source)
        if owner is not None:
            known = {link_identity(lk) for lk in owner.mem_links}
            if link_identity(link) not in known:
                owner.mem_links.append(link)
                added += 1
    # links among the proposed notes that pointed at a dropped duplicate now point at the kept one
    for note in new_notes:
        for lk in note.mem_links:
            if lk.to in remap:
                lk.to = remap[lk.to]
        note.mem_links = [lk for lk in note.mem_links if lk.to != note.id]
    added += sum(len(m.mem_links) - len(cluster[mid].note.mem_links) for mid, m in merged.items())

    # -- embeddings (nothing is written if the embedder fails) ---------------------------------
    try:
        to_embed = [*new_notes, *merged.values()]
        embeddings = embed_notes(to_embed, mem.embedder) if to_embed else []
    except Exception as exc:  # the embedder is user code
        report.error = f"embedder: {type(exc).__name__}: {exc}"
        return report
    new_emb = embeddings[: len(new_notes)]
    merged_emb = dict(zip(merged, embeddings[len(new_notes) :]))

    # -- persist first, then apply (no await from here on) ---------------------------------------
    from soulmem_torch._signals import sigint_deferred
    from soulmem_torch.consolidate.update import update_plasticity

    persisted = False

    def persist(copies: dict[int, list[Any]]) -> None:
        nonlocal persisted
        if save_to is None:
            return
        replace = dict(merged)
        for twin in copies.get(0, []):
            base = replace.get(twin.id)
            if base is None:
                replace[twin.id] = twin
            else:
                values = {lk.id: lk for lk in twin.mem_links}
                replace[twin.id] = base.model_copy(
                    update={"mem_links": [values.get(lk.id, lk) for lk in base.mem_links]}
                )
        if callable(save_to):  # a bank's writer: the agent's rows in the bank's database
            save_to(replace, list(zip(new_notes, new_emb)))
        else:
            mem._save_with(
                save_to, replace, list(zip(new_notes, new_emb)), plasticity_done=plasticity,
                consolidated=True,
            )  # fmt: skip
        persisted = True

    with sigint_deferred():
        try:
            changes = update_plasticity([mem], top_k=top_k, persist=persist) if plasticity else []
            if not persisted:
                persist({})
        except (SoulMemError, OSError) as exc:
            report.error = f"store: {exc}"
            return report
        with cluster._lock:
            for mid, twin in merged.items():
                live = cluster[mid].note
                live.tags = twin.tags
                live.mem_type = twin.mem_type
                current = {lk.id: lk for lk in live.mem_links}  # plasticity's new values
                live.mem_links = [current.get(lk.id, lk) for lk in twin.mem_links]
                cluster.set_embedding(mid, merged_emb[mid])
                cluster.mark_changed(mid)
            wm.add_nodes(new_notes, new_emb)
        wm.sliding_window.clear_summary()
        wm.consolidation_baseline = {mid: r.retrieval_count for mid, r in records.items()}
        wm.transition_to_idle()
    report.notes_added = [n.id for n in new_notes]
    report.notes_merged = list(merged)
    report.links_added = added
    report.links_changed = changes
    report.written = True
    return report


async def consolidate_many(
    mems: Sequence[Any],
    llm: Any,
    *,
    concurrency: int = 8,
    save_to: Sequence[str | Path | None] | None = None,
    **options: Any,
) -> list[ConsolidationReport]:
    """:func:`consolidate_memory` of several memories, at most ``concurrency`` at a time
    (each one all or nothing on its own; ``save_to``: one store directory per memory)."""
    concurrency = _check_positive("concurrency", concurrency)
    paths = list(save_to) if save_to is not None else [None] * len(mems)
    if len(paths) != len(mems):
        raise ValidationError(f"save_to: expected {len(mems)} paths, found {len(paths)}")
    gate = asyncio.Semaphore(concurrency)

    async def one(mem: Any, path: Any) -> ConsolidationReport:
        async with gate:
            return await consolidate_memory(mem, llm, save_to=path, **options)

    return list(await asyncio.gather(*(one(m, p) for m, p in zip(mems, paths))))
