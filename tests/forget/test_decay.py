"""Ebbinghaus decay (SPEC §8): scalar formula, branch boundaries, cap, tensor form == scalar."""

from __future__ import annotations

import math
import random
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from soulmem_torch.errors import ValidationError
from soulmem_torch.forget import (
    DEFAULT_ACTIVE_FACTOR,
    DEFAULT_BASE_HALF_LIFE_HOURS,
    DEFAULT_MAX_ACTIVATION_CAP,
    compute_missing_degree,
    ebbinghaus_decay,
    ebbinghaus_decay_batch,
    edge_decay_intensity,
    edge_decay_intensity_batch,
    elapsed_whole_hours,
    graph_decay,
    graph_edge_decay_intensity,
    graph_missing_degree,
    missing_degree_batch,
    note_time_tensors,
)
from soulmem_torch.forget.decay import NS_PER_HOUR, to_epoch_ns
from soulmem_torch.model import Timestamp
from tests.forget._notes import T0, hours, make_proc, make_sem

UTC = timezone.utc


def f32(x: float) -> float:
    return float(np.float32(x))


def reference_r(
    t: int, count: int, base: float = 24.0, factor: float = 0.1, cap: int = 50
) -> float:
    """The SPEC formula in float64."""
    if t <= 0:
        return 1.0
    hl = base * (1 + factor * min(count, cap))
    return math.exp(-t * math.log(2) / hl)


# ---- the original's unit tests --------------------------------------------------------------
def test_fresh_node() -> None:
    now = datetime.now(UTC)
    assert abs(ebbinghaus_decay(now, 0, now, 24.0, 0.1, 50) - 1.0) < 1e-6


def test_half_life_baseline() -> None:
    after = datetime(2024, 1, 2, tzinfo=UTC)
    assert abs(ebbinghaus_decay(T0, 0, after, 24.0, 0.0, 50) - 0.5) < 0.01
    assert ebbinghaus_decay(T0, 0, after, 24.0, 0.0, 50) == 0.5


def test_retrieval_slows_decay() -> None:
    after = datetime(2024, 1, 2, tzinfo=UTC)
    assert ebbinghaus_decay(T0, 10, after, 24.0, 0.1, 50) > ebbinghaus_decay(
        T0, 0, after, 24.0, 0.1, 50
    )


def test_activation_cap() -> None:
    after = datetime(2024, 1, 2, tzinfo=UTC)
    d50 = ebbinghaus_decay(T0, 50, after, 24.0, 0.1, 50)
    d200 = ebbinghaus_decay(T0, 200, after, 24.0, 0.1, 50)
    assert d50 == d200
    assert ebbinghaus_decay(T0, 49, after) < d50


def test_missing_degree_range() -> None:
    far = datetime(2025, 1, 1, tzinfo=UTC)
    assert compute_missing_degree(T0, 0, far, 24.0, 0.0, 50) > 0.9


def test_edge_decay() -> None:
    after = datetime(2024, 1, 2, tzinfo=UTC)
    assert abs(edge_decay_intensity(1.0, T0, 0, after, 24.0, 0.0, 50) - 0.5) < 0.01
    assert edge_decay_intensity(0.8, T0, 0, after, 24.0, 0.0, 50) == 0.8 * 0.5


def test_defaults_are_the_originals() -> None:
    assert (DEFAULT_BASE_HALF_LIFE_HOURS, DEFAULT_ACTIVE_FACTOR, DEFAULT_MAX_ACTIVATION_CAP) == (
        24.0,
        0.1,
        50,
    )


# ---- formula, float32, truncation -----------------------------------------------------------
@pytest.mark.parametrize("count", [0, 1, 7, 50, 51, 500])
@pytest.mark.parametrize("t", [1, 2, 5, 6, 23, 24, 25, 31, 32, 100, 1000, 10_000])
def test_matches_spec_formula(t: int, count: int) -> None:
    r = ebbinghaus_decay(T0, count, T0 + hours(t))
    assert r == f32(r)  # a float32 value
    assert abs(r - reference_r(t, count)) < 1e-6
    assert compute_missing_degree(T0, count, T0 + hours(t)) == f32(1.0 - r)


@pytest.mark.parametrize(("threshold", "crossing_h"), [(0.05, 1.776), (0.15, 5.627), (0.6, 31.727)])
def test_branch_boundaries_at_retrieval_count_zero(threshold: float, crossing_h: float) -> None:
    # md(t) = 1 - 2^(-t/24) crosses the threshold at t* = -24·log2(1 - thr).
    assert -24 * math.log2(1 - threshold) == pytest.approx(crossing_h, abs=1e-3)
    below = math.floor(crossing_h)
    assert compute_missing_degree(T0, 0, T0 + hours(below)) < threshold
    assert compute_missing_degree(T0, 0, T0 + hours(below + 1)) >= threshold
    # whole hours are truncated: just before the next whole hour nothing changes
    almost = T0 + hours(below + 1) - timedelta(microseconds=1)
    assert compute_missing_degree(T0, 0, almost) == compute_missing_degree(T0, 0, T0 + hours(below))


