"""Query models (serde JSON shape, the original's suite file) and batched query embedding."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from soulmem_torch.embedding import (
    QUERY_FIELD_INDEX,
    QUERY_SEMANTIC,
    QUERY_SITUATION,
    embed_queries,
)
from soulmem_torch.errors import ValidationError
from soulmem_torch.model.query import (
    MemoryRetrieveQuery,
    PrioritizedMemoryRetrieveQuery,
    SemanticQuery,
    SituationQuery,
    SituationQueryUnit,
)
from tests.conftest import fixture_path
from tests.embedding.helpers import FakeEmbedder, random_query


def _strip_nulls(value):
    if isinstance(value, dict):
        return {k: _strip_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_nulls(v) for v in value]
    return value


def test_suite_queries_parse_and_round_trip() -> None:
    suite = json.loads(fixture_path("soul_tune", "congyu", "question.json").read_text("utf-8"))
    count = 0
    for case in suite["test_cases"]:
        for sub in case["sub_queries"]:
            raw = {"tag": sub["tag"], "variant": sub["variant"]}
            q = MemoryRetrieveQuery.model_validate(raw)
            assert q.kind in ("Semantic", "Situation")
            back = json.loads(q.to_json())
            assert _strip_nulls(back) == _strip_nulls(raw)
            assert MemoryRetrieveQuery.from_json(q.to_json()) == q
            count += 1
    assert count >= 60


def test_serde_shape_details() -> None:
    q = MemoryRetrieveQuery.model_validate(
        {
            "tag": [],
            "variant": {"Situation": [{
                "narrative": "n",
                "location": [{"name": "神社", "extra": 1}],
                "time_span": [{"start": "2024-01-01T00:00:00Z", "end": None}],
                "unknown_key": True,
            }]},
        }
    )  # fmt: skip
    assert isinstance(q.variant, SituationQuery)
    unit = q.units[0]
    assert isinstance(unit, SituationQueryUnit)
    assert unit.location[0].coordinates is None and unit.participants is None
    assert unit.time_span[0].start.year == 2024
    assert q.to_json() == (
        '{"tag":[],"variant":{"Situation":[{"narrative":"n","location":[{"name":"神社",'
        '"coordinates":null}],"participants":null,"time_span":[{"start":"2024-01-01T00:00:00Z",'
        '"end":null}],"environment":null,"event":null}]}}'
    )
    sem = MemoryRetrieveQuery.semantic([{"concept_identifier": "x"}], tag=["t"])
    assert isinstance(sem.variant, SemanticQuery) and sem.kind == "Semantic"
    assert (
        sem.to_json()
        == '{"tag":["t"],"variant":{"Semantic":[{"concept_identifier":"x","description":null}]}}'
    )
    p = PrioritizedMemoryRetrieveQuery(priority=3, query=sem)
    assert PrioritizedMemoryRetrieveQuery.model_validate_json(p.model_dump_json()) == p
    for bad in (
        {"tag": [], "variant": {"Other": []}},
        {"tag": [], "variant": {"Semantic": [], "Situation": []}},
        {"variant": {"Semantic": []}},
        {"tag": [], "variant": {"Situation": [{"event": [{"initiator": "x"}]}]}},
        {"tag": [], "variant": {"Situation": [{"time_span": [{"start": "2024-01-01T00:00:00"}]}]}},
    ):
        with pytest.raises(ValueError):
            MemoryRetrieveQuery.model_validate(bad)
    with pytest.raises(ValueError):
        PrioritizedMemoryRetrieveQuery(priority=-1, query=sem)


def _v(e: FakeEmbedder, text: str) -> np.ndarray:
    return e.query_vector(text).astype(np.float32).astype(np.float64)


def test_pooling_masks_and_query_side() -> None:
    e = FakeEmbedder(dim=4, query_shift=0.5)
    queries = [
        MemoryRetrieveQuery.situation(
            [
                {
                    "narrative": "夜袭",
                    "location": [{"name": "a", "coordinates": "c"}, {"name": "b"}],
                    "participants": [{"name": "p"}, {"role": "r"}, {}],
                    "environment": {"tone": "t"},
                    "event": [{"action": "x", "target": "y"}, {"action": "z"}],
                },
                {"participants": [], "location": [], "event": []},
            ],
            tag=["t1", "t2"],
        ),
        MemoryRetrieveQuery.semantic([{"description": "d"}]),
        MemoryRetrieveQuery.semantic([]),
    ]
    batch = embed_queries(queries, e)
    assert batch.field.shape == (3, 2, len(QUERY_FIELD_INDEX), 4)
    assert batch.kind.tolist() == [QUERY_SITUATION, QUERY_SEMANTIC, QUERY_SEMANTIC]
    assert batch.unit_mask.tolist() == [[True, True], [True, False], [False, False]]
    assert e.calls == [] and e.query_calls  # only the query side was used

    def field(b: int, u: int, name: str) -> np.ndarray:
        return batch.field[b, u, QUERY_FIELD_INDEX[name]].numpy()

    def present(b: int, u: int) -> set[str]:
        return {n for n, i in QUERY_FIELD_INDEX.items() if batch.field_mask[b, u, i]}

    assert present(0, 0) == {
        "narrative", "location_name", "location_coordinates", "participant_name",
        "participant_role", "environment_tone", "event_action", "event_target",
    }  # fmt: skip
    assert present(0, 1) == set()  # empty lists = no part
    assert present(1, 0) == {"description"}
    np.testing.assert_allclose(
        field(0, 0, "location_name"), (_v(e, "a") + _v(e, "b")) / 2, atol=1e-6
    )
    np.testing.assert_allclose(field(0, 0, "location_coordinates"), _v(e, "c"), atol=1e-6)
    np.testing.assert_allclose(field(0, 0, "participant_name"), _v(e, "p"), atol=1e-6)
    np.testing.assert_allclose(
        field(0, 0, "event_action"), (_v(e, "x") + _v(e, "z")) / 2, atol=1e-6
    )
    np.testing.assert_allclose(field(0, 0, "event_target"), _v(e, "y"), atol=1e-6)
    np.testing.assert_allclose(batch.tag[0].numpy(), (_v(e, "t1") + _v(e, "t2")) / 2, atol=1e-6)
    assert (batch.tag[1] == 0).all()  # no tags -> zero vector
    assert (batch.field[~batch.field_mask] == 0).all()


def test_batching_dedup_select_and_to(device: torch.device) -> None:
    rng = np.random.default_rng(0)
    queries = [random_query(rng) for _ in range(20)]
    e = FakeEmbedder(dim=3)
    batch = embed_queries([*queries, *queries], e, batch_size=5, device=device)
    flat = [t for call in e.calls for t in call]
    assert len(flat) == len(set(flat)) and all(len(c) <= 5 for c in e.calls)
    assert batch.device.type == device.type and batch.num_queries == 40 and batch.dim == 3
    half = batch.select(range(20))
    other = batch.select(torch.arange(20, 40))
    assert torch.equal(half.field.cpu(), other.field.cpu())
    assert batch.to("cpu").tag.device.type == "cpu"


def test_accepts_dicts_and_prioritized_and_rejects_junk() -> None:
    e = FakeEmbedder(dim=3)
    q = MemoryRetrieveQuery.semantic([{"concept_identifier": "x"}])
    raw = json.loads(q.to_json())
    batch = embed_queries([q, raw, PrioritizedMemoryRetrieveQuery(priority=1, query=q)], e)
    assert torch.equal(batch.field[0], batch.field[1]) and torch.equal(
        batch.field[0], batch.field[2]
    )
    with pytest.raises(ValidationError, match=r"queries\[0\]"):
        embed_queries([{"tag": []}], e)
    with pytest.raises(ValidationError, match=r"queries\[1\]"):
        embed_queries([q, 42], e)  # type: ignore[list-item]
    empty = embed_queries([], e)
    assert empty.tag.shape == (0, 3) and empty.field.shape[0] == 0
