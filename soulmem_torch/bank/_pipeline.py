"""The default pipeline over a :class:`~soulmem_torch.bank._union.UnionSnapshot`, as stages.

Every stage works on per-query candidate rows ``(B, M)`` (query ``b``'s agent's notes, padded
to the largest agent of the batch, ``valid`` marking the real ones): short-term window →
similarity (structured, string channel, or plain cosine) → seeds (relative cut for
``fusion="rank"``, threshold + top-k for ``"max"``) → association (PPR on the union operator)
→ situation weights → BayesAction → the memory list (reciprocal-rank fusion of the configured
channels — seeds / similarity, whole-note text, graph, graph both ways (PPR on the union's
undirected operator) — or the original's max merge). Each stage mirrors the
retrieve layer (``retrieve/pipeline.py``, ``assoc_with_action.py``, ``propagation.py``,
``functional/fusion.py``) on one agent's graph; a new channel drops in as one more ``(B, M)``
tensor masked by ``valid``. Every ``DefaultPipelineConfig`` field is implemented here
(tests/bank/test_bank.py changes each one and compares with a ``SoulMem`` per agent).
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import Any

import torch
from torch import Tensor

from soulmem_torch._gcpause import gc_paused
from soulmem_torch.bank._bayes import candidate_bayes
from soulmem_torch.bank._dense import segment_dense_ppr
from soulmem_torch.bank._operators import segment_power_ppr_channels
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
from soulmem_torch.functional.codes import NODE_ABSTRACT, NODE_SPECIFIC
from soulmem_torch.functional.fusion import ppr_start, rank_fusion, relative_seeds
from soulmem_torch.functional.topk import stable_topk
from soulmem_torch.retrieve.pipeline import channel_weights
from soulmem_torch.retrieve.similarity import is_plain_query, structured_batch

__all__ = ["run_pipeline"]

_F64 = torch.float64


def _topk(scores: Tensor, mask: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Stable top-k per row: ``(selected (B, M), values, index, valid)``."""
    values, index, valid = stable_topk(scores, int(k), mask=mask)
    selected = torch.zeros_like(mask)
    selected.scatter_(1, index, valid)
    return selected, values, index, valid


def _lists(
    ids: list[Any], idx: Tensor, *blocks: tuple[Tensor, Tensor, Tensor]
) -> tuple[list[tuple[Any, float]], list[int]]:
    """The ``(id, score)`` entries of several stable top-k's, each block ``(values, index,
    valid)`` of shape ``(B, k_i)``: one flat list — row by row, within a row block by block, each
    block's valid entries in order — and the end of every (row, block) run in it (``B ×
    len(blocks)`` ends, row-major), so a row's list of a block is one slice of it.

    ``ids``: every note's id by union node index (:func:`note_ids`); ``idx``: the candidate rows
    (local index → union node). One gather, one boolean mask and one ``tolist`` per tensor for
    the whole batch. Scores become Python floats through float64, exact for float32 values
    (the same floats as their own ``tolist``)."""
    values = torch.cat([v.to(_F64) for v, _, _ in blocks], dim=1)
    index = idx.gather(1, torch.cat([i for _, i, _ in blocks], dim=1))
    ok = torch.cat([k for _, _, k in blocks], dim=1)
    ends = torch.stack([k.sum(dim=1) for _, _, k in blocks], dim=1).reshape(-1).cumsum(0)
    nodes = index[ok].tolist()
    if len(nodes) > 1:
        found = itemgetter(*nodes)(ids)
    else:
        found = [ids[n] for n in nodes]
    return list(zip(found, values[ok].tolist())), ends.tolist()


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
    return string_scores_segments(queries, columns, owners, m, weights=weights, device=union.device)