def test_whole_hours_truncate_toward_zero() -> None:
    assert elapsed_whole_hours(T0, T0 + timedelta(minutes=59, seconds=59)) == 0
    assert elapsed_whole_hours(T0, T0 + timedelta(hours=1, minutes=59)) == 1
    assert elapsed_whole_hours(T0, T0 - timedelta(minutes=90)) == -1
    assert ebbinghaus_decay(T0, 0, T0 + timedelta(minutes=59)) == 1.0
    assert ebbinghaus_decay(T0, 0, T0 - timedelta(days=3)) == 1.0  # now before create_time


def test_nanoseconds_of_a_timestamp_count() -> None:
    base = to_epoch_ns(T0)
    created = Timestamp.from_ns(base + 500)  # 500 ns after T0
    one_hour = Timestamp.from_ns(base + NS_PER_HOUR)
    assert elapsed_whole_hours(created, one_hour) == 0  # 59 min 59.9999995 s
    assert ebbinghaus_decay(created, 0, one_hour) == 1.0
    assert ebbinghaus_decay(base, 0, base + 2 * NS_PER_HOUR) == ebbinghaus_decay(
        T0, 0, T0 + hours(2)
    )


def test_other_timezones_are_converted() -> None:
    cet = timezone(timedelta(hours=1))
    assert ebbinghaus_decay(
        datetime(2024, 1, 1, 1, tzinfo=cet), 0, T0 + hours(24)
    ) == ebbinghaus_decay(T0, 0, T0 + hours(24))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"create_time": datetime(2024, 1, 1)}, "create_time: expected a timezone-aware"),
        ({"now": datetime(2024, 1, 2)}, "now: expected a timezone-aware"),
        ({"retrieval_count": -1}, "retrieval_count: expected an int >= 0, found -1"),
        ({"retrieval_count": 1.5}, "retrieval_count"),
        ({"base_half_life_hours": 0.0}, "base_half_life_hours: expected a finite number > 0"),
        ({"active_factor": -0.1}, "active_factor"),
        ({"max_activation_cap": -1}, "max_activation_cap"),
        ({"now": "2024-01-02"}, "now: expected an aware datetime or int nanoseconds, found str"),
    ],
)
def test_validation_errors(kwargs: dict, match: str) -> None:
    args = {"create_time": T0, "retrieval_count": 0, "now": T0 + hours(5), **kwargs}
    with pytest.raises(ValidationError, match=match):
        ebbinghaus_decay(**args)


@settings(max_examples=200, deadline=None)
@given(
    t=st.integers(min_value=-10_000, max_value=200_000),
    count=st.integers(min_value=0, max_value=1000),
)
def test_properties(t: int, count: int) -> None:
    r = ebbinghaus_decay(T0, count, T0 + hours(t))
    assert 0.0 <= r <= 1.0
    assert ebbinghaus_decay(T0, count, T0 + hours(t + 1)) <= r  # non-increasing in time
    assert ebbinghaus_decay(T0, count + 1, T0 + hours(t)) >= r  # retrieval never speeds it up


# ---- tensor form ------------------------------------------------------------------------------
def random_nodes(n: int, seed: int = 0) -> tuple[list[int], list[int], int]:
    rng = random.Random(seed)
    now = to_epoch_ns(datetime(2026, 6, 1, tzinfo=UTC))
    create = [now - rng.randrange(-5 * NS_PER_HOUR, 24 * 3650 * NS_PER_HOUR) for _ in range(n)]
    create += [now, now + 1, now - NS_PER_HOUR + 1, now - NS_PER_HOUR, now - 2 * NS_PER_HOUR]
    count = [rng.choice([0, 1, 2, 10, 49, 50, 51, 200, rng.randrange(1000)]) for _ in create]
    return create, count, now


def test_batch_equals_scalar_on_every_note(device: torch.device) -> None:
    create, count, now = random_nodes(20_000)
    c = torch.tensor(create, device=device)
    r = torch.tensor(count, device=device)
    batch = ebbinghaus_decay_batch(c, r, now=now)
    md = missing_degree_batch(c, r, now=now)
    assert c.tolist() == create and r.tolist() == count  # inputs untouched
    assert batch.dtype == torch.float32 and batch.device == c.device
    assert batch.tolist() == [ebbinghaus_decay(a, b, now) for a, b in zip(create, count)]
    assert md.tolist() == [compute_missing_degree(a, b, now) for a, b in zip(create, count)]


