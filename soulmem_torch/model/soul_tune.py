"""The original's evaluation-graph format (``soul_tune`` ``*.graph.json``, docs/spec.md §9).

A JSON array of ``{id: "<readable id>", tags, mem_type, mem_links?: [{from, to, intensity,
link_type}]}`` with readable ids (``sem_*``, ``sit_*``, ``sit_abstract_*``, ``proc_*``), no UUIDs
and no times. Loading gives each node a fresh ``MemoryId`` (keeping readable id ↔ MemoryId),
sets both times to ``now``, maps link ends through the map, and first repairs the LLM quirks the
original repairs. **DECISION:** a link end that names no node is reported (the original silently
points it at the note itself).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pydantic

from soulmem_torch.errors import GraphLoadError
from soulmem_torch.model.describe import describe_validation_error
from soulmem_torch.model.ids import LinkId, MemoryId
from soulmem_torch.model.links import MemoryLink
from soulmem_torch.model.notes import MemoryNote
from soulmem_torch.model.timestamp import Timestamp

__all__ = ["SoulTuneGraph", "dump_soul_tune_graph", "load_soul_tune_graph", "parse_soul_tune_graph"]

_EPOCH_TEXT = "1970-01-01T00:00:00Z"


@dataclass
class SoulTuneGraph:
    """Notes loaded from an evaluation graph, with the readable id ↔ MemoryId maps."""

    notes: list[MemoryNote]
    id_map: dict[str, MemoryId] = field(default_factory=dict)

    @property
    def readable_ids(self) -> dict[MemoryId, str]:
        """MemoryId → readable id."""
        return {mid: rid for rid, mid in self.id_map.items()}

    @property
    def num_links(self) -> int:
        return sum(len(n.mem_links) for n in self.notes)


def _repair_mem_type(mem_type: Any) -> Any:
    """``time_span: null`` → epoch; ``context.environment: null`` → empty environment."""
    if not isinstance(mem_type, dict):
        return mem_type
    situation = mem_type.get("Situation")
    if isinstance(situation, dict):
        specific = situation.get("SpecificSituation")
        if isinstance(specific, dict):
            if specific.get("time_span", _EPOCH_TEXT) is None:
                specific["time_span"] = _EPOCH_TEXT
            context = specific.get("context")
            if isinstance(context, dict) and "environment" in context:
                if context["environment"] is None:
                    context["environment"] = {"atmosphere": "", "tone": ""}
    return mem_type


def _repair_link_type(link_type: Any) -> Any:
    """``{"Proc":{"prob":p}}`` → TrigToAction; ``{"Situation":{}}`` → AbstractToSpecific."""
    if not isinstance(link_type, dict):
        return link_type
    proc = link_type.get("Proc")
    if isinstance(proc, dict) and "prob" in proc and "TrigToAction" not in proc:
        return {"Proc": {"TrigToAction": {"prob": proc["prob"]}}}
    if link_type.get("Situation") == {}:
        return {"Situation": {"AbstractToSpecific": {}}}
    return link_type


def parse_soul_tune_graph(
    nodes: Any, *, now: datetime | None = None, source: str = "<graph>"
) -> SoulTuneGraph:
    """Builds notes from the parsed JSON array of an evaluation graph.

    Raises:
        GraphLoadError: listing *every* bad node (readable id and why) — not just the first.
    """
    if not isinstance(nodes, list):
        raise GraphLoadError(
            f"{source}: expected a JSON array of nodes, found {type(nodes).__name__}"
        )
    stamp = Timestamp.from_datetime(now) if now is not None else Timestamp.now()
    problems: list[tuple[str, str]] = []
    id_map: dict[str, MemoryId] = {}
    first_at: dict[str, int] = {}
    for i, raw in enumerate(nodes):
        rid = raw.get("id") if isinstance(raw, dict) else None
        if not isinstance(rid, str) or not rid:
            problems.append((f"#{i}", "node has no string 'id'"))
        elif rid in id_map:
            problems.append((rid, f"duplicate readable id (nodes #{first_at[rid]} and #{i})"))
        else:
            id_map[rid] = MemoryId.new()
            first_at[rid] = i

    notes: list[MemoryNote] = []
    for raw in nodes:
        if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
            continue
        rid = raw["id"]
        raw = copy.deepcopy(raw)
        links_raw = raw.get("mem_links") or []
        links: list[dict[str, Any]] = []
        link_problems: list[str] = []
        if not isinstance(links_raw, list):
            link_problems.append("mem_links is not a list")
            links_raw = []
        for j, link in enumerate(links_raw):
            if not isinstance(link, dict):
                link_problems.append(f"mem_links.{j}: not an object")
                continue
            ends = {}
            for end in ("from", "to"):
                target = link.get(end)
                if target not in id_map:
                    link_problems.append(f"mem_links.{j}.{end}: unknown node {target!r}")
                else:
                    ends[end] = id_map[target]
            if len(ends) < 2:
                continue
            links.append(
                {
                    "id": LinkId.new(),
                    "from": ends["from"],
                    "to": ends["to"],
                    "intensity": link.get("intensity", 1.0),
                    "link_type": _repair_link_type(link.get("link_type")),
                }
            )
        candidate = {
            "id": id_map.get(rid, MemoryId.new()),
            "tags": raw.get("tags", []) if raw.get("tags") is not None else [],
            "retrieval_count": 0,
            "create_time": stamp,
            "last_accessed_time": stamp,
            "mem_type": _repair_mem_type(raw.get("mem_type")),
            "mem_links": links,
        }
        try:
            note = MemoryNote.model_validate(candidate)
        except pydantic.ValidationError as exc:
            link_problems.insert(0, describe_validation_error(exc))
            note = None
        if link_problems:
            problems.append((rid, "; ".join(link_problems)))
        elif note is not None:
            notes.append(note)
    if problems:
        lines = "\n".join(f"  - {rid}: {why}" for rid, why in problems)
        raise GraphLoadError(
            f"{source}: {len(problems)} of {len(nodes)} node(s) are invalid:\n{lines}", problems
        )
    return SoulTuneGraph(notes=notes, id_map=id_map)


def load_soul_tune_graph(path: str | Path, *, now: datetime | None = None) -> SoulTuneGraph:
    """Loads an evaluation graph file (``*.graph.json`` / ``graph.json``)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise GraphLoadError(f"{path}: not valid JSON: {exc}") from None
    return parse_soul_tune_graph(data, now=now, source=str(path))


def dump_soul_tune_graph(
    notes: Iterable[MemoryNote], readable_ids: Mapping[MemoryId, str] | None = None
) -> list[dict[str, Any]]:
    """Notes → the evaluation-graph format (readable ids; UUIDs where no readable id is known).

    Times and link ids are not part of that format and are dropped.
    """
    notes = list(notes)
    names = dict(readable_ids or {})
    for note in notes:
        names.setdefault(note.id, str(note.id))
    out = []
    for note in notes:
        dumped = json.loads(note.model_dump_json())
        out.append(
            {
                "id": names[note.id],
                "tags": dumped["tags"],
                "mem_type": dumped["mem_type"],
                "mem_links": [
                    {
                        "from": names.get(link.from_, str(link.from_)),
                        "to": names.get(link.to, str(link.to)),
                        "intensity": link.intensity,
                        "link_type": json.loads(MemoryLink.model_validate(link).model_dump_json())[
                            "link_type"
                        ],
                    }
                    for link in note.mem_links
                ],
            }
        )
    return out
