"""``MemoryBank``: many agents' memories answered together, as one disjoint-union snapshot.

Each agent is a :class:`~soulmem_torch.api.SoulMem` (its own notes, ids, links and window);
the bank keeps every agent's cached ``MemoryGraph`` snapshot and concatenates them into one
:class:`~soulmem_torch.bank._union.UnionSnapshot` (built lazily, at the first query after a
change). A batch of requests from many agents runs the default pipeline once:

* similarity of every query against its own agent's notes only (padded candidate rows,
  chunked — never a ``B × total notes`` matrix);
* PPR on the union operator: one sparse product per step answers every agent of the batch
  (queries of different agents share columns; ``k`` queries of one agent take ``k`` columns);
* BayesAction, the softmax of the situation weights and every top-k per candidate row.

For every (agent, query) the result is that of a ``SoulMem`` holding only that agent's notes,
with the same config (same ids in the same order; scores equal up to float rounding).

Cost of a change: ``add_notes`` embeds only the new notes and re-snapshots only that agent at
the next query; the union is then spliced from the previous one — the unchanged agents are
slices of it with their offsets shifted, their rows of the PPR operator reused, and only the
changed agents' tensors and operators are read anew (``O(total)`` copying in a few slices, no
per-agent work for the others; a full concatenation when more than a quarter changed).
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import wraps
from pathlib import Path
from typing import Any

from soulmem_torch._gcpause import gc_paused
from soulmem_torch.bank._agent import Agent
from soulmem_torch.errors import ConfigError, NotFoundError, ValidationError
from soulmem_torch.model import MemoryId, MemoryNote

__all__ = ["MemoryBank"]

BANK_FORMAT = "soulmem-bank"
BANK_VERSION = 1
MANIFEST = "bank.json"
_EMBED_GROUP_NOTES = 2048
"""Notes embedded per embedder call when many agents are added at once (bounds the vectors
held by one call's plan)."""


def _locked(method: Callable[..., Any]) -> Callable[..., Any]:
    """Runs the method under the bank's (re-entrant) lock."""

    @wraps(method)
    def wrapper(self: MemoryBank, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper


def agent_pairs(agents: Any) -> list[Any]:
    """``add_agents``' argument as a list of its ``(agent_id, notes)`` entries (a mapping's
    items, or the pairs given); the entries themselves are checked by the bank."""
    if isinstance(agents, Mapping):
        return list(agents.items())
    if isinstance(agents, Iterable) and not isinstance(agents, (str, bytes)):
        return list(agents)
    raise ValidationError(
        f"agents: expected a mapping of agent ids to notes or (agent_id, notes) pairs, "
        f"found {type(agents).__name__}"
    )


def _check_notes(notes: list[Any], owner: str = "") -> None:
    """Refuses the first entry of ``notes`` that is not a ``MemoryNote`` (``owner``: whose
    notes, in the message)."""
    for i, note in enumerate(notes):
        if not isinstance(note, MemoryNote):
            raise ValidationError(
                f"notes[{i}]{owner}: expected a MemoryNote, found {type(note).__name__}"
            )


@functools.lru_cache(maxsize=1)
def _not_asked() -> Any:
    """The segment of an agent not yet asked: an empty snapshot (one shared object, so an agent
    still not asked is unchanged from one union to the next)."""
    from soulmem_torch.graph import MemoryGraph
    from soulmem_torch.runtime.cluster import MemoryCluster

    return MemoryGraph.from_cluster(MemoryCluster())


def _check_agent_id(agent_id: Any, what: str = "agent_id") -> str:
    if not isinstance(agent_id, str) or not agent_id:
        raise ValidationError(f"{what}: expected a non-empty string, found {agent_id!r}")
    return agent_id


class MemoryBank:
    """Many agents' memories, answered together in one batch per call.

    Args:
        embedder: shared by every agent (notes and queries); ``None`` → the offline
            :class:`~soulmem_torch.embedding.HashingEmbedder`.
        device: where retrieval runs: ``None`` (CPU), ``"auto"``, ``"cuda"``, ``"cuda:1"``, … .
        window_capacity: each agent's short-term window size (as ``SoulMem``).

    The bank's methods take a lock, so threads may share it (changes made directly through an
    agent's ``SoulMem`` view are not covered by it).

    Example::

        bank = MemoryBank()
        bank.add_agent("npc-17", notes)
        results = bank.ask(["npc-17"], ["who did I meet at the market?"])
    """

    def __init__(
        self, *, embedder: Any = None, device: Any = None, window_capacity: int = 20
    ) -> None:
        from soulmem_torch.device import resolve_device
        from soulmem_torch.embedding import HashingEmbedder

        self.embedder = embedder if embedder is not None else HashingEmbedder()
        self.device = resolve_device(device)
        self.window_capacity = window_capacity
        self._agents: dict[str, Agent] = {}
        self._order: list[str] = []
        self._position: dict[str, int] = {}
        self._union: Any = None
        self._union_snapshots: list[Any] = []
        self._joined: set[str] = set()  # the agents in the union (asked at least once)
        self._dirty = True
        self._lock = threading.RLock()
        self.damaged: dict[str, str] = {}
        """Agents :meth:`load` could not load (id → why); writes to them are refused."""
        self.reembedded: str | None = None
        """Set by :meth:`load` when stored vectors came from another embedder."""

    # -- building ------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, agent_id: object) -> bool:
        return agent_id in self._agents

    def agents(self) -> list[str]:
        """Agent ids, in the order they were added."""
        return list(self._order)

    def _register(self, agent_id: str, agent: Agent) -> None:
        self._agents[agent_id] = agent
        self._position[agent_id] = len(self._order)
        self._order.append(agent_id)
        self._dirty = True

    @_locked
    def add_agent(
        self,
        agent_id: str,
        notes: Iterable[MemoryNote] = (),
        *,
        embeddings: Sequence[Any] | None = None,
        readable_ids: dict[MemoryId, str] | None = None,
    ) -> int:
        """Adds an agent with its notes; returns how many notes it holds. :meth:`add_agents`
        of one agent.

        Args:
            agent_id: a new, non-empty string.
            notes: the agent's notes (ids are scoped per agent: the same note may live in
                several agents).
            embeddings: one ``MemoryEmbedding`` per note (precomputed); ``None`` → embedded
                with the bank's embedder in batched calls.
            readable_ids: optional readable names of notes.

        Raises:
            ValidationError: an existing agent id, or a wrong number of embeddings.
        """
        agent_id = _check_agent_id(agent_id)
        given = None if embeddings is None else {agent_id: embeddings}
        readable = None if not readable_ids else {agent_id: readable_ids}
        return self._add_agents([(agent_id, notes)], given, readable)[agent_id]

    @_locked
    def add_agents(
        self,
        agents: Mapping[str, Iterable[MemoryNote]] | Iterable[tuple[str, Iterable[MemoryNote]]],
        *,
        embeddings: Mapping[str, Sequence[Any]] | None = None,
    ) -> dict[str, int]:
        """Adds many agents at once — the agents :meth:`add_agent` of each would add, the same
        answers — with the notes of all of them embedded together (a string several agents
        hold is embedded once; the embedder gets large batches) and their terms read in one
        pass. Returns each new agent's note count, in the order given.

        All or nothing: every id and note is checked and every agent built before any of them
        joins the bank, so a failure leaves the bank as it was.

        Args:
            agents: ``{agent_id: notes}``, or ``(agent_id, notes)`` pairs; new, distinct ids.
            embeddings: ``{agent_id: one MemoryEmbedding per note}`` for the agents whose
                vectors are precomputed (the others are embedded).

        Raises:
            ValidationError: an id that is not new (or given twice), a value that is not a
                note, embeddings for an agent not added or of the wrong count.
        """
        return self._add_agents(agent_pairs(agents), embeddings, None)

    @gc_paused()  # every agent's notes, plans and vectors: many small acyclic objects
    def _add_agents(
        self,
        pairs: list[Any],
        embeddings: Mapping[str, Sequence[Any]] | None,
        readable_ids: Mapping[str, dict[MemoryId, str]] | None,
    ) -> dict[str, int]:
        from soulmem_torch.api import SoulMem
        from soulmem_torch.retrieve.text import remember_notes_terms

        ids: list[str] = []
        seen: set[str] = set()
        note_lists: list[list[MemoryNote]] = []
        for k, pair in enumerate(pairs):
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise ValidationError(
                    f"agents[{k}]: expected an (agent_id, notes) pair, found {type(pair).__name__}"
                )
            agent_id = _check_agent_id(pair[0])
            if agent_id in self._agents:
                raise ValidationError(f"agent_id: {agent_id!r} is already in the bank")
            if agent_id in seen:
                raise ValidationError(f"agent_id: {agent_id!r} is given twice")
            seen.add(agent_id)
            if isinstance(pair[1], (str, bytes, MemoryNote)) or not isinstance(pair[1], Iterable):
                raise ValidationError(
                    f"notes of {agent_id!r}: expected an iterable of MemoryNote, found "
                    f"{type(pair[1]).__name__}"
                )
            notes = list(pair[1])
            _check_notes(notes, f" of {agent_id!r}")
            ids.append(agent_id)
            note_lists.append(notes)
        vectors = self._embeddings_of(ids, note_lists, embeddings)
        mems = [
            SoulMem(
                embedder=self.embedder, device=self.device, window_capacity=self.window_capacity
            )
            for _ in ids
        ]
        # terms read on write (a cache: before the write, which may fail), all in one pass
        remember_notes_terms([mem.cluster for mem in mems], note_lists)
        for mem, notes, agent_vectors in zip(mems, note_lists, vectors):
            mem.working_memory.add_nodes(notes, agent_vectors)
        for agent_id, mem in zip(ids, mems):
            if readable_ids and agent_id in readable_ids:
                mem.readable_ids.update(readable_ids[agent_id])
            self._register(agent_id, Agent(mem=mem))
        return {agent_id: len(mem) for agent_id, mem in zip(ids, mems)}

    def _embeddings_of(
        self,
        ids: list[str],
        note_lists: list[list[MemoryNote]],
        given: Mapping[str, Sequence[Any]] | None,
    ) -> list[list[Any]]:
        """One ``MemoryEmbedding`` per note of each agent: the ``given`` ones (checked for
        their count), the others embedded together, a group of agents per embedder call
        (each agent's vectors packed as its cluster would pack them)."""
        from soulmem_torch.embedding import embed_note_groups
        from soulmem_torch.embedding.compact import compact_ref
        from soulmem_torch.runtime.cluster import first_non_finite

        given = {} if given is None else given
        if not isinstance(given, Mapping):
            raise ValidationError(
                f"embeddings: expected a mapping of agent ids to embeddings, found "
                f"{type(given).__name__}"
            )
        known = set(ids)
        unknown = [a for a in given if a not in known]
        if unknown:
            raise ValidationError(f"embeddings: agent {unknown[0]!r} is not among the agents added")
        out: list[list[Any]] = [[] for _ in ids]
        todo: list[int] = []
        for k, (agent_id, notes) in enumerate(zip(ids, note_lists)):
            if agent_id in given:
                vectors = given[agent_id]
                if not isinstance(vectors, Iterable) or isinstance(vectors, (str, bytes)):
                    raise ValidationError(
                        f"embeddings of {agent_id!r}: expected one MemoryEmbedding per note, "
                        f"found {type(vectors).__name__}"
                    )
                out[k] = list(vectors)
                if len(out[k]) != len(notes):
                    raise ValidationError(
                        f"embeddings: expected {len(notes)} (one per note of {agent_id!r}), "
                        f"found {len(out[k])}"
                    )
            elif notes:
                todo.append(k)
        group: list[int] = []
        size = 0
        for pos, k in enumerate(todo):
            group.append(k)
            size += len(note_lists[k])
            if size >= _EMBED_GROUP_NOTES or pos == len(todo) - 1:
                per_agent = embed_note_groups([note_lists[j] for j in group], self.embedder)
                # one finiteness pass over the group's buffer (it is remembered), rather than
                # one per agent over the views it holds of that buffer
                first_non_finite(
                    [
                        v
                        for agent_vectors in per_agent
                        for e in agent_vectors
                        if compact_ref(e) is None
                        for v in (e.tag, *e.fields.values())
                    ]
                )
                for j, agent_vectors in zip(group, per_agent):
                    out[j] = agent_vectors
                group, size = [], 0
        return out

    @_locked
    def add_agent_graph(self, agent_id: str, graph: Any) -> int:
        """Adds an agent from a tensor snapshot (``MemoryGraph.from_tensors``, no notes).

        Such an agent answers plain (vector / text) and embedded queries; it has no
        ``SoulMem`` view, no string channel and cannot take notes.
        """
        from soulmem_torch.graph import MemoryGraph

        agent_id = _check_agent_id(agent_id)
        if agent_id in self._agents:
            raise ValidationError(f"agent_id: {agent_id!r} is already in the bank")
        if not isinstance(graph, MemoryGraph):
            raise ValidationError(f"graph: expected a MemoryGraph, found {type(graph).__name__}")
        width = getattr(self.embedder, "dim", None)
        tag_table = graph.tag_table
        if tag_table is not None and width is not None and tag_table.shape[1] != width:
            raise ValidationError(
                f"graph: expected embeddings of width {width} (the bank's embedder), found "
                f"width {tag_table.shape[1]}"
            )
        self._register(agent_id, Agent(graph=graph.cpu()))
        return int(graph.num_nodes)

    @staticmethod
    def _add_to(
        mem: Any,
        notes: list[MemoryNote],
        embeddings: Sequence[Any] | None,
        readable_ids: dict[MemoryId, str] | None,
    ) -> int:
        from soulmem_torch.embedding import embed_notes
        from soulmem_torch.retrieve.text import remember_note_terms

        _check_notes(notes)
        if embeddings is None:
            embeddings = embed_notes(notes, mem.embedder) if notes else []
        else:
            embeddings = list(embeddings)
            if len(embeddings) != len(notes):
                raise ValidationError(
                    f"embeddings: expected {len(notes)} (one per note), found {len(embeddings)}"
                )
        remember_note_terms(mem.cluster, notes)  # terms read on write (a cache: before it)
        added = mem.working_memory.add_nodes(notes, embeddings)
        if readable_ids:
            mem.readable_ids.update(readable_ids)
        return sum(bool(a) for a in added)

    @_locked
    def add_notes(
        self,
        agent_id: str,
        notes: Iterable[MemoryNote],
        *,
        embeddings: Sequence[Any] | None = None,
        readable_ids: dict[MemoryId, str] | None = None,
    ) -> int:
        """Adds notes to one agent (the others are untouched); returns how many were new."""
        agent = self._get(agent_id)
        if agent.mem is None:
            raise ValidationError(
                f"agent_id: {agent_id!r} was added as a tensor snapshot and cannot take notes"
            )
        added = self._add_to(agent.mem, list(notes), embeddings, readable_ids)
        self._dirty = True
        return added

    def add_sessions(
        self,
        agent_id: str,
        sessions: Iterable[Any],
        *,
        level: str = "turn",
        roles: Sequence[str] | None = None,
    ) -> int:
        """Adds a chat history to one agent (created when new), mapped as
        :meth:`SoulMem.add_sessions <soulmem_torch.api.SoulMem.add_sessions>`; returns how
        many notes were new."""
        from soulmem_torch.chat import sessions_to_notes

        with self._lock:
            if _check_agent_id(agent_id) not in self._agents:
                made = sessions_to_notes(sessions, level=level, roles=roles)  # type: ignore[arg-type]
                return self.add_agent(agent_id, made.notes)
            agent = self._get(agent_id)
            if agent.mem is None:
                raise ValidationError(
                    f"agent_id: {agent_id!r} was added as a tensor snapshot and cannot take notes"
                )
            added = agent.mem.add_sessions(sessions, level=level, roles=roles)
            self._dirty = True
            return added

    @_locked
    def remember(self, agent_id: str, text: str, **fields: Any) -> MemoryId:
        """Builds a note from plain text for one agent, embeds it and adds it; returns its id.

        The agent is created when it is not in the bank yet. ``fields`` are those of
        :meth:`SoulMem.remember <soulmem_torch.api.SoulMem.remember>` (``kind``, ``time``,
        ``tags``, ``name``, ``link_to`` with ``verb`` / ``trigger`` / ``situation_link``, and the
        kind's own fields); nothing is added (and no agent created) on an error.

        Example::

            bank.remember("npc-17", "I like tea", tags=["taste"], name="sem_tea")
            bank.remember("npc-17", "Shared a pot of tea with Mei", kind="situation",
                          participants=["Mei:friend"], link_to="sem_tea", verb="about")
        """
        from soulmem_torch.api import SoulMem

        agent_id = _check_agent_id(agent_id)
        agent = self._agents.get(agent_id)
        if agent is not None and agent.mem is None:
            raise ValidationError(
                f"agent_id: {agent_id!r} was added as a tensor snapshot and cannot take notes"
            )
        mem = (
            agent.mem
            if agent is not None
            else SoulMem(
                embedder=self.embedder, device=self.device, window_capacity=self.window_capacity
            )
        )
        note_id = mem.remember(text, **fields)
        if agent is None:
            self._register(agent_id, Agent(mem=mem))
        self._dirty = True
        return note_id

    def _get(self, agent_id: Any) -> Agent:
        _check_agent_id(agent_id)
        agent = self._agents.get(agent_id)
        if agent is None:
            raise NotFoundError(f"agent_id: {agent_id!r} is not in the bank")
        return agent

    def agent(self, agent_id: str) -> Any:
        """The ``SoulMem`` of one agent (a live view: changes through it reach the bank)."""
        agent = self._get(agent_id)
        if agent.mem is None:
            raise ValidationError(
                f"agent_id: {agent_id!r} was added as a tensor snapshot; it has no SoulMem view"
            )
        return agent.mem

    def graph(self, agent_id: str) -> Any:
        """The ``MemoryGraph`` snapshot of one agent (CPU)."""
        return self._get(agent_id).snapshot()

    # -- the union ---------------------------------------------------------------------------
    @_locked
    def union(self) -> Any:
        """The disjoint-union snapshot of every agent, rebuilt when an agent changed since the
        last one."""
        return self._union_of(None)

    def _union_of(self, positions: Sequence[int] | None) -> Any:
        """The union with at least the agents at ``positions`` (``None``: every agent) in it.

        An agent enters the union at its first query (docs/spec.md §3 DECISION "agents join
        the union when asked"): until then its segment is empty (:func:`_not_asked`, no notes,
        no links), so a bank of 10,000 agents asked for 1,000 snapshots, indexes and
        normalizes those 1,000. An agent once in stays in (its changes splice it)."""
        from soulmem_torch.bank._operators import carry_operators
        from soulmem_torch.bank._union import build_union, splice_union

        joined, order = self._joined, self._order
        new = (
            [a for a in order if a not in joined]
            if positions is None
            else [order[p] for p in set(positions) if order[p] not in joined]
        )
        if new:
            joined.update(new)
            self._dirty = True
        if self._dirty or self._union is None:
            from soulmem_torch.graph import MemoryGraph

            agents, empty = self._agents, _not_asked()
            # the note-backed agents' snapshots (``Agent.snapshot``), those not built yet in
            # one pass (their columns made and checked once)
            backed = [a for a in order if a in joined and agents[a].mem is not None]
            graphs = MemoryGraph.of_many([agents[a].mem.working_memory.cluster for a in backed])
            built = dict(zip(backed, graphs))
            snaps = [
                built[a] if a in built else agents[a].snapshot() if a in joined else empty
                for a in order
            ]
            old, old_snaps = self._union, self._union_snapshots
            changed = [p for p, s in enumerate(old_snaps) if snaps[p] is not s]
            union = splice_union(old, snaps, changed) if old is not None else None
            if union is None:
                union = build_union(snaps, self.device)
            carry_operators(union, old, changed)
            self._union, self._union_snapshots = union, snaps
            self._dirty = False
        return self._union

    def _fresh_union(self, positions: Sequence[int]) -> Any:
        """The union, with the agents of this batch in it, rebuilt first if one of them
        changed through its view."""
        import torch

        union = self._union_of(positions)
        # an agent's current snapshot is the one its cluster holds for its version (what
        # ``Agent.snapshot`` returns, read without building one: none held means a change)
        key = ("graph", torch.device("cpu"))
        agents, order, snaps = self._agents, self._order, self._union_snapshots
        for p in set(positions):
            mem = agents[order[p]].mem
            if mem is not None and mem.working_memory.cluster.cached(key) is not snaps[p]:
                self._dirty = True
                return self._union_of(positions)
        return union

    # -- asking ------------------------------------------------------------------------------
    def _positions(self, agent_ids: Sequence[Any]) -> list[int]:
        if set(map(type, agent_ids)) <= {str}:  # the common case, without a Python loop
            out = list(map(self._position.get, agent_ids))
            if None not in out:
                return out
        out = []  # a bad or unknown id: found and named by the loop
        for i, a in enumerate(agent_ids):
            if not isinstance(a, str) or not a:
                raise ValidationError(f"agents[{i}]: expected a non-empty string, found {a!r}")
            p = self._position.get(a)
            if p is None:
                raise NotFoundError(f"agents[{i}]: {a!r} is not in the bank")
            out.append(p)
        return out

    @_locked
    def query(
        self,
        requests: Sequence[tuple[str, Any]],
        *,
        config: Any = None,
        priorities: Sequence[int] | None = None,
        now: Any = None,
        record: bool = True,
    ) -> list[Any]:
        """The default pipeline for ``[(agent_id, query), ...]`` in one batch.

        With ``record`` (the default) each answer's notes count one retrieval in its agent's
        records (``SoulMem.query``'s rule, :func:`soulmem_torch.api.record_results`).

        Args:
            requests: pairs of an agent id and a query — a ``MemoryRetrieveQuery`` (or its JSON
                dict, or an embedded ``QueryEmbeddingBatch`` of one query), or, plain mode, a
                ``(D,)`` tensor or a string. One batch is all structured or all plain.
            config: ``DefaultPipelineConfig``; ``None`` → the default.
            priorities: one int per request (passed through); ``None`` → zeros.
            now: when the questions are asked — one aware datetime, or one per request (the
                ``time`` channel).

        Returns:
            one ``DefaultPipelineResult`` per request, in order.
        """
        return self._query(requests, config=config, priorities=priorities, now=now, record=record)

    @_locked
    def _query(
        self,
        requests: Sequence[tuple[str, Any]],
        *,
        config: Any,
        priorities: Sequence[int] | None,
        now: Any,
        record: bool,
        questions: Sequence[bool] | None = None,
    ) -> list[Any]:
        """:meth:`query`; with ``questions`` the requests are free-text questions' (concept,
        episode) pairs, answered one per question (``run_stages``' ``questions``)."""
        from soulmem_torch.bank._pipeline import run_pipeline
        from soulmem_torch.retrieve import DefaultPipelineConfig

        requests = list(requests)
        # all plain 2-tuples (the common case) are checked without a Python loop
        if set(map(type, requests)) <= {tuple} and set(map(len, requests)) <= {2}:
            pairs = requests
        else:
            pairs = []
            for i, item in enumerate(requests):
                if not isinstance(item, (tuple, list)) or len(item) != 2:
                    raise ValidationError(
                        f"requests[{i}]: expected an (agent_id, query) pair, found {item!r}"
                    )
                pairs.append(tuple(item))
        config = DefaultPipelineConfig() if config is None else config
        if not isinstance(config, DefaultPipelineConfig):
            raise ConfigError(
                f"config: expected a DefaultPipelineConfig, found {type(config).__name__}"
            )
        priorities = list(priorities) if priorities is not None else [0] * len(pairs)
        if len(priorities) != len(pairs):
            raise ValidationError(
                f"priorities: expected {len(pairs)} values, found {len(priorities)}"
            )
        from soulmem_torch.retrieve.questions import per_query_times

        nows = per_query_times(now, len(pairs))
        positions = self._positions([a for a, _ in pairs])
        if not pairs:
            return []
        union = self._fresh_union(positions)
        agents, order = self._agents, self._order
        results = run_pipeline(
            union,
            positions,
            [q for _, q in pairs],
            config,
            priorities=priorities,
            memories=[
                None if (mem := agents[order[p]].mem) is None else mem.working_memory
                for p in positions
            ],
            embedder=self.embedder,
            nows=nows,
            questions=questions,
        )
        if record:
            self._record(positions[0::2] if questions is not None else positions, results)
        return results

    def _record(self, positions: Sequence[int], results: Sequence[Any]) -> None:
        from soulmem_torch.api import record_results

        for p, result in zip(positions, results):
            mem = self._agents[self._order[p]].mem
            if mem is not None:
                record_results(mem.working_memory, [result])

    def ask(
        self,
        agent_ids: Sequence[str] | str,
        texts: Sequence[str] | str,
        *,
        config: Any = None,
        now: Any = None,
        record: bool = True,
        only_matching: bool | Sequence[bool] = True,
    ) -> list[Any]:
        """Free-text questions, one per agent id, as ``SoulMem.ask`` of each agent (``now``:
        when they are asked, one aware datetime or one per question; with ``record``, the
        default, each answer's notes count one retrieval).

        Each text runs as a concept query and an episode query (one batch for all agents);
        their memories and actions are mixed, max per note. The default config is
        ``DefaultPipelineConfig.for_questions()``, as for ``SoulMem.ask``.
        ``only_matching`` (default) leaves
        out results that matched nothing the question said, as ``SoulMem.ask`` does; one flag
        for every question, or one per question.
        """
        from soulmem_torch.retrieve import DefaultPipelineConfig
        from soulmem_torch.retrieve.questions import per_query_times, text_queries

        agent_ids = [agent_ids] if isinstance(agent_ids, str) else list(agent_ids)
        texts = [texts] if isinstance(texts, str) else list(texts)
        if len(agent_ids) != len(texts):
            raise ValidationError(
                f"texts: expected {len(agent_ids)} texts (one per agent id), found {len(texts)}"
            )
        self._positions(agent_ids)
        requests = []
        for i, (a, t) in enumerate(zip(agent_ids, texts)):
            try:
                qs = text_queries(t)
            except ValidationError as exc:
                raise ValidationError(f"texts[{i}]: {exc}") from None
            requests.extend((a, q) for q in qs)
        config = DefaultPipelineConfig.for_questions() if config is None else config
        nows = per_query_times(now, len(texts))
        flags = (
            [only_matching] * len(texts) if isinstance(only_matching, bool) else list(only_matching)
        )
        if len(flags) != len(texts) or not all(isinstance(f, bool) for f in flags):
            raise ValidationError(
                f"only_matching: expected a bool or {len(texts)} bools (one per question)"
            )
        # the concept and episode query of every question in one batch, mixed and filtered
        # per question on the tensors (``run_stages``' questions; a tensor-built agent has no
        # texts to match: its questions are not filtered)
        out = self._query(
            requests,
            config=config,
            priorities=None,
            now=[t for t in nows for _ in (0, 1)],
            record=False,
            questions=flags,
        )
        if record:
            self._record(self._positions(agent_ids), out)
        return out

    def describe(self, agent_id: str, scored: Iterable[tuple[MemoryId, float]]) -> list[Any]:
        """``[(name, score)]`` of a result list of one agent (readable ids / labels)."""
        agent = self._get(agent_id)
        if agent.mem is None:
            return [(str(i), float(s)) for i, s in scored]
        return agent.mem.describe(scored)

    # -- learning from use (soulmem_torch.consolidate) ------------------------------------------
    @_locked
    def update_plasticity(
        self,
        agents: Sequence[str] | None = None,
        top_k: int = 8,
        *,
        save_to: str | os.PathLike[str] | None = None,
    ) -> list[Any]:
        """One plasticity update (LTP / LTD) of every given agent at once (docs/spec.md §10).

        One :func:`~soulmem_torch.consolidate.plasticity_kernel` call over the union ranks
        every agent's hot notes and updates every hot link; agents with no retrieval since
        their last update are skipped. Only the agents whose links changed get a new snapshot
        (a copy with the new edge values); the union is spliced at the next query, the other
        agents' operators and dense inverses reused.

        Args:
            agents: agent ids; ``None``: every note-backed agent.
            top_k: >= 0. Hot notes per agent.
            save_to: a bank directory: the changed agents are saved there first (their new
                link values, one atomic store each, then the manifest); only if that succeeds
                are the values applied.

        Returns:
            the changed links (:class:`~soulmem_torch.consolidate.LinkChange`, ``agent`` set).
        """
        from soulmem_torch.consolidate import update_plasticity

        if agents is None:
            ids = [a for a in self._order if self._agents[a].mem is not None]
            union = self.union() if self.device.type == "cpu" and len(ids) == len(self) else None
        else:
            ids = [agents] if isinstance(agents, str) else list(agents)
            for i, a in enumerate(ids):
                if self._get(a).mem is None:
                    raise ValidationError(
                        f"agents[{i}]: {a!r} was added as a tensor snapshot; it has no records"
                    )
            if len(set(ids)) != len(ids):
                raise ValidationError("agents: expected distinct agent ids, found a repeat")
            union = None
        mems = [self._agents[a].mem for a in ids]
        if union is not None and any(
            m.working_memory.graph() is not self._union_snapshots[p] for p, m in enumerate(mems)
        ):
            self._dirty = True
            union = self.union()
        persist = None
        if save_to is not None:
            root = Path(save_to)

            def persist(copies: dict[int, list[Any]]) -> None:
                # the changed links' notes, in one transaction, before anything is applied
                from soulmem_torch.bank._persist import write_agents

                if copies:
                    write_agents(
                        self, root, [ids[p] for p in copies],
                        changed={ids[p]: [n.id for n in twins] for p, twins in copies.items()},
                        pending={ids[p]: ({n.id: n for n in twins}, ())
                                 for p, twins in copies.items()},
                    )  # fmt: skip

        on_applied = None
        if union is not None:

            def on_applied(plan: Any, changed: list[int]) -> None:
                # the same nodes and edges with new values: patch the union, keep the other
                # agents' operators and dense inverses, the node caches (no rebuild)
                from soulmem_torch.bank._operators import with_edge_values

                snaps = [self._agents[a].snapshot() for a in self._order]
                self._union = with_edge_values(
                    union, snaps, changed, plan.edges, plan.intensity, plan.confidence,
                    plan.prob,
                )  # fmt: skip
                self._union_snapshots = snaps

        changes = update_plasticity(
            mems, top_k=top_k, agent_ids=ids, union=union, persist=persist,
            on_applied=on_applied,
        )  # fmt: skip
        if changes and union is None:
            self._dirty = True
        return changes

    async def consolidate(
        self,
        agents: Sequence[str] | str,
        *,
        llm: Any,
        concurrency: int = 8,
        save_to: str | os.PathLike[str] | None = None,
        **options: Any,
    ) -> dict[str, Any]:
        """Consolidates the given agents' window summaries (``SoulMem.consolidate`` of each),
        at most ``concurrency`` at a time (``save_to``: a bank directory, each agent's store
        written before its changes are applied, then the manifest). Returns ``{agent id:
        ConsolidationReport}``; an agent whose consolidation failed reports its error and is
        unchanged. Changes made while it runs through other calls are not locked out: call it
        when the agents are idle."""
        from soulmem_torch.consolidate import consolidate_many

        ids = [agents] if isinstance(agents, str) else list(agents)
        mems = []
        for a in ids:
            mem = self._get(a).mem
            if mem is None:
                raise ValidationError(
                    f"agents: {a!r} was added as a tensor snapshot; it has no window to consolidate"
                )
            mems.append(mem)
        paths = None
        if save_to is not None:
            root = Path(save_to)

            def writer(agent_id: str) -> Any:
                def write(replace: dict[Any, Any], extra: list[tuple[Any, Any]]) -> None:
                    from soulmem_torch.bank._persist import write_agents

                    write_agents(
                        self, root, [agent_id],
                        changed={agent_id: [*replace, *(n.id for n, _ in extra)]},
                        pending={agent_id: (replace, extra)},
                    )  # fmt: skip

                return write

            paths = [writer(a) for a in ids]
        reports = await consolidate_many(
            mems, llm, concurrency=concurrency, save_to=paths, **options
        )
        if any(r.written for r in reports):
            self._dirty = True
        return dict(zip(ids, reports))

    # -- persistence ---------------------------------------------------------------------------
    def _unregister(self, agent_id: str) -> None:
        if agent_id not in self._agents:
            return
        del self._agents[agent_id]
        self._joined.discard(agent_id)
        self._order.remove(agent_id)
        self._position = {a: p for p, a in enumerate(self._order)}
        self._union = None
        self._union_snapshots = []
        self._dirty = True

    def _replace(self, agent_id: str, agent: Agent) -> None:
        self._agents[agent_id] = agent
        self._dirty = True

    @_locked
    def save(self, path: str | os.PathLike[str]) -> Path:
        """Writes every agent into ``path/bank.sqlite3`` in one transaction (only the rows
        that changed); agents the database holds that this bank does not are removed."""
        from soulmem_torch.bank._persist import write_agents

        root = Path(path)
        write_agents(self, root, list(self._order), replace_all=True)
        return root

    @_locked
    def save_agent(
        self,
        path: str | os.PathLike[str],
        agent_id: str,
        *,
        changed: Iterable[MemoryId] | None = None,
    ) -> Path:
        """Persists one agent in one transaction: the rows of ``changed`` notes only when
        given (a write that costs the change, not the bank), else the agent's changed rows."""
        from soulmem_torch.bank._persist import write_agents

        self._get(agent_id)
        root = Path(path)
        write_agents(
            self, root, [agent_id], changed=None if changed is None else {agent_id: changed}
        )
        return root

    @_locked
    def write_notes(
        self,
        path: str | os.PathLike[str],
        agent_id: str,
        notes: Iterable[MemoryNote],
        *,
        readable_ids: dict[MemoryId, str] | None = None,
    ) -> tuple[int, int]:
        """Adds notes to an agent (creating it when absent) and persists exactly that change
        in one transaction before returning ``(added, total)``.

        Everything is validated first (note types, text that cannot be stored as UTF-8, the
        agent id); if embedding, the change or the write fails, the agent is put back as it
        is on disk (a new agent is dropped) and the error propagates: memory and disk stay
        as they were.
        """
        from soulmem_torch.bank._persist import check_agent_text, durable
        from soulmem_torch.store.rows import check_notes, check_utf8

        agent_id = _check_agent_id(agent_id)
        check_agent_text(agent_id)
        notes, _ = check_notes(notes)
        for i, note in enumerate(notes):
            check_utf8(note.to_json(), f"notes[{i}] ({note.id})")
        if agent_id in self.damaged:
            from soulmem_torch.bank._persist import DamagedAgentError

            raise DamagedAgentError(
                f"agent {agent_id!r}: its stored rows are damaged ({self.damaged[agent_id]}); "
                "writes to it are refused so nothing more is lost"
            )
        with durable(self, path, agent_id, changed=[n.id for n in notes]):
            if agent_id in self._agents:
                added = self.add_notes(agent_id, notes, readable_ids=readable_ids)
            else:
                self.add_agent(agent_id, notes, readable_ids=readable_ids)
                added = len(notes)
        return added, len(self.agent(agent_id))

    @staticmethod
    def recorded_embedder_spec(path: str | os.PathLike[str]) -> str | None:
        """The embedder spec (``"hashing"``, ``"st:MODEL"``, …) that the bank saved under
        ``path`` recorded, or ``None`` (no bank there, none recorded, or unreadable: then
        :meth:`load` says why). ``soulmem serve`` reuses it when no ``--embedder`` is given."""
        from soulmem_torch.bank._persist import recorded_embedder_spec

        return recorded_embedder_spec(path)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        *,
        embedder: Any = None,
        device: Any = None,
        on_damaged: str = "warn",
        on_embedder_mismatch: str = "reembed",
    ) -> MemoryBank:
        """A bank saved by :meth:`save` (``bank.sqlite3``, or a legacy ``bank.json``
        directory).

        Every agent is verified on its own: one whose rows are damaged is left out and named
        (``on_damaged="warn"``: a ``DamagedAgentWarning``; :attr:`damaged` maps it to the
        reason) and the others are served; ``"raise"`` refuses the bank instead. Stored
        vectors are reused only when they come from ``embedder`` (compared by identity, as
        ``SoulMem.load``); otherwise that agent is re-embedded (``on_embedder_mismatch=
        "reembed"``, :attr:`reembedded` says why) or the load refused (``"refuse"``).
        """
        from soulmem_torch.bank._persist import load_bank

        return load_bank(cls, path, embedder=embedder, device=device, on_damaged=on_damaged,
                         on_embedder_mismatch=on_embedder_mismatch)  # fmt: skip
