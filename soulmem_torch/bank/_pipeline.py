"""The union backend of the default pipeline: :func:`soulmem_torch.retrieve.stages.run_stages`
over a :class:`~soulmem_torch.bank._union.UnionSnapshot`.

The stages (short-term window, seeds, fusion, result lists) are written once, in
``retrieve/stages.py``; here are the graph-dependent kernels on per-query candidate rows
``(B, M)`` — query ``b``'s agent's notes, padded to the largest agent of the batch, ``valid``
marking the real ones: similarity (structured, string channel, or plain cosine), the
whole-note text and time channels, association (PPR on the union operator, directed and
undirected) and BayesAction from the recalled situations. Every ``DefaultPipelineConfig``
field works (tests/bank/test_bank.py changes each one and compares with a ``SoulMem`` per
agent).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from soulmem_torch._gcpause import gc_paused
from soulmem_torch.bank._bayes import candidate_bayes
from soulmem_torch.bank._dense import segment_dense_ppr
from soulmem_torch.bank._operators import segment_power_ppr_channels, union_transition
from soulmem_torch.bank._union import (
    UnionSnapshot,
    agent_graph,
    candidates,
    grouped_is_cheaper,
    grouped_structured_similarity,
    note_ids,
    plain_similarity,
    structured_similarity,
)
from soulmem_torch.errors import ValidationError
from soulmem_torch.retrieve.assoc_with_action import situation_softmax
from soulmem_torch.retrieve.similarity import is_plain_query, structured_batch
from soulmem_torch.retrieve.stages import run_stages

__all__ = ["UnionBackend", "run_pipeline"]

_F64 = torch.float64


def _plain_vectors(queries: Sequence[Any], embedder: Any, width: int, device: Any) -> Tensor:
    texts = [q for q in queries if isinstance(q, str)]
    if not texts:  # all tensors: one stack when they are (width,) vectors that stack to float32
        try:
            q = torch.stack(list(queries))
        except (RuntimeError, TypeError):
            q = None  # the per-query checks below name the offending query
        # (a float32 stack casts every query to float32 itself, as ``.to`` would one by one)
        if q is not None and q.dim() == 2 and q.shape[1] == width and q.dtype == torch.float32:
            if q.device != device:
                q = q.to(device)
            if not bool(torch.isfinite(q).all()):
                raise ValidationError("query: expected finite vectors, found NaN or inf")
            return q
    embedded = iter(())
    if texts:
        if embedder is None:
            raise ValidationError("embedder: text queries need an embedder")
        from soulmem_torch.embedding.embedder import run_embedder

        embedded = iter(run_embedder(embedder, texts))
    rows = []
    for i, q in enumerate(queries):
        v = next(embedded) if isinstance(q, str) else q
        if v.dim() != 1 or v.shape[0] != width:
            raise ValidationError(
                f"query[{i}]: expected a vector of width {width}, found {tuple(v.shape)}"
            )
        if v.device != device or v.dtype != torch.float32:
            v = v.to(device=device, dtype=torch.float32)
        rows.append(v)
    q = torch.stack(rows)
    if not bool(torch.isfinite(q).all()):
        raise ValidationError("query: expected finite vectors, found NaN or inf")
    return q


def _string_channel(
    union: UnionSnapshot,
    positions: Sequence[int],
    queries: Sequence[Any],
    memories: Sequence[Any],
    weights: Any,
    m: int,
) -> Tensor | None:
    """The exact-identifier channel: each query against its agent's identifier index (cached
    on the agent's snapshot), every query of the batch in one pass
    (``string_scores_segments``); ``None`` when no agent has notes."""
    from soulmem_torch.embedding.identifiers import string_scores_segments
    from soulmem_torch.retrieve.similarity import identifier_columns

    slots: dict[int, int] = {}
    columns: list[Any] = []
    owners: list[int] = []
    for p, mem in zip(positions, memories):
        if mem is None:
            owners.append(-1)
            continue
        slot = slots.get(p)
        if slot is None:
            slot = slots[p] = len(columns)
            columns.append(identifier_columns(union.graphs[p], mem))
        owners.append(slot if columns[slot] is not None else -1)
    if not slots:
        return None
    return string_scores_segments(
        queries, columns, owners, m, weights=weights, device=union.device, cache=union.cache
    )


def _text_terms(
    union: UnionSnapshot,
    positions: Sequence[int],
    queries: Sequence[Any],
    memories: Sequence[Any],
    m: int,
) -> Any:
    """Each query's text-channel terms over its agent's text index (each agent has its own
    vocabulary and statistics, its index cached on its snapshot; new snapshots' indexes built
    in one pass), every agent of the batch laid end to end
    (:func:`~soulmem_torch.retrieve.text.candidate_query_terms`, the layout kept in the
    union's cache)."""
    from soulmem_torch.retrieve.text import candidate_query_terms, text_indexes

    asked = dict.fromkeys(p for p, mem in zip(positions, memories) if mem is not None)
    mem_of = dict(zip(positions, memories))
    built = text_indexes([agent_graph(union, p) for p in asked], [mem_of[p] for p in asked])
    indices: dict[int, Any] = dict(zip(asked, built))
    owners = [p if mem is not None else -1 for p, mem in zip(positions, memories)]  # -1: none
    return candidate_query_terms(
        indices, owners, queries, m, device=union.device, cache=union.cache
    )


def _text_channel(union: UnionSnapshot, queries: Sequence[Any], m: int, terms: Any) -> Tensor:
    """Whole-note BM25 (the retrieve layer's ``text_scores``) of each query against its agent's
    notes, every agent of the batch in one pass: (B, M) float64, zeros for agents without
    notes (``terms``: :func:`_text_terms`)."""
    if terms is None:
        return torch.zeros(len(queries), m, dtype=_F64, device=union.device)
    return terms.bm25(m)


def _similarity(
    union: UnionSnapshot,
    positions: Sequence[int],
    queries: Sequence[Any],
    memories: Sequence[Any],
    embedder: Any,
    idx: Tensor,
    valid: Tensor,
    weights: Any,
) -> Tensor:
    """Stage 1: fused similarity of each query against its agent's notes, (B, M) float32."""
    if all(is_plain_query(q) for q in queries):
        if union.tag_dim is None:
            raise ValidationError("working_memory: plain queries need notes with embeddings")
        q = _plain_vectors(queries, embedder, union.tag_dim, union.device)
        return plain_similarity(union, q, idx, valid)
    batch, embedded = structured_batch(queries, embedder, union.device)
    string = None
    if embedded:  # raw queries: the exact-identifier channel
        string = _string_channel(union, positions, queries, memories, weights, idx.shape[1])
    b, m = idx.shape
    if grouped_is_cheaper(union, b, len(set(positions)), m):
        return grouped_structured_similarity(
            union, batch, positions, m, string=string, weights=weights
        )
    return structured_similarity(union, batch, idx, valid, string=string, weights=weights)


def _association(
    union: UnionSnapshot,
    positions: Sequence[int],
    agents: Tensor,
    weights: Tensor,
    keys: Tensor,
    config: Any,
    *,
    undirected: bool = False,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Stage 3: PPR of every query on its agent's block → ``(scores (B, M) f64, ok (B,),
    undirected scores (B, M) f64 or None)``.

    ``undirected``: the ``graph_undirected`` channel too (always the ``power`` method, as the
    retrieve layer's), run as one stacked iteration with the directed ``power`` rows.

    ``power`` is the exact dense solve for agents of at most ``power_dense_max_nodes`` notes
    (``bank._dense.segment_dense_ppr``, one gather for the batch) and the power iteration on
    the union operator for the others; ``sequential`` (the parity oracle, a loop by
    definition) and ``push`` run per agent of the batch on the agent's own snapshot with the
    retrieve layer's ``run_association``. ``auto`` resolves per agent, on its own size.
    """
    from soulmem_torch.retrieve.config import PprMethod
    from soulmem_torch.retrieve.propagation import resolve_method, run_association

    ok = keys.any(dim=1) & (weights.sum(dim=1) > 0)
    negative = keys & (weights < 0) & ok.unsqueeze(1)
    if bool(negative.any()):  # as the kernel's check on the columns that run
        row, col = (int(v) for v in negative.nonzero()[0])
        raise ValidationError(
            "personalization: expected entries >= 0, found "
            f"{weights[row, col].item()} (a similarity score under a negative "
            f"similarity_threshold) in query {row}"
        )
    row_sizes = union.sizes.index_select(0, agents)
    power_sizes = [
        size
        for size in torch.unique(row_sizes).tolist()
        if resolve_method(config.method, num_nodes=size, device=union.device) is PprMethod.POWER
    ]
    is_power = torch.isin(
        row_sizes, torch.tensor(power_sizes, dtype=row_sizes.dtype).to(union.device)
    )
    # ``power`` is the exact dense solve for small agents (as ``retrieve.propagation.power_ppr``)
    dense = row_sizes <= config.power_dense_max_nodes
    flags = [False, True] if undirected else [False]
    iterate = [ok & is_power & ~dense] + ([ok & ~dense] if undirected else [])
    exact = [ok & dense & is_power] + ([ok & dense] if undirected else [])
    if any(bool(o.any()) for o in iterate):
        outs = segment_power_ppr_channels(
            union, config, agents, weights, keys, iterate, undirected=flags
        )
        solved = segment_dense_ppr(
            union, config, agents, weights, keys, exact, undirected=flags,
            union_transition=union_transition,
        )  # fmt: skip
        for c in range(len(flags)):
            outs[c] = torch.where(exact[c].unsqueeze(1), solved[c], outs[c])
    else:  # every row is exact (or not power): zero elsewhere already
        outs = segment_dense_ppr(
            union, config, agents, weights, keys, exact, undirected=flags,
            union_transition=union_transition,
        )  # fmt: skip
    scores = outs[0]
    both = outs[1] if undirected else None
    other = (ok & ~is_power).nonzero().reshape(-1).tolist()
    if other:
        groups: dict[int, list[int]] = {}
        for r in other:
            groups.setdefault(positions[r], []).append(r)
        for p, rows in groups.items():
            graph = agent_graph(union, p)
            n = int(graph.num_nodes)
            rt = torch.tensor(rows, device=union.device)
            res, _ = run_association(
                graph, weights[rt, :n].T.contiguous(), keys[rt, :n].T.contiguous(), config
            )
            scores[rt, :n] = res.T
    ok = ok & (scores.sum(dim=1) > 0)
    return scores, ok, both


class UnionBackend:
    """The rows of a batch of (agent, query) pairs on the bank's union snapshot
    (:class:`~soulmem_torch.retrieve.stages.PipelineBackend`)."""

    def __init__(
        self,
        union: UnionSnapshot,
        positions: Sequence[int],
        queries: Sequence[Any],
        memories: Sequence[Any],
        *,
        embedder: Any,
        nows: Sequence[Any] | None,
    ) -> None:
        self.union = union
        self.positions = positions
        self.queries = queries
        self.memories = memories
        self.embedder = embedder
        self.nows = nows
        self.agents = torch.tensor(list(positions), dtype=torch.int64, device=union.device)
        self.index, self.valid, self.m = candidates(union, self.agents)
        self.ids = note_ids(union, positions)
        self._ntype: Tensor | None = None
        self._text_terms: Any = None  # the text channel's terms, kept for the evidence

    def similarity(self, weights: Any) -> Tensor:
        return _similarity(
            self.union,
            self.positions,
            self.queries,
            self.memories,
            self.embedder,
            self.index,
            self.valid,
            weights,
        )

    def text(self) -> Tensor | None:
        # an agent built from tensors has no note texts: its text row is 0, and a zero
        # channel adds exactly nothing to the fused reciprocal ranks, so a batch of such
        # agents leaves the channel out
        if all(mem is None for mem in self.memories):
            return None
        self._text_terms = self._query_terms()
        return _text_channel(self.union, self.queries, self.m, self._text_terms)

    def evidence(self) -> Tensor | None:
        """Which candidates have evidence for each question (rows ``0::2``): the text
        channel's terms of the batch (kept from :meth:`text`, or looked up now) over the asked
        agents' text indexes, and the union's block-diagonal links
        (:func:`~soulmem_torch.retrieve.evidence.candidate_evidence`)."""
        from soulmem_torch.retrieve.evidence import candidate_evidence

        union = self.union
        terms = self._text_terms if self._text_terms is not None else self._query_terms()
        if terms is None or any(index is None for index in terms.indices.values()):
            return None  # (an agent's notes unknown: the lists' own filter)
        agents = self.agents[0::2]
        start = union.eptr.index_select(0, agents)
        rows = torch.arange(0, len(self.positions), 2, device=union.device)
        return candidate_evidence(
            terms.rows(rows), self.m, edge_index=union.edge_index, edge_start=start,
            edge_count=union.eptr.index_select(0, agents + 1) - start,
            node_start=union.ptr.index_select(0, agents),
        )  # fmt: skip

    def _query_terms(self) -> Any:
        """:func:`_text_terms` of the batch (``None``: no agent has notes)."""
        if all(mem is None for mem in self.memories):
            return None
        return _text_terms(self.union, self.positions, self.queries, self.memories, self.m)

    def time(self) -> Tensor | None:
        if self.nows is None:
            return None
        from soulmem_torch.retrieve.text import query_strings
        from soulmem_torch.retrieve.when import time_scores

        union, idx, valid = self.union, self.index, self.valid
        times = union.cache.get("create_time_ns")
        if times is None:
            times = union.cache["create_time_ns"] = torch.cat(
                [g.create_time_ns.to(union.device) for g in union.graphs]
                or [torch.zeros(0, dtype=torch.int64, device=union.device)]
            )
        note_t = torch.where(valid, times[idx.clamp(min=0, max=max(len(times) - 1, 0))], 0)
        return time_scores(
            note_t, [" ".join(query_strings(q)) for q in self.queries], list(self.nows), valid=valid
        )

    def association(
        self, weights: Tensor, keys: Tensor, config: Any, *, undirected: bool
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        return _association(
            self.union, self.positions, self.agents, weights, keys, config, undirected=undirected
        )

    def actions(
        self,
        seed_weights: Tensor,
        seeds: Tensor,
        ppr: Tensor,
        selected: Tensor,
        ok: Tensor,
        config: Any,
        *,
        rank: bool,
    ) -> tuple[Tensor, Tensor]:
        """Situation weights (``situation_softmax`` of the retrieve layer, per row, over the
        merged seeds and PPR top-k) → BayesAction on the agents' Proc links
        (:func:`candidate_bayes`)."""
        neg_inf = torch.full_like(ppr, float("-inf"))
        merged = torch.maximum(
            torch.where(seeds, seed_weights, neg_inf), torch.where(selected, ppr, neg_inf)
        )
        soft, kept = situation_softmax(
            merged,
            self.union.node_type[self.index],
            ok.unsqueeze(1) & self.valid,
            config.abstract_source_priority,
            dim=1,
        )
        return candidate_bayes(self.union, self.agents, soft, kept)


@gc_paused()
def run_pipeline(
    union: UnionSnapshot,
    positions: Sequence[int],
    queries: Sequence[Any],
    config: Any,
    *,
    priorities: Sequence[int],
    memories: Sequence[Any],
    embedder: Any,
    weights: Any = None,
    nows: Sequence[Any] | None = None,
    questions: Sequence[bool] | None = None,
) -> list[Any]:
    """The default pipeline (:func:`~soulmem_torch.retrieve.stages.run_stages`) for B
    (agent, query) pairs on the union, with the cyclic garbage collector held off
    (``soulmem_torch._gcpause.gc_paused``: the call builds tens of thousands of short-lived
    result tuples).

    Args:
        union: the bank's union snapshot.
        positions: agent position (in the union) of every query.
        queries: the queries (all structured or all plain).
        config: ``DefaultPipelineConfig``.
        priorities: passed through.
        memories: each query's agent ``WorkingMemory`` (``None`` for tensor-built agents):
            the short-term window and the string channel's notes.
        embedder: embeds texts and structured queries.
        weights: ``BlendWeights``; ``None`` → defaults.
        nows: when each question is asked (aware datetimes or ``None``): the ``time``
            channel.
        questions: ``None``, or the queries are free-text questions' (concept, episode)
            pairs, answered one per question, each flag its ``only_matching``
            (:func:`~soulmem_torch.retrieve.stages.run_stages`).
    """
    from soulmem_torch.retrieve.similarity import effective_weights

    backend = UnionBackend(union, positions, queries, memories, embedder=embedder, nows=nows)
    return run_stages(
        backend,
        config,
        memories=memories,
        priorities=priorities,
        weights=effective_weights(weights, config.similarity),
        questions=questions,
    )
