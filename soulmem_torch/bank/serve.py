"""The HTTP JSON API of ``soulmem serve``: a :class:`MemoryBank` behind a
:class:`BatchingRetriever`, on Starlette (ASGI) + uvicorn (``pip install soulmem_torch[serve]``).

Routes (JSON in, JSON out; errors are ``{"error": "..."}`` with 400 / 404 / 422):

``GET /health``
    ``{"status": "ok", "agents": n, "notes": n, "queued": n, "answered": n, "batches": n}``
``POST /ask``
    ``{"agent": "npc-17", "text": "who lent me an umbrella?", "all": false}`` → one result
    (the memories that match the question; ``"all": true``: every fused result).
``POST /query``
    ``{"agent": "npc-17", "query": {MemoryRetrieveQuery JSON}, "priority": 0}`` → one result.
``POST /agents/{id}/notes``
    ``{"notes": [note, ...], "names": {"<note id>": "name"}}`` → ``{"agent": id, "added": n,
    "notes": n, "ids": [...]}``; a note is a plain ``{"text": "I like tea", "kind": "semantic",
    "tags": [...], "name": "sem_tea", "link_to": "...", "verb": "..."}`` (the fields of
    ``SoulMem.remember``) or a ``MemoryNote`` in the serde shape; ``names`` (optional) names
    serde notes. Creates the agent if absent (an empty list never does: 422); the agent is
    persisted to the bank directory before the reply (each agent a ``MemoryStore``, written
    atomically; then the manifest, atomically).

The agent routes (``GET /agents``, ``GET /agents/{id}``, reading and deleting notes,
``POST /agents/{id}/turns``, ``POST /agents/{id}/forget``) are in
:mod:`soulmem_torch.bank._http`. A field a route does not know is refused (422); an unknown
route or method answers a JSON error too (404 / 405).

A result is ``{"association": [{"id", "name", "score"}], "action": [...], "seeds": [...],
"short_history": [...], "short_mem": "...", "priority": n}``. Concurrent requests are answered
in micro-batches (one bank call each); writes run in queue order on the bank's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from soulmem_torch.errors import NotFoundError, SoulMemError, StoreError, ValidationError

__all__ = ["check_bank_dir", "create_app", "result_json", "run_server"]


def _missing_extra(exc: ImportError) -> SoulMemError:
    return SoulMemError(
        f"soulmem serve needs the 'serve' extra (starlette, uvicorn): "
        f"pip install 'soulmem_torch[serve]' ({exc})"
    )


def result_json(bank: Any, agent: str, result: Any) -> dict[str, Any]:
    """A ``DefaultPipelineResult`` as JSON (ids as strings, readable names, float scores)."""

    def scored(items: Any) -> list[dict[str, Any]]:
        names = bank.describe(agent, items)
        return [
            {"id": str(i), "name": name, "score": float(s)}
            for (i, s), (name, _) in zip(items, names)
        ]

    return {
        "agent": agent,
        "association": scored(result.association),
        "action": scored(result.action),
        "seeds": scored(result.seeds),
        "short_history": [str(m) for m in result.short_history],
        "short_mem": result.short_mem,
        "priority": result.priority,
    }


def create_app(
    bank_dir: str | os.PathLike[str],
    *,
    bank: Any = None,
    device: Any = None,
    config: Any = None,
    max_batch: int = 256,
    max_wait_ms: float = 2.0,
    max_queue: int = 4096,
    idle_after: float = 0.0,
    idle_interval: float = 0.0,
    idle_llm: Any = None,
) -> Any:
    """The Starlette app serving the bank stored in ``bank_dir``.

    Args:
        bank_dir: the bank directory (``MemoryBank.save`` layout); loaded at start when it holds
            a bank, else the bank starts empty and is written there on the first write.
        bank: serve this bank instead of loading one (it is still persisted to ``bank_dir``).
        device: retrieval device (``None`` → CPU, ``"auto"``, ``"cuda:1"``, …).
        config: ``DefaultPipelineConfig`` for every request (``None`` → the default).
        max_batch / max_wait_ms / max_queue: the micro-batcher's settings.
        idle_after: seconds without a request after which the bank counts as idle (0: the
            idle trigger is off).
        idle_interval: seconds between idle checks (0: off). When idle after new requests,
            the bank's thread runs ``update_plasticity`` (and, with ``idle_llm``, consolidates
            every agent whose summary is not empty), persisting to ``bank_dir`` first;
            requests that arrive meanwhile wait in the queue.
        idle_llm: the consolidation LLM ``(system, user) -> str``; ``None``: plasticity only.
    """
    try:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse
        from starlette.routing import Route
    except ImportError as exc:  # pragma: no cover - the extra is installed in CI
        raise _missing_extra(exc) from None
    from soulmem_torch.bank._http import agent_routes, build_notes, check_fields, parse_note_items
    from soulmem_torch.bank.bank import MANIFEST, MemoryBank
    from soulmem_torch.bank.batching import BatchingRetriever

    root = Path(bank_dir)
    check_bank_dir(root)
    if bank is None:
        bank = (
            MemoryBank.load(root, device=device)
            if (root / MANIFEST).exists()
            else MemoryBank(device=device)
        )
    retriever = BatchingRetriever(
        bank, max_batch=max_batch, max_wait_ms=max_wait_ms, max_queue=max_queue, config=config
    )

    activity = {"last": time.monotonic(), "pending": False, "runs": 0}

    def touched() -> None:
        activity["last"] = time.monotonic()
        activity["pending"] = True

    def idle_work(b: Any) -> None:
        b.update_plasticity(save_to=root)
        if idle_llm is not None:
            busy = [
                a for a in b.agents()
                if b._agents[a].mem is not None
                and b.agent(a).working_memory.sliding_window.summary.strip()
            ]  # fmt: skip
            if busy:
                asyncio.run(b.consolidate(busy, llm=idle_llm, save_to=root))
        activity["runs"] += 1

    async def idle_loop() -> None:
        while True:
            await asyncio.sleep(idle_interval)
            quiet = time.monotonic() - activity["last"]
            if activity["pending"] and quiet >= idle_after:
                activity["pending"] = False
                try:
                    await retriever.call(idle_work)
                except SoulMemError:  # reported by the next health check's counters
                    activity["pending"] = True

    def error(status: int, message: str) -> Any:
        return JSONResponse({"error": message}, status_code=status)

    async def body(request: Request) -> dict[str, Any]:
        try:
            data = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise _BadRequest(f"body: expected JSON, found invalid text ({exc})") from None
        if not isinstance(data, dict):
            raise _BadRequest(f"body: expected a JSON object, found {type(data).__name__}")
        return data

    def field(data: dict[str, Any], name: str, kind: type, what: str) -> Any:
        value = data.get(name)
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
            raise ValidationError(f"body.{name}: expected {what}, found {value!r}")
        return value

    async def guarded(handler: Any, request: Request) -> Any:
        try:
            return await handler(request)
        except _BadRequest as exc:
            return error(400, str(exc))
        except NotFoundError as exc:
            return error(404, str(exc.args[0]) if exc.args else str(exc))
        except ValidationError as exc:
            return error(422, str(exc))
        except SoulMemError as exc:
            return error(400, str(exc))

    async def health(request: Request) -> Any:
        stats = retriever.stats
        notes = await retriever.call(lambda b: sum(int(b.graph(a).num_nodes) for a in b.agents()))
        return JSONResponse(
            {
                "status": "ok",
                "agents": len(bank),
                "notes": notes,
                "queued": retriever.queued,
                "answered": stats.answered,
                "failed": stats.failed,
                "batches": stats.batches,
                "largest_batch": stats.largest_batch,
                "busy_seconds": round(stats.busy_seconds, 3),
                "idle_runs": activity["runs"],
            }
        )

    async def ask(request: Request) -> Any:
        data = await body(request)
        check_fields(data, ("agent", "text", "all"), "body")
        agent = field(data, "agent", str, "an agent id (string)")
        text = field(data, "text", str, "a question (string)")
        every = data.get("all", False)
        if not isinstance(every, bool):
            raise ValidationError(f"body.all: expected true or false, found {every!r}")
        result = await retriever.ask(agent, text, only_matching=not every)
        touched()
        return JSONResponse(result_json(bank, agent, result))

    async def query(request: Request) -> Any:
        from soulmem_torch.model.query import MemoryRetrieveQuery

        data = await body(request)
        check_fields(data, ("agent", "query", "priority"), "body")
        agent = field(data, "agent", str, "an agent id (string)")
        raw = field(data, "query", dict, "a MemoryRetrieveQuery JSON object")
        priority = data.get("priority", 0)
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ValidationError(f"body.priority: expected an integer, found {priority!r}")
        try:
            q = MemoryRetrieveQuery.model_validate(raw)
        except ValueError as exc:
            raise ValidationError(f"body.query: not a valid MemoryRetrieveQuery: {exc}") from None
        result = await retriever.query(agent, q, priority=priority)
        touched()
        return JSONResponse(result_json(bank, agent, result))

    async def add_notes(request: Request) -> Any:
        agent = request.path_params["agent"]
        data = await body(request)
        check_fields(data, ("notes", "names"), "body")
        raw = field(data, "notes", list, "a list of notes ({text, ...} or serde MemoryNote)")
        names_raw = data.get("names", {})
        if not isinstance(names_raw, dict) or not all(
            isinstance(v, str) and v for v in names_raw.values()
        ):
            raise ValidationError('body.names: expected an object {"<note id>": "name"}')
        items = parse_note_items(raw)

        def write(b: Any) -> tuple[int, int, list[str]]:
            if not items and agent not in b:
                raise ValidationError(
                    f"body.notes: empty; agent {agent!r} does not exist and an empty write "
                    "creates no agent"
                )
            mem = b.agent(agent) if agent in b else None
            notes, names = build_notes(items, mem)
            by_id = {str(n.id): n.id for n in notes}
            taken = {n: mid for mid, n in (mem.readable_ids if mem is not None else {}).items()}
            for key, name in names_raw.items():
                if key not in by_id:
                    raise ValidationError(f"body.names: {key!r} is not the id of a note sent")
                if taken.get(name, by_id[key]) != by_id[key] or name in names.values():
                    raise ValidationError(f"body.names: {name!r} already names another note")
                names[by_id[key]] = name
            if agent in b:
                added = b.add_notes(agent, notes, readable_ids=names)
            else:
                b.add_agent(agent, notes, readable_ids=names)
                added = len(notes)
            b.save_agent(root, agent)  # persisted (atomically) before the reply
            return added, len(b.agent(agent)), [str(n.id) for n in notes]

        added, total, ids = await retriever.call(write)
        return JSONResponse({"agent": agent, "added": added, "notes": total, "ids": ids})

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        await retriever.start()
        idle = (
            asyncio.get_running_loop().create_task(idle_loop())
            if idle_after > 0 and idle_interval > 0
            else None
        )
        try:
            yield
        finally:
            if idle is not None:
                idle.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await idle
            await retriever.aclose()

    def route(path: str, handler: Any, methods: list[str]) -> Any:
        async def endpoint(request: Request) -> Any:
            return await guarded(handler, request)

        return Route(path, endpoint, methods=methods)

    async def http_error(request: Request, exc: Any) -> Any:  # unknown route / method
        status = getattr(exc, "status_code", 500)
        detail = getattr(exc, "detail", None) or "error"
        if status == 404:
            detail = f"no route {request.method} {request.url.path} (see GET /health, /agents)"
        elif status == 405:
            detail = f"method {request.method} is not allowed on {request.url.path}"
        return error(status, detail)

    extra = agent_routes(
        bank=bank, retriever=retriever, root=root, body=body, json_response=JSONResponse
    )
    app = Starlette(
        routes=[
            route("/health", health, ["GET"]),
            route("/ask", ask, ["POST"]),
            route("/query", query, ["POST"]),
            route("/agents/{agent}/notes", add_notes, ["POST"]),
            *(route(path, handler, methods) for path, handler, methods in extra),
        ],
        lifespan=lifespan,
        exception_handlers={404: http_error, 405: http_error},
    )
    app.state.bank = bank
    app.state.retriever = retriever
    return app


class _BadRequest(Exception):
    """Malformed request body (400)."""


def check_bank_dir(root: Path) -> None:
    """Refuses a path that is neither a bank directory nor empty / missing (a store, a file)."""
    from soulmem_torch.bank.bank import MANIFEST

    if not root.exists():
        return
    if not root.is_dir():
        raise StoreError(f"bank_dir: {str(root)!r} is a file, expected a bank directory")
    if (root / MANIFEST).exists():
        return
    entries = sorted(p.name for p in root.iterdir())
    if entries:
        what = (
            "a memory store (serve a bank: MemoryBank.save(dir), or POST its notes to a new "
            "bank directory)"
            if (root / "CURRENT").exists() or (root / "LOCK").exists()
            else f"{len(entries)} other entries ({', '.join(entries[:3])})"
        )
        raise StoreError(
            f"bank_dir: {str(root)!r} holds no bank ({MANIFEST} is missing) but {what}; give a "
            "bank directory, an empty directory or a new path"
        )


def run_server(
    bank_dir: str | os.PathLike[str],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "warning",
    announce: Any = None,
    **options: Any,
) -> None:
    """Serves ``bank_dir`` with uvicorn until interrupted (see :func:`create_app`).

    The socket is bound first; ``announce(host, port)`` is then called with the port actually
    bound (``port=0`` lets the system choose one)."""
    try:
        import uvicorn
    except ImportError as exc:  # pragma: no cover - the extra is installed in CI
        raise _missing_extra(exc) from None
    import socket

    app = create_app(bank_dir, **options)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise SoulMemError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    bound = sock.getsockname()[1]  # the real port (for --port 0: the one the system chose)
    if announce is not None:
        announce(host, bound)
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level))
    server.run(sockets=[sock])
