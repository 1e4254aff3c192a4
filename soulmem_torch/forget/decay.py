"""Ebbinghaus forgetting curve (docs/spec.md §8): retention, missing degree and decayed link intensity.

Retention of a note ``R = exp(-t · ln2 / hl)`` with

* ``t``  = whole hours elapsed since ``create_time`` (truncated toward zero); ``t ≤ 0 → R = 1``,
* ``hl`` = ``base_half_life_hours · (1 + active_factor · min(retrieval_count, max_activation_cap))``.

The original computes in float32 (``t as f32``, ``hl`` and ``tau = hl / LN_2`` in f32, exponent
``-t / tau`` in f32). Both forms here reproduce that float32 exponent exactly, then take
``exp`` in float64 and round the result once to float32 — the correctly rounded float32 of
``exp(x)``, independent of the platform's ``expf``. The scalar functions return that float32
value as a Python ``float``; the tensor forms return float32 tensors holding the same bits (the
test suite checks equality on every note, and it held on every ``(hour, capped count)`` pair for
``hour < 60 000`` and ``count ≤ 50``).

Time is integer nanoseconds since the Unix epoch throughout, so a ``Timestamp`` (which carries
nanoseconds below the microsecond) gives the same whole hours as ``MemoryGraph.create_time_ns``.

Two forms:

* scalar: :func:`ebbinghaus_decay`, :func:`compute_missing_degree`, :func:`edge_decay_intensity`
  (argument order as in the original, so its unit tests read the same);
* tensor: :func:`ebbinghaus_decay_batch`, :func:`missing_degree_batch`,
  :func:`edge_decay_intensity_batch` over ``create_time_ns (N,) int64`` and
  ``retrieval_count (N,)``, plus thin wrappers for a note collection (:func:`note_time_tensors`)
  and a ``MemoryGraph`` (:func:`graph_missing_degree`, :func:`graph_edge_decay_intensity`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

import numpy as np
import torch

from soulmem_torch.errors import ValidationError

__all__ = [
    "DEFAULT_ACTIVE_FACTOR",
    "DEFAULT_BASE_HALF_LIFE_HOURS",
    "DEFAULT_MAX_ACTIVATION_CAP",
    "NS_PER_HOUR",
    "compute_missing_degree",
    "ebbinghaus_decay",
    "ebbinghaus_decay_batch",
    "edge_decay_intensity",
    "edge_decay_intensity_batch",
    "elapsed_whole_hours",
    "graph_decay",
    "graph_edge_decay_intensity",
    "graph_missing_degree",
    "missing_degree_batch",
    "note_time_tensors",
    "to_epoch_ns",
]

DEFAULT_BASE_HALF_LIFE_HOURS: float = 24.0
"""Base half-life in hours (a never-retrieved note keeps half its retention after 24 h)."""
DEFAULT_ACTIVE_FACTOR: float = 0.1
"""Each retrieval lengthens the half-life by this fraction of the base."""
DEFAULT_MAX_ACTIVATION_CAP: int = 50
"""Retrievals beyond this count no longer slow forgetting."""

NS_PER_HOUR: int = 3_600_000_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_LN2_F32 = np.float32(math.log(2.0))  # == std::f32::consts::LN_2


# -------------------------------------------------------------------------------------------
# validation and time helpers
# -------------------------------------------------------------------------------------------
def to_epoch_ns(value: datetime | int, *, name: str = "time") -> int:
    """Integer nanoseconds since the Unix epoch.

    Args:
        value: an aware datetime (a ``Timestamp`` keeps its sub-microsecond nanoseconds) or an
            int already in nanoseconds.
        name: argument name used in the error message.

    Raises:
        ValidationError: ``value`` is a naive datetime or not a time at all.
    """
    if isinstance(value, bool):
        raise ValidationError(f"{name}: expected an aware datetime or int nanoseconds, found bool")
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, datetime):
        ns = getattr(value, "ns_since_epoch", None)
        if isinstance(ns, int):
            return ns
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValidationError(
                f"{name}: expected a timezone-aware datetime, found naive {value.isoformat()!r}; "
                "attach a timezone (e.g. datetime.timezone.utc)"
            )
        delta = value - _EPOCH
        us = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
        return us * 1000
    raise ValidationError(
        f"{name}: expected an aware datetime or int nanoseconds, found {type(value).__name__}"
    )


def _now_ns(now: datetime | int | None) -> int:
    if now is None:
        return to_epoch_ns(datetime.now(timezone.utc), name="now")
    return to_epoch_ns(now, name="now")


def elapsed_whole_hours(create_time: datetime | int, now: datetime | int) -> int:
    """Whole hours from ``create_time`` to ``now``, truncated toward zero (chrono's ``num_hours``).

    Example:
        >>> from datetime import datetime, timezone
        >>> t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
        >>> elapsed_whole_hours(t0, datetime(2024, 1, 1, 1, 59, 59, tzinfo=timezone.utc))
        1
    """
    elapsed = to_epoch_ns(now, name="now") - to_epoch_ns(create_time, name="create_time")
    hours = abs(elapsed) // NS_PER_HOUR
    return hours if elapsed >= 0 else -hours


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.number)) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check_params(
    base_half_life_hours: float, active_factor: float, max_activation_cap: int
) -> None:
    if not (_is_number(base_half_life_hours) and 0 < base_half_life_hours < math.inf):
        raise ValidationError(
            f"base_half_life_hours: expected a finite number > 0, found {base_half_life_hours!r}"
        )
    if not (_is_number(active_factor) and 0 <= active_factor < math.inf):
        raise ValidationError(
            f"active_factor: expected a finite number >= 0, found {active_factor!r}"
        )
    if not (_is_int(max_activation_cap) and max_activation_cap >= 0):
        raise ValidationError(
            f"max_activation_cap: expected an int >= 0, found {max_activation_cap!r}"
        )


def _check_count(retrieval_count: int) -> int:
    if not (_is_int(retrieval_count) and retrieval_count >= 0):
        raise ValidationError(f"retrieval_count: expected an int >= 0, found {retrieval_count!r}")
    return int(retrieval_count)


# -------------------------------------------------------------------------------------------
# scalar form
# -------------------------------------------------------------------------------------------
def _retention_f32(hours: int, capped: int, base: float, factor: float) -> np.float32:
    """Float32 retention for ``hours > 0`` (the original's f32 arithmetic, exp in f64)."""
    one = np.float32(1.0)
    hl = np.float32(base) * (one + np.float32(factor) * np.float32(capped))
    tau = hl / _LN2_F32
    x = -np.float32(hours) / tau
    return np.float32(math.exp(float(x)))


def ebbinghaus_decay(
    create_time: datetime | int,
    retrieval_count: int,
    now: datetime | int | None = None,
    base_half_life_hours: float = DEFAULT_BASE_HALF_LIFE_HOURS,
    active_factor: float = DEFAULT_ACTIVE_FACTOR,
    max_activation_cap: int = DEFAULT_MAX_ACTIVATION_CAP,
) -> float:
    """Retention ``R`` in [0, 1] of a note (1 = fresh, 0 = forgotten); a float32 value.

    Args:
        create_time: aware datetime (or int ns since the epoch) the note was created.
        retrieval_count: >= 0. Retrievals so far; counted up to ``max_activation_cap``.
        now: aware datetime (or int ns); ``None`` = the current time.
        base_half_life_hours: > 0. Half-life of a never-retrieved note.
        active_factor: >= 0. Half-life gain per retrieval, as a fraction of the base.
        max_activation_cap: >= 0. Retrievals beyond this count are ignored.

    Returns:
        ``exp(-t·ln2/hl)`` rounded to float32, ``1.0`` when fewer than one whole hour elapsed
        (or ``now`` precedes ``create_time``).

    Example:
        >>> from datetime import datetime, timezone
        >>> t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
        >>> ebbinghaus_decay(t0, 0, datetime(2024, 1, 2, tzinfo=timezone.utc), 24.0, 0.0, 50)
        0.5
    """
    _check_params(base_half_life_hours, active_factor, max_activation_cap)
    count = _check_count(retrieval_count)
    hours = elapsed_whole_hours(create_time, _now_ns(now))
    if hours <= 0:
        return 1.0
    capped = min(count, int(max_activation_cap))
    return float(_retention_f32(hours, capped, base_half_life_hours, active_factor))


def compute_missing_degree(
    create_time: datetime | int,
    retrieval_count: int,
    now: datetime | int | None = None,
    base_half_life_hours: float = DEFAULT_BASE_HALF_LIFE_HOURS,
    active_factor: float = DEFAULT_ACTIVE_FACTOR,
    max_activation_cap: int = DEFAULT_MAX_ACTIVATION_CAP,
) -> float:
    """Missing degree ``1 - R`` in [0, 1] (float32 subtraction); larger = more forgotten.

    Arguments as for :func:`ebbinghaus_decay`.
    """
    r = ebbinghaus_decay(
        create_time, retrieval_count, now, base_half_life_hours, active_factor, max_activation_cap
    )
    return float(np.float32(1.0) - np.float32(r))


def edge_decay_intensity(
    intensity: float,
    create_time: datetime | int,
    retrieval_count: int,
    now: datetime | int | None = None,
    base_half_life_hours: float = DEFAULT_BASE_HALF_LIFE_HOURS,
    active_factor: float = DEFAULT_ACTIVE_FACTOR,
    max_activation_cap: int = DEFAULT_MAX_ACTIVATION_CAP,
) -> float:
    """Decayed link intensity ``intensity · R`` (float64 times the float32 retention widened).

    Args:
        intensity: the link's stored intensity (float64).
        create_time, retrieval_count, now, base_half_life_hours, active_factor,
            max_activation_cap: of the note whose forgetting the link follows, as for
            :func:`ebbinghaus_decay`.
    """
    r = ebbinghaus_decay(
        create_time, retrieval_count, now, base_half_life_hours, active_factor, max_activation_cap
    )
    return float(intensity) * r


# -------------------------------------------------------------------------------------------
# tensor form
# -------------------------------------------------------------------------------------------
def ebbinghaus_decay_batch(
    create_time_ns: torch.Tensor,
    retrieval_count: torch.Tensor,
    *,
    now: datetime | int | None = None,
    base_half_life_hours: float = DEFAULT_BASE_HALF_LIFE_HOURS,
    active_factor: float = DEFAULT_ACTIVE_FACTOR,
    max_activation_cap: int = DEFAULT_MAX_ACTIVATION_CAP,
) -> torch.Tensor:
    """Retention of every note as one tensor operation; equal to :func:`ebbinghaus_decay` per note.

    Args:
        create_time_ns: shape (N,), int64. Creation times, ns since the Unix epoch.
        retrieval_count: shape (N,), integer, >= 0. Retrieval counts.
        now: aware datetime or int ns; ``None`` = the current time.
        base_half_life_hours, active_factor, max_activation_cap: as for
            :func:`ebbinghaus_decay`.

    Returns:
        shape (N,), float32, on the device of ``create_time_ns``.

    Raises:
        ValidationError: shapes or dtypes do not match the above.
    """
    _check_params(base_half_life_hours, active_factor, max_activation_cap)
    _check_node_tensors(create_time_ns, retrieval_count)
    now_ns = _now_ns(now)
    f32 = torch.float32
    device = create_time_ns.device
    # Every step below is the IEEE operation of the formula, done in place where the tensor is
    # ours: fewer large temporaries (allocation, not arithmetic, dominates at 1M notes).
    hours = torch.sub(create_time_ns, now_ns).neg_()  # now - create, exact in int64
    hours.div_(NS_PER_HOUR, rounding_mode="trunc")
    # 0-d float32 operands: the products and quotient round exactly as the original's f32 ops.
    base = torch.tensor(float(np.float32(base_half_life_hours)), dtype=f32, device=device)
    factor = torch.tensor(float(np.float32(active_factor)), dtype=f32, device=device)
    ln2 = torch.tensor(float(_LN2_F32), dtype=f32, device=device)
    tau = retrieval_count.to(f32).clamp_(max=float(max_activation_cap))
    tau.mul_(factor).add_(1.0).mul_(base)  # hl = base · (1 + factor · capped)
    tau.div_(ln2)  # tau = hl / ln2
    x = hours.to(f32).neg_().div_(tau)  # x = -t / tau
    r = x.to(torch.float64).exp_().to(f32)
    return r.masked_fill_(hours <= 0, 1.0)


def missing_degree_batch(
    create_time_ns: torch.Tensor,
    retrieval_count: torch.Tensor,
    *,
    now: datetime | int | None = None,
    base_half_life_hours: float = DEFAULT_BASE_HALF_LIFE_HOURS,
    active_factor: float = DEFAULT_ACTIVE_FACTOR,
    max_activation_cap: int = DEFAULT_MAX_ACTIVATION_CAP,
) -> torch.Tensor:
    """Missing degree ``1 - R`` of every note; shape (N,), float32. Arguments as
    :func:`ebbinghaus_decay_batch`; equal to :func:`compute_missing_degree` per note."""
    r = ebbinghaus_decay_batch(
        create_time_ns,
        retrieval_count,
        now=now,
        base_half_life_hours=base_half_life_hours,
        active_factor=active_factor,
        max_activation_cap=max_activation_cap,
    )
    return r.neg_().add_(1.0)  # 1 - r (r is a fresh tensor)


def edge_decay_intensity_batch(
    intensity: torch.Tensor,
    edge_index: torch.Tensor,
    create_time_ns: torch.Tensor,
    retrieval_count: torch.Tensor,
    *,
    now: datetime | int | None = None,
    endpoint: str = "source",
    base_half_life_hours: float = DEFAULT_BASE_HALF_LIFE_HOURS,
    active_factor: float = DEFAULT_ACTIVE_FACTOR,
    max_activation_cap: int = DEFAULT_MAX_ACTIVATION_CAP,
) -> torch.Tensor:
    """Decayed intensity of every link: ``intensity[e] · R[edge_index[0, e]]``.

    A link follows the forgetting of the note that owns it — its source, where the model stores
    outgoing links — unless ``endpoint="target"``.

    Args:
        intensity: shape (E,), float64. Stored link intensities.
        edge_index: shape (2, E), int64. Row 0 = source node index, row 1 = target.
        create_time_ns: shape (N,), int64. Node creation times, ns since the epoch.
        retrieval_count: shape (N,), integer. Node retrieval counts.
        now: aware datetime or int ns; ``None`` = the current time.
        endpoint: ``"source"`` (default) or ``"target"``: whose retention decays the link.
        base_half_life_hours, active_factor, max_activation_cap: as for
            :func:`ebbinghaus_decay`.

    Returns:
        shape (E,), float64; equal per link to :func:`edge_decay_intensity`.
    """
    if endpoint not in ("source", "target"):
        raise ValidationError(f"endpoint: expected 'source' or 'target', found {endpoint!r}")
    if intensity.dim() != 1:
        raise ValidationError(f"intensity: expected shape (E,), found {tuple(intensity.shape)}")
    if (
        edge_index.dim() != 2
        or edge_index.shape[0] != 2
        or edge_index.shape[1] != intensity.shape[0]
    ):
        raise ValidationError(
            f"edge_index: expected shape (2, {intensity.shape[0]}) to match intensity, "
            f"found {tuple(edge_index.shape)}"
        )
    r = ebbinghaus_decay_batch(
        create_time_ns,
        retrieval_count,
        now=now,
        base_half_life_hours=base_half_life_hours,
        active_factor=active_factor,
        max_activation_cap=max_activation_cap,
    )
    row = edge_index[0] if endpoint == "source" else edge_index[1]
    return intensity.to(torch.float64) * r[row].to(torch.float64)


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} tensor of shape {tuple(value.shape)}"
    return type(value).__name__


def _check_node_tensors(create_time_ns: torch.Tensor, retrieval_count: torch.Tensor) -> None:
    ok = (
        isinstance(create_time_ns, torch.Tensor)
        and create_time_ns.dtype == torch.int64
        and create_time_ns.dim() == 1
    )
    if not ok:
        raise ValidationError(
            "create_time_ns: expected an int64 tensor of shape (N,), "
            f"found {_describe(create_time_ns)}"
        )
    ok = (
        isinstance(retrieval_count, torch.Tensor)
        and retrieval_count.shape == create_time_ns.shape
        and not retrieval_count.is_floating_point()
        and not retrieval_count.is_complex()
        and retrieval_count.dtype != torch.bool
    )
    if not ok:
        raise ValidationError(
            f"retrieval_count: expected an integer tensor of shape {tuple(create_time_ns.shape)} "
            f"(same as create_time_ns), found {_describe(retrieval_count)}"
        )


# -------------------------------------------------------------------------------------------
# wrappers: note collections and MemoryGraph
# -------------------------------------------------------------------------------------------
def _as_note(item: Any) -> Any:
    """A ``MemoryNote`` from a note or an ``EmbeddedMemoryNote``-like wrapper (``.note``)."""
    return getattr(item, "note", item)


def note_time_tensors(
    notes: Iterable[Any], *, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(create_time_ns (N,) int64, retrieval_count (N,) int64)`` of notes in iteration order.

    Args:
        notes: ``MemoryNote``s, ``EmbeddedMemoryNote``s or a ``MemoryCluster`` (iterated).
        device: where to put the tensors (``None`` = CPU).
    """
    create, count = [], []
    for item in notes:
        note = _as_note(item)
        create.append(to_epoch_ns(note.create_time, name="note.create_time"))
        # usize counts above int64 saturate: decay only reads min(count, max_activation_cap).
        count.append(min(_check_count(note.retrieval_count), 2**63 - 1))
    return (
        torch.tensor(create, dtype=torch.int64, device=device),
        torch.tensor(count, dtype=torch.int64, device=device),
    )


def graph_decay(
    graph: Any,
    *,
    now: datetime | int | None = None,
    base_half_life_hours: float = DEFAULT_BASE_HALF_LIFE_HOURS,
    active_factor: float = DEFAULT_ACTIVE_FACTOR,
    max_activation_cap: int = DEFAULT_MAX_ACTIVATION_CAP,
) -> torch.Tensor:
    """Retention of every node of a ``MemoryGraph`` (its ``create_time_ns``, ``retrieval_count``).

    Returns:
        shape (N,), float32, on the graph's device.
    """
    return ebbinghaus_decay_batch(
        graph.create_time_ns,
        graph.retrieval_count,
        now=now,
        base_half_life_hours=base_half_life_hours,
        active_factor=active_factor,
        max_activation_cap=max_activation_cap,
    )


def graph_missing_degree(
    graph: Any,
    *,
    now: datetime | int | None = None,
    base_half_life_hours: float = DEFAULT_BASE_HALF_LIFE_HOURS,
    active_factor: float = DEFAULT_ACTIVE_FACTOR,
    max_activation_cap: int = DEFAULT_MAX_ACTIVATION_CAP,
) -> torch.Tensor:
    """Missing degree of every node of a ``MemoryGraph``; shape (N,), float32."""
    return missing_degree_batch(
        graph.create_time_ns,
        graph.retrieval_count,
        now=now,
        base_half_life_hours=base_half_life_hours,
        active_factor=active_factor,
        max_activation_cap=max_activation_cap,
    )


def graph_edge_decay_intensity(
    graph: Any,
    *,
    now: datetime | int | None = None,
    endpoint: str = "source",
    base_half_life_hours: float = DEFAULT_BASE_HALF_LIFE_HOURS,
    active_factor: float = DEFAULT_ACTIVE_FACTOR,
    max_activation_cap: int = DEFAULT_MAX_ACTIVATION_CAP,
) -> torch.Tensor:
    """Decayed intensity of every edge of a ``MemoryGraph`` (``intensity``, ``edge_index``).

    Returns:
        shape (E,), float64, on the graph's device.
    """
    return edge_decay_intensity_batch(
        graph.intensity,
        graph.edge_index,
        graph.create_time_ns,
        graph.retrieval_count,
        now=now,
        endpoint=endpoint,
        base_half_life_hours=base_half_life_hours,
        active_factor=active_factor,
        max_activation_cap=max_activation_cap,
    )
