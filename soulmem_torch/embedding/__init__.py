"""Embeddings (docs/spec.md §3): the ``Embedder`` protocol, the offline ``HashingEmbedder``, the field
layout, and note / query embedding in batched calls.

Typical use::

    from soulmem_torch.embedding import HashingEmbedder, embed_notes, embed_queries, string_scores

    embedder = HashingEmbedder()
    embeddings = embed_notes(notes, embedder)            # one MemoryEmbedding per note
    batch = embed_queries(queries, embedder)              # padded (B, U, Q, D) tensors
    scores = batch.score(graph, string_scores=string_scores(queries, notes))   # (B, N)

The layout and the light modules are imported eagerly; the note / query / string-channel
helpers (which import the data model and the kernels) are loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from soulmem_torch.embedding.embedder import (
    DEFAULT_CHUNK_CHARS,
    Embedder,
    EmbedderUnavailableError,
    chunk_text,
    embedder_dim,
    run_embedder,
)
from soulmem_torch.embedding.fields import (
    FIELD_INDEX,
    FIELD_NAMES,
    QUERY_FIELD_INDEX,
    QUERY_FIELD_NAMES,
    QUERY_SEMANTIC,
    QUERY_SITUATION,
    EmbeddedMemoryNote,
    MemoryEmbedding,
    compact_to_dense,
    dense_to_compact,
    stack_compact_field_embeddings,
    stack_field_embeddings,
    stack_plain_embeddings,
)
from soulmem_torch.embedding.hashing import HashingEmbedder

if TYPE_CHECKING:
    from soulmem_torch.embedding.identifiers import (
        build_identifier_index,
        query_identifiers,
        string_scores,
    )
    from soulmem_torch.embedding.note_embedding import (
        embed_note_groups,
        embed_notes,
        embed_notes_plain,
        embed_texts,
        note_plain_text,
    )
    from soulmem_torch.embedding.query_embedding import (
        QueryEmbeddingBatch,
        as_query,
        embed_queries,
    )
    from soulmem_torch.embedding.sentence_transformers import (
        BGE_ZH_QUERY_INSTRUCTION,
        SentenceTransformerEmbedder,
    )

__all__ = [
    "BGE_ZH_QUERY_INSTRUCTION",
    "DEFAULT_CHUNK_CHARS",
    "FIELD_INDEX",
    "FIELD_NAMES",
    "QUERY_FIELD_INDEX",
    "QUERY_FIELD_NAMES",
    "QUERY_SEMANTIC",
    "QUERY_SITUATION",
    "EmbeddedMemoryNote",
    "Embedder",
    "EmbedderUnavailableError",
    "HashingEmbedder",
    "MemoryEmbedding",
    "QueryEmbeddingBatch",
    "SentenceTransformerEmbedder",
    "as_query",
    "build_identifier_index",
    "chunk_text",
    "embed_note_groups",
    "embed_notes",
    "embed_notes_plain",
    "embed_queries",
    "embed_texts",
    "embedder_dim",
    "note_plain_text",
    "query_identifiers",
    "run_embedder",
    "compact_to_dense",
    "dense_to_compact",
    "stack_compact_field_embeddings",
    "stack_field_embeddings",
    "stack_plain_embeddings",
    "string_scores",
]

_LAZY = {
    "build_identifier_index": "identifiers",
    "query_identifiers": "identifiers",
    "string_scores": "identifiers",
    "embed_note_groups": "note_embedding",
    "embed_notes": "note_embedding",
    "embed_notes_plain": "note_embedding",
    "embed_texts": "note_embedding",
    "note_plain_text": "note_embedding",
    "QueryEmbeddingBatch": "query_embedding",
    "as_query": "query_embedding",
    "embed_queries": "query_embedding",
    "BGE_ZH_QUERY_INSTRUCTION": "sentence_transformers",
    "SentenceTransformerEmbedder": "sentence_transformers",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
