"""Shared test helpers: a deterministic fake embedder and random notes / queries."""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np
import torch

from soulmem_torch.model import (
    AbstractSituation,
    Action,
    ActionType,
    ConceptType,
    Context,
    Environment,
    Event,
    Location,
    MemoryNote,
    Participant,
    ProcMemory,
    SemMemory,
    SpecificSituation,
    Timestamp,
)
from soulmem_torch.model.query import MemoryRetrieveQuery


class FakeEmbedder:
    """Each distinct string → a fixed pseudo-random vector (crc32-seeded); records every call.

    ``zero`` strings embed to the zero vector; ``query_shift`` (if set) makes ``embed_query``
    differ from the document side so tests can tell which side was used.
    """

    def __init__(
        self, dim: int = 8, *, zero: Sequence[str] = ("",), query_shift: float | None = None
    ) -> None:
        self.dim = dim
        self.zero = set(zero)
        self.calls: list[list[str]] = []
        self.query_calls: list[list[str]] = []
        if query_shift is not None:
            self.embed_query = self._embed_query  # type: ignore[method-assign]
        self.query_shift = query_shift

    def vector(self, text: str) -> np.ndarray:
        if text in self.zero:
            return np.zeros(self.dim)
        rng = np.random.default_rng(zlib.crc32(text.encode("utf-8")))
        return rng.standard_normal(self.dim)

    def query_vector(self, text: str) -> np.ndarray:
        v = self.vector(text)
        return v if self.query_shift is None or not v.any() else v + self.query_shift

    def __call__(self, texts: Sequence[str]) -> torch.Tensor:
        self.calls.append(list(texts))
        return torch.tensor(np.stack([self.vector(t) for t in texts]), dtype=torch.float32)

    def _embed_query(self, texts: Sequence[str]) -> torch.Tensor:
        self.query_calls.append(list(texts))
        return torch.tensor(np.stack([self.query_vector(t) for t in texts]), dtype=torch.float32)


WORDS = ["酒馆", "小酒馆", "张三", "张三丰", "操场", "跑步", "黑暗", "阴森", "Rust", "rust语言", ""]
T0 = Timestamp.parse("2024-01-01T00:00:00Z")


def _w(rng: np.random.Generator, allow_empty: bool = True) -> str:
    words = WORDS if allow_empty else WORDS[:-1]
    return str(words[int(rng.integers(len(words)))])


def _loc(rng: np.random.Generator) -> Location:
    return Location(name=_w(rng), coordinates=_w(rng))


def _person(rng: np.random.Generator) -> Participant:
    return Participant(name=_w(rng), role=_w(rng))


def _env(rng: np.random.Generator) -> Environment:
    return Environment(atmosphere=_w(rng), tone=_w(rng))


def _event(rng: np.random.Generator, zero_intensity: bool = False) -> Event:
    intensity = 0.0 if zero_intensity else float(rng.choice([0.0, 0.2, 0.5, 0.9, 1.0]))
    return Event(action=_w(rng), action_intensity=intensity, initiator=_w(rng), target=_w(rng))


def random_note(rng: np.random.Generator) -> MemoryNote:
    """A random note of any kind over a small vocabulary (so strings repeat)."""
    kind = int(rng.integers(7))
    tags = [_w(rng, False) for _ in range(int(rng.integers(0, 3)))]
    if kind == 0:
        mt = SemMemory(
            content=_w(rng),
            aliases=[_w(rng) for _ in range(int(rng.integers(0, 3)))],
            concept_type=ConceptType.ENTITY,
            description=_w(rng),
        )
    elif kind == 1:
        zero = bool(rng.integers(4) == 0)
        ctx = Context(
            location=_loc(rng) if rng.integers(2) else None,
            participants=[_person(rng) for _ in range(int(rng.integers(0, 3)))],
            emotions=[],
            sensory_data=[],
            environment=_env(rng),
            event=[_event(rng, zero) for _ in range(int(rng.integers(0, 3)))],
        )
        mt = SpecificSituation(narrative=_w(rng) + _w(rng), time_span=T0, context=ctx)
    elif kind == 2:
        mt = AbstractSituation(_loc(rng))
    elif kind == 3:
        mt = AbstractSituation(_person(rng))
    elif kind == 4:
        mt = AbstractSituation(_env(rng))
    elif kind == 5:
        mt = AbstractSituation(_event(rng))
    else:
        mt = ProcMemory(action=Action(content=_w(rng), action_type=ActionType.THINK))
    return MemoryNote.build(mt, tags=tags, create_time=T0)


def _maybe(rng: np.random.Generator, value: object) -> object:
    return value if rng.integers(3) else None


def random_query(rng: np.random.Generator) -> MemoryRetrieveQuery:
    """A random Semantic or Situation query with 0–3 units and optional parts."""
    tags = [_w(rng, False) for _ in range(int(rng.integers(0, 3)))]
    n_units = int(rng.integers(0, 4))
    if rng.integers(2):
        units = [
            {"concept_identifier": _maybe(rng, _w(rng)), "description": _maybe(rng, _w(rng))}
            for _ in range(n_units)
        ]
        return MemoryRetrieveQuery.semantic(units, tag=tags)
    units = []
    for _ in range(n_units):
        unit: dict[str, object] = {"narrative": _maybe(rng, _w(rng) + _w(rng))}
        if rng.integers(2):
            unit["location"] = [
                {"name": _w(rng), "coordinates": _maybe(rng, _w(rng))}
                for _ in range(int(rng.integers(0, 3)))
            ]
        if rng.integers(2):
            unit["participants"] = [
                {"name": _maybe(rng, _w(rng)), "role": _maybe(rng, _w(rng))}
                for _ in range(int(rng.integers(0, 3)))
            ]
        if rng.integers(2):
            unit["environment"] = {
                "atmosphere": _maybe(rng, _w(rng)),
                "tone": _maybe(rng, _w(rng)),
            }
        if rng.integers(2):
            unit["event"] = [
                {
                    "action": _w(rng),
                    "initiator": _maybe(rng, _w(rng)),
                    "target": _maybe(rng, _w(rng)),
                }
                for _ in range(int(rng.integers(0, 3)))
            ]
        units.append(unit)
    return MemoryRetrieveQuery.situation(units, tag=tags)