def _text_channel(
    union: UnionSnapshot,
    positions: Sequence[int],
    queries: Sequence[Any],
    memories: Sequence[Any],
    m: int,
) -> Tensor:
    """Whole-note BM25 (the retrieve layer's ``text_scores``) of each query against its agent's
    notes, every agent of the batch in one pass (each agent has its own vocabulary and
    statistics, its index cached on its snapshot): (B, M) float64, zeros for agents without
    notes."""
    from soulmem_torch.retrieve.text import candidate_text_scores, text_indexes

    asked = dict.fromkeys(p for p, mem in zip(positions, memories) if mem is not None)
    mem_of = dict(zip(positions, memories))
    # the indexes of new snapshots built in one pass, each cached on its snapshot
    built = text_indexes([agent_graph(union, p) for p in asked], [mem_of[p] for p in asked])
    indices: dict[int, Any] = dict(zip(asked, built))
    owners = [p if mem is not None else -1 for p, mem in zip(positions, memories)]  # -1: none
    return candidate_text_scores(indices, owners, queries, m, device=union.device)


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
        solved = segment_dense_ppr(union, config, agents, weights, keys, exact, undirected=flags)
        for c in range(len(flags)):
            outs[c] = torch.where(exact[c].unsqueeze(1), solved[c], outs[c])
    else:  # every row is exact (or not power): zero elsewhere already
        outs = segment_dense_ppr(union, config, agents, weights, keys, exact, undirected=flags)
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
) -> list[Any]:
    """ShortOnly → Similarity → AssociateWithAction → merge for B (agent, query) pairs, with
    the cyclic garbage collector held off (``soulmem_torch._gcpause.gc_paused``: the call builds
    tens of thousands of short-lived result tuples).

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
    """
    from soulmem_torch.retrieve import DefaultPipelineResult
    from soulmem_torch.retrieve.short_only import RetrShortOnly
    from soulmem_torch.retrieve.similarity import effective_weights

    device = union.device
    agents = torch.tensor(list(positions), dtype=torch.int64, device=device)
    idx, valid, m = candidates(union, agents)

    # stage 0: the short-term window of each agent
    short_cfg = config.short_mem_with_history
    windows: dict[int, Any] = {}  # once per agent, not per query
    for mem in memories:
        if mem is not None and id(mem) not in windows:
            windows[id(mem)] = RetrShortOnly().retrieve(short_cfg.into_request(mem))
    short = [windows[id(mem)] if mem is not None else ([], "") for mem in memories]

    # stage 1: similarity on candidate rows
    sim_cfg = config.similarity
    weights = effective_weights(weights, sim_cfg)
    sim = _similarity(union, positions, queries, memories, embedder, idx, valid, weights)
    keep = torch.isfinite(sim) & (sim >= sim_cfg.similarity_threshold) & valid
    sim_kept = torch.where(keep, sim, torch.zeros_like(sim))

    # stage 2: seeds (top-k, or the relative cut of the rank fusion)
    text = None
    if (
        config.fusion == "rank"
        and "text" in config.channels
        and any(mem is not None for mem in memories)
    ):
        # (an agent built from tensors has no note texts: its text row is 0, and a zero
        # channel adds exactly nothing to the fused reciprocal ranks, so a batch of such
        # agents leaves the channel out)
        text = _text_channel(union, positions, queries, memories, m)
    fused_seeds = config.fusion == "rank" and config.seed_source == "fused" and text is not None
    if config.fusion == "rank":
        first_stage = (
            rank_fusion([sim_kept, text], k=config.rank_constant, mask=valid)
            if fused_seeds
            else sim_kept
        )
        chosen = relative_seeds(
            first_stage,
            ratio=config.seed_ratio,
            max_seeds=sim_cfg.max_results,
            threshold=0.0 if fused_seeds else sim_cfg.similarity_threshold,
            mask=valid,
        )
    else:
        chosen = _topk(sim, keep, sim_cfg.max_results)[0]
    _, s_values, s_index, s_valid = _topk(sim, chosen, sim_cfg.max_results)
    zero = torch.zeros((), dtype=_F64, device=device)
    seed_w = torch.where(chosen, first_stage.to(_F64) if fused_seeds else sim.to(_F64), zero)

    # stage 3: association (PPR) and its top-k
    awa = config.assoc_with_action
    assoc = awa.association
    undirected = config.fusion == "rank" and "graph_undirected" in config.channels
    source = (seed_w, chosen)
    if config.fusion == "rank":
        source = ppr_start(config.personalization, chosen, seed_w, first_stage, text, mask=valid)
    ppr, ok, ppr_both = _association(
        union, positions, agents, *source, assoc, undirected=undirected
    )
    present = ok.unsqueeze(1) & valid
    ppr_selected = _topk(ppr, present, assoc.top_k)[0]

    # stage 4: situation weights (max-subtracted softmax) and BayesAction
    neg_inf = torch.full_like(ppr, float("-inf"))
    if config.fusion == "rank":
        # seeds score > 0 (relative_seeds) and PPR >= 0: the max merge, with 0 instead of
        # -inf off both sets — the same kept notes and weights below (merged > 0 decides)
        merged = torch.maximum(seed_w, ppr * ppr_selected)
    else:
        merged = torch.maximum(
            torch.where(chosen, seed_w, neg_inf), torch.where(ppr_selected, ppr, neg_inf)
        )
    ntype = union.node_type[idx]
    situation = (ntype == NODE_SPECIFIC) | (ntype == NODE_ABSTRACT)
    kept = situation & (merged > 0) & ok.unsqueeze(1) & valid
    w = torch.where(ntype == NODE_ABSTRACT, merged * awa.abstract_source_priority, merged)
    w = torch.where(kept, w, neg_inf)
    row_max = w.max(dim=1, keepdim=True).values if m else w[:, :1]
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    e = torch.exp(w - row_max)  # exactly 0 where not kept (w = -inf there, row_max finite)
    total = e.sum(dim=1, keepdim=True)
    soft = e / torch.where(total > 0, total, 1.0)  # a row without kept notes stays 0
    act_scores, act_cand = candidate_bayes(union, agents, soft, kept)
    _, a_values, a_index, a_valid = _topk(act_scores, act_cand, awa.action_top_k)

    # stage 5: one memory list — reciprocal-rank fusion of the channels, or the max merge
    if config.fusion == "rank":
        channels = {
            "similarity": sim_kept,
            "seeds": sim_kept * chosen,  # finite: 0 off the seeds
            "graph": ppr,
        }
        if text is not None:
            channels["text"] = text
        if "time" in config.channels and nows is not None:
            from soulmem_torch.retrieve.text import query_strings
            from soulmem_torch.retrieve.when import time_scores

            times = union.cache.get("create_time_ns")
            if times is None:
                times = union.cache["create_time_ns"] = torch.cat(
                    [g.create_time_ns.to(device) for g in union.graphs]
                    or [torch.zeros(0, dtype=torch.int64, device=device)]
                )
            note_t = torch.where(valid, times[idx.clamp(min=0, max=max(len(times) - 1, 0))], 0)
            channels["time"] = time_scores(
                note_t, [" ".join(query_strings(q)) for q in queries], list(nows), valid=valid
            )
        if ppr_both is not None:  # computed with the directed PPR in stage 3
            channels["graph_undirected"] = ppr_both
        names = [c for c in config.channels if c in channels]
        used = [channels[c] for c in names]
        if used:
            weights = channel_weights(
                config.model_copy(update={"channels": tuple(names)}),
                sim_kept,
                channels.get("text"),
                valid,
            )
            fused = rank_fusion(used, k=config.rank_constant, mask=valid, weights=weights)
        else:  # only the text channel, and no agent of the batch has texts
            fused = torch.zeros(len(queries), m, dtype=_F64, device=device)
        # a note is in the list when some channel scored it (finite, > 0): exactly where the
        # fused reciprocal ranks (0 for unscored or masked entries) are positive
        _, m_values, m_index, m_valid = _topk(fused, fused > 0, config.merge_top_k)
    else:
        _, m_values, m_index, m_valid = _topk(merged, chosen | ppr_selected, config.merge_top_k)

    # the three lists of every row: slices of one flat list of (id, score) pairs
    pairs, ends = _lists(
        note_ids(union, positions),
        idx,
        (s_values.to(torch.float32), s_index, s_valid),  # the seeds keep float32 scores
        (a_values, a_index, a_valid),
        (m_values, m_index, m_valid),
    )
    starts = [0, *ends[2::3]]
    return [
        DefaultPipelineResult(
            association=pairs[c:d],
            action=pairs[b:c],
            short_history=list(history),
            short_mem=summary,
            priority=priority,
            seeds=pairs[a:b],
        )
        for a, b, c, d, (history, summary), priority in zip(
            starts, ends[0::3], ends[1::3], ends[2::3], short, priorities
        )
    ]
