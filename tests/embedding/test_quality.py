"""Retrieval quality of the default offline embedder on the original's ``congyu`` suite.

Per sub-query, notes are ranked by the fused similarity (SPEC §4) with the suite's threshold and
``max_results``; MRR is 1/rank of the first expected id within the largest ``k``. The acceptance
bar for the default pipeline is 0.85 (a plain character-bigram TF-IDF gets about 0.76 here).
"""

from __future__ import annotations

import json

import torch

from soulmem_torch.embedding import (
    HashingEmbedder,
    embed_notes,
    embed_queries,
    stack_field_embeddings,
    string_scores,
)
from soulmem_torch.functional.codes import (
    NODE_ABSTRACT,
    NODE_PROCEDURE,
    NODE_SEMANTIC,
    NODE_SPECIFIC,
)
from soulmem_torch.functional.similarity import fused_similarity, topk
from soulmem_torch.model.query import MemoryRetrieveQuery
from soulmem_torch.model.soul_tune import load_soul_tune_graph
from tests.conftest import fixture_path

CODES = {
    "Semantic": NODE_SEMANTIC,
    "SpecificSituation": NODE_SPECIFIC,
    "AbstractSituation": NODE_ABSTRACT,
    "Procedure": NODE_PROCEDURE,
}


def test_congyu_similarity_mrr() -> None:
    graph = load_soul_tune_graph(fixture_path("soul_tune", "congyu", "graph.json"))
    suite = json.loads(fixture_path("soul_tune", "congyu", "question.json").read_text("utf-8"))
    cfg = suite["config"]
    max_k = max(cfg["test_k_values"])
    notes, readable = graph.notes, graph.readable_ids
    queries, expected = [], []
    for case in suite["test_cases"]:
        for exp in case["expected_per_query"]:
            sub = case["sub_queries"][exp["q"]]
            queries.append(
                MemoryRetrieveQuery.model_validate({"tag": sub["tag"], "variant": sub["variant"]})
            )
            expected.append(set(exp["ranking"]))

    embedder = HashingEmbedder()
    tensors = stack_field_embeddings(embed_notes(notes, embedder))
    node_type = torch.tensor([CODES[n.kind] for n in notes])
    batch = embed_queries(queries, embedder)
    scores = fused_similarity(
        batch.tag, batch.kind, batch.field, batch.field_mask, batch.unit_mask,
        *tensors, node_type, string_scores=string_scores(queries, notes),
    )  # fmt: skip
    scores = torch.where(scores >= cfg["similarity_threshold"], scores, float("-inf"))
    _, order = topk(scores, cfg["max_results"])
    rr = []
    for row, want in zip(order.tolist(), expected):
        ranked = [readable[notes[i].id] for i in row]
        hits = [r for r, rid in enumerate(ranked[:max_k]) if rid in want]
        rr.append(1.0 / (hits[0] + 1) if hits else 0.0)
    mrr = sum(rr) / len(rr)
    assert len(rr) == 64
    assert mrr >= 0.85, f"per-sub-query MRR {mrr:.3f} < 0.85"
