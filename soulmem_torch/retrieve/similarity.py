"""``Similarity``: fused structured similarity of a query against every note (docs/spec.md §4, §7)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from soulmem_torch.errors import ValidationError
from soulmem_torch.functional.similarity import BlendWeights, cosine_scores
from soulmem_torch.model import MemoryId
from soulmem_torch.retrieve.batches import run_grouped
from soulmem_torch.retrieve.columns import topk_lists
from soulmem_torch.retrieve.config import SimilarityConfig
from soulmem_torch.retrieve.requests import SimilarityRequest

__all__ = [
    "RetrSimilarity",
    "SimilarityRequest",
    "effective_weights",
    "similarity_scores",
    "threshold_mask",
]

if TYPE_CHECKING:
    from soulmem_torch.graph import MemoryGraph
    from soulmem_torch.retrieve._types import MemorySource


def _notes_of(memory: MemorySource) -> list[Any] | None:
    cluster = getattr(memory, "cluster", memory)
    notes = getattr(cluster, "notes", None)
    return list(notes()) if callable(notes) else None


def identifier_index(graph: MemoryGraph, memory: MemorySource) -> Any:
    """The exact-identifier index of the notes, built once per snapshot (None without notes;
    that is not cached, so a later call that knows the notes still builds the index)."""
    key = "identifier_index"
    if key not in graph.cache:
        notes = _notes_of(memory)
        if notes is None or len(notes) != int(graph.num_nodes):
            return None
        from soulmem_torch.embedding.identifiers import build_identifier_index

        graph.cache[key] = build_identifier_index(notes)
    return graph.cache[key]


def identifier_columns(graph: MemoryGraph, memory: MemorySource) -> Any:
    """:func:`identifier_index` as flat arrays (``IdentifierColumns``), cached beside it
    (None without notes)."""
    key = "identifier_columns"
    if key not in graph.cache:
        index = identifier_index(graph, memory)
        if index is None:
            return None
        from soulmem_torch.functional.string_sim import IdentifierColumns

        graph.cache[key] = IdentifierColumns.of(index)
    return graph.cache[key]


def is_plain_query(query: Any) -> bool:
    """A plain query (a ``(D,)`` tensor or a text) rather than a structured one."""
    return isinstance(query, (Tensor, str))


def similarity_scores(
    graph: MemoryGraph,
    memory: MemorySource,
    queries: Sequence[Any],
    *,
    embedder: Any = None,
    weights: BlendWeights | None = None,
) -> Tensor:
    """Scores of B queries (all structured, or all plain) against every note: (B, N) float32."""
    if not queries:
        return torch.zeros(0, int(graph.num_nodes), device=graph.device)
    device = graph.device
    if all(is_plain_query(q) for q in queries):
        return _plain_scores(graph, queries, embedder)
    batch, embedded = structured_batch(queries, embedder, device)
    string = None
    if embedded:  # raw queries: their identifiers may match notes exactly
        index = identifier_index(graph, memory)
        if index is not None:
            from soulmem_torch.embedding.identifiers import string_scores

            string = string_scores(list(queries), index, weights=weights, device=device)
    return batch.score(graph, weights=weights, string_scores=string)


def structured_batch(queries: Sequence[Any], embedder: Any, device: Any) -> tuple[Any, bool]:
    """One ``QueryEmbeddingBatch`` for B structured queries: the given batches concatenated,
    or the raw queries embedded with ``embedder`` (then the second value is True: the caller
    adds their string channel). Shared by the retrieve layer and the ``MemoryBank``.

    Raises:
        ValidationError: plain (tensor / text) and structured queries mixed, embedded and
            unembedded ones mixed, or raw queries without an embedder.
    """
    from soulmem_torch.embedding.query_embedding import QueryEmbeddingBatch, embed_queries

    if any(is_plain_query(q) for q in queries):
        raise ValidationError(
            "query: a batch must be all structured queries or all plain (tensor / text) queries"
        )
    if all(isinstance(q, QueryEmbeddingBatch) for q in queries):
        return (queries[0] if len(queries) == 1 else _concat(queries)), False
    if any(isinstance(q, QueryEmbeddingBatch) for q in queries):
        raise ValidationError(
            "query: a batch must be all embedded (QueryEmbeddingBatch) or all unembedded"
        )
    if embedder is None:
        raise ValidationError(
            "embedder: structured queries need an embedder (or pass a QueryEmbeddingBatch)"
        )
    return embed_queries(list(queries), embedder, device=device), True


def _concat(batches: Sequence[Any]) -> Any:
    from soulmem_torch.embedding.query_embedding import QueryEmbeddingBatch

    units = max(b.num_units for b in batches)

    def pad(t: Tensor) -> Tensor:
        if t.dim() < 2 or t.shape[1] == units:
            return t
        shape = list(t.shape)
        shape[1] = units - t.shape[1]
        return torch.cat([t, t.new_zeros(shape)], dim=1)

    return QueryEmbeddingBatch(
        tag=torch.cat([b.tag for b in batches]),
        kind=torch.cat([b.kind for b in batches]),
        field=torch.cat([pad(b.field) for b in batches]),
        field_mask=torch.cat([pad(b.field_mask) for b in batches]),
        unit_mask=torch.cat([pad(b.unit_mask) for b in batches]),
    )


def _plain_vectors(graph: MemoryGraph) -> Tensor | None:
    """The notes' plain vectors ``(N, D)``: the snapshot's ``tag_emb``; when it holds them
    sparse (docs/spec.md §3, "compact raw vectors") one dense copy, made on the first plain
    query and cached on the snapshot (the plain cosine's dense kernel, the same bits)."""
    table = getattr(graph, "tag_table", None)
    if table is None or isinstance(table, Tensor):
        return getattr(graph, "tag_emb", None) if table is None else table
    cache = graph.cache
    dense = cache.get("plain_tag_dense")
    if dense is None or dense[0] is not table:
        dense = cache["plain_tag_dense"] = (table, table.to_dense())
    return dense[1]  # type: ignore[no-any-return]


def _plain_scores(graph: MemoryGraph, queries: Sequence[Any], embedder: Any) -> Tensor:
    x = _plain_vectors(graph)
    if x is None:
        raise ValidationError("working_memory: plain queries need notes with embeddings")
    texts = [q for q in queries if isinstance(q, str)]
    vectors: dict[int, Tensor] = {}
    if texts:
        if embedder is None:
            raise ValidationError("embedder: text queries need an embedder")
        from soulmem_torch.embedding.embedder import run_embedder

        embedded = run_embedder(embedder, texts)
        it = iter(embedded)
        for i, q in enumerate(queries):
            if isinstance(q, str):
                vectors[i] = next(it)
    rows = []
    for i, q in enumerate(queries):
        v = vectors.get(i, q)
        if v.dim() != 1 or v.shape[0] != x.shape[1]:
            raise ValidationError(
                f"query[{i}]: expected a vector of width {x.shape[1]}, found {tuple(v.shape)}"
            )
        rows.append(v.to(device=x.device, dtype=x.dtype))
    q = torch.stack(rows)
    if not bool(torch.isfinite(q).all()):
        raise ValidationError("query: expected finite vectors, found NaN or inf")
    scores = cosine_scores(q, x)
    mask = getattr(graph, "tag_mask", None)
    return scores if mask is None else scores * mask.to(scores.dtype)


def effective_weights(
    weights: BlendWeights | None, config: SimilarityConfig
) -> BlendWeights | None:
    """``weights`` with the config's ``situation_units`` when it sets one (else unchanged)."""
    if config.situation_units is None:
        return weights
    base = weights if weights is not None else BlendWeights()
    if base.situation_units == config.situation_units:
        return base
    return base.model_copy(update={"situation_units": config.situation_units})


def threshold_mask(scores: Tensor, threshold: float) -> Tensor:
    """Finite scores at or above the floor (the docs/spec.md filter)."""
    return torch.isfinite(scores) & (scores >= threshold)


class RetrSimilarity:
    """``RetrSimilarity().retrieve(request) -> [(MemoryId, f32)]``.

    Every note is scored, non-finite scores and scores below ``similarity_threshold`` are dropped
    (a floor, not a rank cut), the rest sorted descending (ties keep note order) and cut to
    ``max_results``.
    """

    def retrieve(self, request: SimilarityRequest) -> list[tuple[MemoryId, float]]:
        """One request: ``[(MemoryId, float32 score)]``, best first, at most ``max_results``,
        none below ``similarity_threshold`` (docs/spec.md §4). A batch of one through
        :meth:`retrieve_batch` (the same code path)."""
        return self.retrieve_batch([request])[0]

    def retrieve_batch(
        self, requests: Sequence[SimilarityRequest]
    ) -> list[list[tuple[MemoryId, float]]]:
        """Many requests at once: those on the same memory, device and config are scored
        together by batched matmuls; one result list per request, in request order."""
        resolved = [(r, r.graph()) for r in requests]

        def key(rg: tuple[SimilarityRequest, Any]) -> Any:
            r, g = rg
            return (id(g), r.config, id(r.embedder), r.weights, is_plain_query(r.query))

        def run(group: list[tuple[SimilarityRequest, Any]]) -> list[Any]:
            first, graph = group[0]
            scores = similarity_scores(
                graph,
                first.working_memory,
                [r.query for r, _ in group],
                embedder=first.embedder,
                weights=effective_weights(first.weights, first.config),
            )
            keep = threshold_mask(scores, first.config.similarity_threshold)
            return topk_lists(graph, scores.T, keep.T, first.config.max_results, as_float32=True)

        return run_grouped(resolved, key=key, run=run)
