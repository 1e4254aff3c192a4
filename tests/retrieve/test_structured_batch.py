"""``retrieve.similarity.structured_batch``: the one place where a batch of structured queries
becomes a ``QueryEmbeddingBatch`` (the retrieve layer and the ``MemoryBank`` both call it)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from soulmem_torch.embedding import HashingEmbedder
from soulmem_torch.embedding.query_embedding import embed_queries
from soulmem_torch.errors import ValidationError
from soulmem_torch.retrieve.similarity import structured_batch
from tests.embedding.helpers import random_query


def _queries(n: int) -> list:
    rng = np.random.default_rng(3)
    return [random_query(rng) for _ in range(n)]


def test_raw_queries_are_embedded_and_flagged() -> None:
    embedder = HashingEmbedder(dim=16)
    queries = _queries(3)
    batch, embedded = structured_batch(queries, embedder, torch.device("cpu"))
    assert embedded
    want = embed_queries(queries, embedder)
    assert torch.equal(batch.tag, want.tag) and torch.equal(batch.field, want.field)


def test_embedded_batches_are_concatenated_as_given() -> None:
    embedder = HashingEmbedder(dim=16)
    parts = [embed_queries([q], embedder) for q in _queries(3)]
    batch, embedded = structured_batch(parts, None, torch.device("cpu"))
    assert not embedded and batch.tag.shape[0] == 3
    one, embedded = structured_batch(parts[:1], None, torch.device("cpu"))
    assert one is parts[0] and not embedded


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda q, b: [q[0], torch.zeros(16)], "all structured queries or all plain"),
        (lambda q, b: [q[0], "text"], "all structured queries or all plain"),
        (lambda q, b: [b, q[1]], "all embedded"),
        (lambda q, b: [q[0], q[1]], "embedder"),
    ],
)
def test_mixed_or_unembeddable_batches_are_refused(make, match: str) -> None:
    queries = _queries(2)
    embedded = embed_queries(queries[:1], HashingEmbedder(dim=16))
    with pytest.raises(ValidationError, match=match):
        structured_batch(make(queries, embedded), None, torch.device("cpu"))