def test_batch_equals_scalar_with_custom_parameters(device: torch.device) -> None:
    create, count, now = random_nodes(3000, seed=1)
    params = {"base_half_life_hours": 7.5, "active_factor": 0.33, "max_activation_cap": 12}
    batch = ebbinghaus_decay_batch(
        torch.tensor(create, device=device), torch.tensor(count, device=device), now=now, **params
    )
    scalar = [ebbinghaus_decay(a, b, now, *params.values()) for a, b in zip(create, count)]
    assert batch.tolist() == scalar


def test_batch_cap_and_datetime_now(device: torch.device) -> None:
    c = torch.full((3,), to_epoch_ns(T0), device=device)
    r = torch.tensor([0, 50, 200], device=device)
    out = ebbinghaus_decay_batch(c, r, now=T0 + hours(24)).tolist()
    assert out[0] == ebbinghaus_decay(T0, 0, T0 + hours(24)) == 0.5
    assert out[1] == out[2]


def test_batch_empty_and_int32_counts(device: torch.device) -> None:
    empty = torch.empty(0, dtype=torch.int64, device=device)
    assert ebbinghaus_decay_batch(empty, empty, now=0).shape == (0,)
    c = torch.tensor([0], device=device)
    r32 = torch.tensor([3], dtype=torch.int32, device=device)
    assert ebbinghaus_decay_batch(c, r32, now=30 * NS_PER_HOUR).item() == ebbinghaus_decay(
        0, 3, 30 * NS_PER_HOUR
    )


def test_edge_batch_equals_scalar(device: torch.device) -> None:
    create, count, now = random_nodes(500, seed=2)
    n = len(create)
    rng = random.Random(3)
    e = 2000
    src = [rng.randrange(n) for _ in range(e)]
    dst = [rng.randrange(n) for _ in range(e)]
    inten = [rng.random() * 2 for _ in range(e)]
    args = (
        torch.tensor(inten, dtype=torch.float64, device=device),
        torch.tensor([src, dst], device=device),
        torch.tensor(create, device=device),
        torch.tensor(count, device=device),
    )
    out = edge_decay_intensity_batch(*args, now=now)
    assert out.dtype == torch.float64
    assert out.tolist() == [
        edge_decay_intensity(w, create[s], count[s], now) for w, s in zip(inten, src)
    ]
    out_t = edge_decay_intensity_batch(*args, now=now, endpoint="target")
    assert out_t.tolist() == [
        edge_decay_intensity(w, create[d], count[d], now) for w, d in zip(inten, dst)
    ]


def test_graph_wrappers(device: torch.device) -> None:
    create, count, now = random_nodes(50, seed=4)
    graph = SimpleNamespace(
        create_time_ns=torch.tensor(create, device=device),
        retrieval_count=torch.tensor(count, device=device),
        intensity=torch.ones(3, dtype=torch.float64, device=device),
        edge_index=torch.tensor([[0, 1, 2], [1, 2, 0]], device=device),
    )
    r = graph_decay(graph, now=now)
    assert graph_missing_degree(graph, now=now).tolist() == (1.0 - r).tolist()
    assert graph_edge_decay_intensity(graph, now=now).tolist() == r[:3].double().tolist()


def test_note_time_tensors() -> None:
    notes = [make_sem("a", T0, retrieval_count=3), make_proc("b", T0 + hours(1))]
    wrapped = [SimpleNamespace(note=notes[0], embedding=None), notes[1]]
    c, r = note_time_tensors(wrapped)
    assert c.tolist() == [to_epoch_ns(T0), to_epoch_ns(T0) + NS_PER_HOUR]
    assert r.tolist() == [3, 0]
    assert c.dtype == r.dtype == torch.int64


@pytest.mark.parametrize(
    ("create", "count", "match"),
    [
        (torch.zeros(3), torch.zeros(3, dtype=torch.int64), "create_time_ns: expected an int64"),
        (torch.zeros(3, dtype=torch.int64), torch.zeros(2, dtype=torch.int64), "retrieval_count"),
        (torch.zeros(3, dtype=torch.int64), torch.zeros(3), "retrieval_count: expected an integer"),
        (
            torch.zeros(1, 3, dtype=torch.int64),
            torch.zeros(1, 3, dtype=torch.int64),
            "shape \\(N,\\)",
        ),
    ],
)
def test_batch_validation(create: torch.Tensor, count: torch.Tensor, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        ebbinghaus_decay_batch(create, count, now=0)


def test_edge_batch_validation() -> None:
    c = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(ValidationError, match="edge_index: expected shape \\(2, 3\\)"):
        edge_decay_intensity_batch(
            torch.ones(3, dtype=torch.float64), torch.zeros(2, 2, dtype=torch.int64), c, c, now=0
        )
    with pytest.raises(ValidationError, match="endpoint"):
        edge_decay_intensity_batch(
            torch.ones(1, dtype=torch.float64),
            torch.zeros(2, 1, dtype=torch.int64),
            c,
            c,
            now=0,
            endpoint="both",
        )
