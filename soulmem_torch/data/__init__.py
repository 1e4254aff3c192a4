"""The bundled sample memory: a small original world to try soulmem_torch on (docs/spec.md §9 formats).

``sample_memory.graph.json`` is an evaluation graph (the original's ``soul_tune`` format: readable
ids ``sem_*`` / ``sit_*`` / ``sit_abstract_*`` / ``proc_*``, no UUIDs, no times) about
**林小满 (Xiaoman Lin)**, the bilingual owner of 云朵咖啡馆 (Cloud Nine Café) on Wukang Road in
Shanghai, who also works two afternoons a week as a research assistant at an urban bird lab.
Its 77 notes mix Chinese and English and cover every kind: 25 semantic concepts (19 entities, 6
abstract ideas), 16 specific situations with full context, 19 abstract situations (Location,
Participant, Environment and Event leaves) and 17 procedural actions (Speak / Think / Skill)
reached by ``TrigToAction`` links.

``sample_queries.json`` is a retrieval suite for it in the original's ``question.json`` format
(18 cases: single concepts, single episodes, and prioritized multi-query sets with expected
actions).

Example:
    >>> graph = load_sample_memory()
    >>> len(graph.notes), graph.id_map["sem_self"] in {n.id for n in graph.notes}
    (77, True)
    >>> load_sample_queries()["graph_path"]
    'sample_memory.graph.json'
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from soulmem_torch.model.soul_tune import SoulTuneGraph, load_soul_tune_graph

__all__ = [
    "load_sample_memory",
    "load_sample_queries",
    "sample_memory_path",
    "sample_queries_path",
]

_HERE = Path(__file__).resolve().parent


def sample_memory_path() -> Path:
    """Path of ``sample_memory.graph.json`` (the bundled evaluation graph)."""
    return _HERE / "sample_memory.graph.json"


def sample_queries_path() -> Path:
    """Path of ``sample_queries.json`` (the retrieval suite for the sample graph)."""
    return _HERE / "sample_queries.json"


def load_sample_memory(*, now: datetime | None = None) -> SoulTuneGraph:
    """Loads the sample graph: fresh MemoryIds, both times ``now`` (default: the current time).

    Returns:
        The notes in file order with the readable id ↔ MemoryId maps (``id_map``,
        ``readable_ids``).
    """
    return load_soul_tune_graph(sample_memory_path(), now=now)


def load_sample_queries() -> dict[str, Any]:
    """The parsed retrieval suite (``question.json`` format; ``graph_path`` is relative to it)."""
    return json.loads(sample_queries_path().read_text(encoding="utf-8"))
