"""The agent routes of ``soulmem serve`` and the request-body helpers they share.

Kept apart from :mod:`soulmem_torch.bank.serve` (which builds the app and owns the query
routes and the write path): the plain-text note form, field checks that refuse unknown fields,
and the routes that list, read, delete and forget an agent's notes and push chat turns.

Routes (every error a JSON ``{"error": "..."}``):

``GET /agents``
    ``{"agents": [{"id", "notes", "links"}, ...]}`` in the order they were added.
``GET /agents/{id}``
    ``{"id", "notes", "links", "names": {name: note id}, "window": n, "summary": "..."}``.
``GET /agents/{id}/notes``
    ``{"agent", "notes": [{"id", "name", "kind", "label", "note": serde JSON}, ...]}``.
``GET /agents/{id}/notes/{note}`` / ``DELETE /agents/{id}/notes/{note}``
    one note (by readable id or id) / remove it (and its links; persisted before the reply).
``POST /agents/{id}/turns``
    ``{"turns": [{"role": "user" | "assistant", "text": "..."}, ...]}`` (or ``{"text": "..."}``
    for one user turn) → pushed into the agent's short-term window (``short_history`` of later
    answers); the window lives in the server process and is not persisted.
``POST /agents/{id}/forget``
    ``{"now": RFC 3339 (default now), "dry_run": false}`` → mask-only forgetting of the agent's
    notes at ``now`` (no LLM on the server), persisted before the reply unless ``dry_run``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from soulmem_torch.errors import NotFoundError, ValidationError

__all__ = ["SIMPLE_NOTE_FIELDS", "agent_routes", "build_notes", "check_fields", "parse_note_items"]

#: The fields of a plain-text note in ``POST /agents/{id}/notes`` (``{"text": ...}`` form).
SIMPLE_NOTE_FIELDS = frozenset(
    {
        "text", "kind", "time", "tags", "name", "link_to", "verb", "trigger", "situation_link",
        "confidence", "link_intensity", "aliases", "description", "abstract", "location",
        "participants", "action_type", "role", "tone", "initiator", "target", "intensity",
    }
)  # fmt: skip


def check_fields(data: dict[str, Any], allowed: Sequence[str] | frozenset[str], where: str) -> None:
    """Refuses fields a route does not know (a typo is an error, not silently ignored)."""
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise ValidationError(
            f"{where}: unknown field(s) {', '.join(map(repr, unknown))}; expected "
            f"{', '.join(sorted(allowed))}"
        )


def parse_note_items(raw: list[Any], where: str = "body.notes") -> list[Any]:
    """Each item a ``MemoryNote`` (the serde shape: an object with ``mem_type``) or a dict of
    plain-text fields (an object with ``text``), checked here; built by :func:`build_notes`."""
    import json

    from soulmem_torch.model.serde_io import parse_notes_text

    out: list[Any] = []
    serde: list[tuple[int, Any]] = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise ValidationError(
                f"{where}[{i}]: expected a note object, found {type(item).__name__}"
            )
        if "mem_type" in item:
            serde.append((i, item))
            out.append(None)
            continue
        if "text" not in item:
            raise ValidationError(
                f'{where}[{i}]: expected a plain note {{"text": ..., "kind": ...}} or a '
                "MemoryNote in the serde shape (with mem_type)"
            )
        check_fields(item, SIMPLE_NOTE_FIELDS, f"{where}[{i}]")
        out.append(dict(item))
    if serde:
        notes = parse_notes_text(json.dumps([item for _, item in serde]), source=where)
        for (i, _), note in zip(serde, notes):
            out[i] = note
    return out


def build_notes(items: list[Any], mem: Any) -> tuple[list[Any], dict[Any, str]]:
    """The notes of :func:`parse_note_items` and the readable ids given with them.

    ``mem`` is the agent's ``SoulMem`` (``None`` for a new agent): ``link_to`` is resolved
    against its notes and the names given earlier in the same request.
    """
    from soulmem_torch.model import MemoryNote
    from soulmem_torch.model.remember import add_link, link_type, note_from_text

    notes: list[Any] = []
    names: dict[Any, str] = {}
    taken = dict(mem.readable_ids) if mem is not None else {}
    for i, item in enumerate(items):
        if isinstance(item, MemoryNote):
            notes.append(item)
            continue
        fields = dict(item)
        where = f"body.notes[{i}]"
        text = fields.pop("text")
        name = fields.pop("name", None)
        link = {k: fields.pop(k) for k in ("link_to", "verb", "trigger", "situation_link")
                if k in fields}  # fmt: skip
        confidence = fields.pop("confidence", 1.0)
        link_intensity = fields.pop("link_intensity", 1.0)
        try:
            note = note_from_text(text, **fields)
            if name is not None:
                if not isinstance(name, str) or not name.strip():
                    raise ValidationError(f"name: expected a non-empty string, found {name!r}")
                if name in taken.values() or name in names.values():
                    raise ValidationError(f"name: {name!r} already names another note")
            if "link_to" in link:
                target = _resolve(link.pop("link_to"), mem, names, notes)
                kind = link_type(
                    verb=link.get("verb"),
                    trigger=link.get("trigger"),
                    situation_link=link.get("situation_link"),
                    confidence=confidence,
                )
                add_link(note, target, kind, intensity=link_intensity)
            elif link:
                raise ValidationError("link_to: verb / trigger / situation_link need a link_to")
        except (ValidationError, NotFoundError) as exc:  # a bad field of the body: 422
            raise ValidationError(f"{where}.{exc}") from None
        except TypeError as exc:  # a field of the wrong JSON type
            raise ValidationError(f"{where}: {exc}") from None
        notes.append(note)
        if name is not None:
            names[note.id] = name
    return notes, names


def _resolve(ref: Any, mem: Any, names: dict[Any, str], earlier: list[Any]) -> Any:
    from soulmem_torch.model import MemoryId

    for mid, name in names.items():
        if name == ref:
            return mid
    for note in earlier:
        if str(note.id) == ref:
            return note.id
    if mem is not None:
        try:
            return mem.id_of(ref)
        except NotFoundError:
            pass
    if isinstance(ref, str):
        try:
            return MemoryId(ref)  # a note not here yet: the link is kept pending
        except (ValueError, TypeError):
            pass
    raise NotFoundError(f"link_to: {ref!r} is no readable id or id of this agent's notes")


def _note_json(mem: Any, note: Any) -> dict[str, Any]:
    import json

    from soulmem_torch.model.label import note_label

    return {
        "id": str(note.id),
        "name": mem.readable_ids.get(note.id),
        "kind": note.kind,
        "label": note_label(note, width=200),
        "note": json.loads(note.to_json()),
    }


def agent_routes(
    *,
    bank: Any,
    retriever: Any,
    root: Any,
    body: Callable[..., Any],
    json_response: Callable[..., Any],
) -> list[tuple[str, Any, list[str]]]:
    """``(path, handler, methods)`` of the agent routes (see the module doc)."""

    def notes_view(b: Any, agent: str) -> Any:
        mem = b.agent(agent)  # NotFoundError → 404
        return mem

    async def list_agents(request: Any) -> Any:
        def read(b: Any) -> list[dict[str, Any]]:
            return [
                {
                    "id": a,
                    "notes": int(b.graph(a).num_nodes),
                    "links": int(b.graph(a).num_edges),
                }
                for a in b.agents()
            ]

        return json_response({"agents": await retriever.call(read)})

    async def get_agent(request: Any) -> Any:
        agent = request.path_params["agent"]

        def read(b: Any) -> dict[str, Any]:
            graph = b.graph(agent)
            out: dict[str, Any] = {
                "id": agent,
                "notes": int(graph.num_nodes),
                "links": int(graph.num_edges),
                "names": {},
                "window": 0,
                "summary": "",
            }
            if agent in b and b._agents[agent].mem is not None:
                mem = b.agent(agent)
                out["names"] = {name: str(mid) for mid, name in mem.readable_ids.items()
                                if mem.cluster.get(mid) is not None}  # fmt: skip
                window = mem.working_memory.sliding_window
                out["window"], out["summary"] = len(window), window.summary
            return out

        return json_response(await retriever.call(read))

    async def list_notes(request: Any) -> Any:
        agent = request.path_params["agent"]

        def read(b: Any) -> dict[str, Any]:
            mem = notes_view(b, agent)
            return {"agent": agent, "notes": [_note_json(mem, e.note) for e in mem.cluster]}

        return json_response(await retriever.call(read))

    async def get_note(request: Any) -> Any:
        agent, ref = request.path_params["agent"], request.path_params["note"]

        def read(b: Any) -> dict[str, Any]:
            mem = notes_view(b, agent)
            return _note_json(mem, mem.cluster.get(mem.id_of(ref)).note)

        return json_response(await retriever.call(read))

    async def delete_note(request: Any) -> Any:
        agent, ref = request.path_params["agent"], request.path_params["note"]

        def write(b: Any) -> dict[str, Any]:
            from soulmem_torch.bank._persist import durable

            mem = b.agent(agent)
            mid = mem.id_of(ref)
            # one transaction before the reply; on a failed write the agent is put back as on disk
            with durable(b, root, agent):
                mem.working_memory.remove_node(mid)  # the bank sees it at its next call
                mem.readable_ids.pop(mid, None)
                b._dirty = True
            return {"agent": agent, "removed": str(mid), "notes": len(b.agent(agent))}

        return json_response(await retriever.call(write))

    async def push_turns(request: Any) -> Any:
        from soulmem_torch.runtime.window import make_information

        agent = request.path_params["agent"]
        data = await body(request)
        check_fields(data, ("turns", "text"), "body")
        if ("turns" in data) == ("text" in data):
            raise ValidationError("body: expected one of turns (a list) or text (one user turn)")
        raw = data["turns"] if "turns" in data else [{"role": "user", "text": data["text"]}]
        if not isinstance(raw, list) or not raw:
            raise ValidationError(f"body.turns: expected a non-empty list, found {raw!r}")
        infos = []
        for i, turn in enumerate(raw):
            if isinstance(turn, str):
                turn = {"role": "user", "text": turn}
            if not isinstance(turn, dict):
                raise ValidationError(f"body.turns[{i}]: expected an object {{role, text}}")
            check_fields(turn, ("role", "text"), f"body.turns[{i}]")
            role, text = turn.get("role", "user"), turn.get("text")
            if role not in ("user", "assistant"):
                raise ValidationError(
                    f"body.turns[{i}].role: expected 'user' or 'assistant', found {role!r}"
                )
            if not isinstance(text, str) or not text.strip():
                raise ValidationError(f"body.turns[{i}].text: expected a non-empty string")
            infos.append(make_information(text, role))

        def write(b: Any) -> dict[str, Any]:
            window = b.agent(agent).working_memory.sliding_window

            async def push() -> None:
                for info in infos:
                    await window.push(info)

            asyncio.run(push())  # the bank's thread runs no event loop
            return {"agent": agent, "pushed": len(infos), "window": len(window)}

        return json_response(await retriever.call(write))

    async def forget(request: Any) -> Any:
        from soulmem_torch.model.remember import parse_time

        agent = request.path_params["agent"]
        data = await body(request)
        check_fields(data, ("now", "dry_run"), "body")
        now = parse_time(data.get("now"), "body.now")
        dry_run = data.get("dry_run", False)
        if not isinstance(dry_run, bool):
            raise ValidationError(f"body.dry_run: expected true or false, found {dry_run!r}")

        def write(b: Any) -> dict[str, Any]:
            mem = b.agent(agent)
            if dry_run:
                import copy

                from soulmem_torch.api import SoulMem

                trial = SoulMem(embedder=mem.embedder)
                trial.working_memory.add_nodes(
                    [copy.deepcopy(e.note) for e in mem.cluster],
                    [e.embedding for e in mem.cluster],
                )
                mem = trial
            if dry_run:
                report = asyncio.run(mem.forget(now=now, llm=None))
            else:
                from soulmem_torch.bank._persist import durable

                with durable(b, root, agent):  # persisted, or put back as on disk
                    report = asyncio.run(mem.forget(now=now, llm=None))
                    b._dirty = True
            return {
                "agent": agent,
                "now": str(now),
                "dry_run": dry_run,
                "summary": report.summary(),
                "counts": report.counts,
                "written": bool(report.written) and not dry_run,
            }

        return json_response(await retriever.call(write))

    return [
        ("/agents", list_agents, ["GET"]),
        ("/agents/{agent}", get_agent, ["GET"]),
        ("/agents/{agent}/notes", list_notes, ["GET"]),
        ("/agents/{agent}/notes/{note}", get_note, ["GET"]),
        ("/agents/{agent}/notes/{note}", delete_note, ["DELETE"]),
        ("/agents/{agent}/turns", push_turns, ["POST"]),
        ("/agents/{agent}/forget", forget, ["POST"]),
    ]
