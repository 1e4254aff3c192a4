"""The HTTP JSON API of ``soulmem serve``: a :class:`MemoryBank` behind a
:class:`BatchingRetriever`, on Starlette (ASGI) + uvicorn (``pip install soulmem_torch[serve]``).

Routes (JSON in, JSON out; every error is ``{"error": "..."}``: 400 malformed body, 404 unknown
agent, 409 a damaged agent, 413 a body / text / batch over the limits, 422 invalid values, 429
the queue is full, 503 the server's own trouble — a full disk, too many connections, the agent
cap — and 500 anything unexpected):

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
    serde notes. Creates the agent if absent (an empty list never does: 422). The write is validated
    completely first (note shapes, text that cannot be stored as UTF-8, the limits), then
    applied and persisted as one SQLite transaction touching only those notes' rows
    (``BANK_DIR/bank.sqlite3``) before the reply; if anything fails the agent is put back as
    it is on disk — a refused note is never served nor persisted later.

The agent routes (``GET /agents``, ``GET /agents/{id}``, reading and deleting notes,
``POST /agents/{id}/turns``, ``POST /agents/{id}/forget``) are in
:mod:`soulmem_torch.bank._http`. A field a route does not know is refused (422); an unknown
route or method answers a JSON error too (404 / 405).

Limits (:class:`ServerLimits`, ``soulmem serve --max-body-bytes`` …): request body 8 MiB, a
question or a note's JSON 20,000 characters, 1,000 notes per write, 100,000 agents, idle
connections closed after 15 s, 512 concurrent connections. One server per bank directory: a
second one is refused (an OS lock on ``BANK_DIR/SERVE.lock``).

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
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from soulmem_torch.errors import NotFoundError, SoulMemError, StoreError, ValidationError

__all__ = ["SERVE_LOCK", "ServerBusyError", "ServerLimits", "check_bank_dir", "create_app",
           "result_json", "run_server"]  # fmt: skip

SERVE_LOCK = "SERVE.lock"


class ServerBusyError(StoreError):
    """Another ``soulmem serve`` already serves this bank directory."""


@dataclass(frozen=True)
class ServerLimits:
    """What one request and the server may take (every field ≥ 1).

    Attributes:
        max_body_bytes: a request body (413 beyond).
        max_text_chars: an ``/ask`` question, or one note's serde JSON (413 beyond).
        max_batch: notes in one write (413 beyond).
        max_agents: agents in the bank; a write that would create one more is 503.
        idle_timeout_s: a connection that sends nothing for this long is closed (also before
            its first request).
        max_connections: open connections (and requests in flight); beyond, 503.
    """

    max_body_bytes: int = 8 * 1024 * 1024
    max_text_chars: int = 20_000
    max_batch: int = 1_000
    max_agents: int = 100_000
    idle_timeout_s: float = 15.0
    max_connections: int = 512

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 1:
                if f.name == "idle_timeout_s" and isinstance(value, (int, float)) and value > 0:
                    continue
                raise ValidationError(f"limits.{f.name}: expected a number ≥ 1, found {value!r}")


class _TooLarge(Exception):
    """A body, text or batch over the limits (413)."""


class _Unavailable(Exception):
    """The server cannot take this request now (503)."""


def _lock_bank_dir(root: Path) -> Any:
    import filelock

    root.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(root / SERVE_LOCK, thread_local=False, is_singleton=False)
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        raise ServerBusyError(
            f"{root}: another soulmem serve is serving this bank (it holds {root / SERVE_LOCK}); "
            "two servers on one bank would overwrite each other's writes — stop the other one "
            "or serve another directory"
        ) from None
    return lock


def _open_bank(root: Path, embedder: Any, device: Any, on_mismatch: str) -> Any:
    from soulmem_torch.bank._persist import BANK_DB, LEGACY_MANIFEST
    from soulmem_torch.bank.bank import MemoryBank

    if (root / BANK_DB).exists() or (root / LEGACY_MANIFEST).exists() or (root / "agents").is_dir():
        return MemoryBank.load(
            root, embedder=embedder, device=device, on_embedder_mismatch=on_mismatch
        )
    if (root / "store.sqlite3").exists() or (root / "CURRENT").exists():
        raise StoreError(
            f"{root}: holds a memory store, not a bank; serve a bank directory (an empty or new "
            "directory starts an empty bank)"
        )
    return MemoryBank(embedder=embedder, device=device)


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
    embedder: Any = None,
    on_embedder_mismatch: str = "reembed",
    limits: ServerLimits | None = None,
    lock: bool = True,
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
        embedder: the bank's embedder (``None`` → the offline ``HashingEmbedder``); stored
            vectors of another embedder are re-embedded (``on_embedder_mismatch="reembed"``)
            or refused (``"refuse"``).
        limits: :class:`ServerLimits` (``None`` → the defaults).
        lock: hold ``bank_dir/SERVE.lock`` while the app lives (a second server on the same
            directory raises :class:`ServerBusyError`); released at shutdown.
    """
    try:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse
        from starlette.routing import Route
    except ImportError as exc:  # pragma: no cover - the extra is installed in CI
        raise _missing_extra(exc) from None
    from soulmem_torch.bank._http import agent_routes, build_notes, check_fields, parse_note_items
    from soulmem_torch.bank._persist import DamagedAgentError
    from soulmem_torch.bank.batching import BatchingRetriever
    from soulmem_torch.store import StoreLockedError, StoreWriteError

    limits = ServerLimits() if limits is None else limits
    if not isinstance(limits, ServerLimits):
        raise ValidationError(f"limits: expected a ServerLimits, found {type(limits).__name__}")
    root = Path(bank_dir)
    check_bank_dir(root)
    held = _lock_bank_dir(root) if lock else None
    try:
        if bank is None:
            bank = _open_bank(root, embedder, device, on_embedder_mismatch)
        bank._served = held is not None  # its writes hold the directory's SERVE.lock
    except BaseException:
        if held is not None:
            held.release()
        raise
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
        cap = limits.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > cap:
            raise _TooLarge(f"body: {declared} bytes, more than the limit of {cap} bytes")
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > cap:
                raise _TooLarge(f"body: more than the limit of {cap} bytes")
            chunks.append(chunk)
        try:
            data = json.loads(b"".join(chunks))
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
        except _TooLarge as exc:
            return error(413, str(exc))
        except _Unavailable as exc:
            return error(503, str(exc))
        except NotFoundError as exc:
            return error(404, str(exc.args[0]) if exc.args else str(exc))
        except ValidationError as exc:
            return error(422, str(exc))
        except DamagedAgentError as exc:
            return error(409, str(exc))
        except (StoreWriteError, StoreLockedError) as exc:
            return error(503, f"the server could not store the write: {exc}")
        except StoreError as exc:
            return error(500, f"the server's stored data is damaged: {exc}")
        except SoulMemError as exc:
            return error(400, str(exc))
        except Exception as exc:  # never a bare 500 page
            return error(500, f"internal error ({type(exc).__name__}: {exc})")

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
        if len(text) > limits.max_text_chars:
            raise _TooLarge(
                f"body.text: {len(text)} characters, more than the limit of {limits.max_text_chars}"
            )
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
        if len(raw) > limits.max_batch:
            raise _TooLarge(
                f"body.notes: {len(raw)} notes, more than the limit of {limits.max_batch} per write"
            )
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
            if agent not in b and len(b) >= limits.max_agents:
                raise _Unavailable(
                    f"the bank holds {len(b)} agents, the limit (--max-agents); agent "
                    f"{agent!r} was not created"
                )
            mem = b.agent(agent) if agent in b else None
            notes, names = build_notes(items, mem)
            for i, note in enumerate(notes):
                size = len(note.to_json())
                if size > limits.max_text_chars:
                    raise _TooLarge(
                        f"body.notes[{i}]: {size} characters of JSON, more than the limit of "
                        f"{limits.max_text_chars}"
                    )
            by_id = {str(n.id): n.id for n in notes}
            taken = {n: mid for mid, n in (mem.readable_ids if mem is not None else {}).items()}
            for key, name in names_raw.items():
                if key not in by_id:
                    raise ValidationError(f"body.names: {key!r} is not the id of a note sent")
                if taken.get(name, by_id[key]) != by_id[key] or name in names.values():
                    raise ValidationError(f"body.names: {name!r} already names another note")
                names[by_id[key]] = name
            # validated, applied and persisted as one transaction; rolled back on failure
            added, total = b.write_notes(root, agent, notes, readable_ids=names or None)
            return added, total, [str(n.id) for n in notes]

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
            if held is not None:
                held.release()

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
    starlette_app = Starlette(
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
    app = _Guard(starlette_app, limits.max_connections)
    starlette_app.state.bank = bank
    starlette_app.state.retriever = retriever
    starlette_app.state.limits = limits
    starlette_app.state.release = held.release if held is not None else (lambda: None)
    return app


class _Guard:
    """The ASGI app with a cap on requests in flight (503 JSON beyond) and a JSON 404 / 405
    for what Starlette would answer in plain text."""

    def __init__(self, app: Any, max_in_flight: int) -> None:
        self.app = app
        self.state = app.state
        self.routes = app.routes
        self.max_in_flight = max_in_flight
        self.in_flight = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.max_in_flight:
            await _send_json(send, 503, {"error": f"the server is at its limit of "
                                                  f"{self.max_in_flight} requests in flight; "
                                                  "retry shortly"})  # fmt: skip
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


async def _send_json(send: Any, status: int, data: dict[str, Any]) -> None:
    payload = json.dumps(data).encode("utf-8")
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
        (b"connection", b"close"), (b"retry-after", b"1"),
    ]})  # fmt: skip
    await send({"type": "http.response.body", "body": payload, "more_body": False})


async def _json_service_unavailable(scope: Any, receive: Any, send: Any) -> None:
    await _send_json(send, 503, {"error": "too many open connections; retry shortly"})


def _idle_protocol() -> Any:
    """uvicorn's h11 protocol, with the idle timer armed from the moment a connection opens
    (uvicorn arms it only after a first response, so silent connections stayed forever)."""
    from uvicorn.protocols.http import h11_impl

    h11_impl.service_unavailable = _json_service_unavailable  # the connection cap's 503: JSON

    class IdleTimeoutH11(h11_impl.H11Protocol):
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

    return IdleTimeoutH11


class _BadRequest(Exception):
    """Malformed request body (400)."""


def check_bank_dir(root: Path) -> None:
    """Refuses a path that is neither a bank directory nor empty / missing (a store, a file)."""
    from soulmem_torch.bank._persist import BANK_DB, LEGACY_MANIFEST

    if not root.exists():
        return
    if not root.is_dir():
        raise StoreError(f"bank_dir: {str(root)!r} is a file, expected a bank directory")
    if (root / BANK_DB).exists() or (root / LEGACY_MANIFEST).exists() or (root / "agents").is_dir():
        return
    entries = sorted(p.name for p in root.iterdir() if p.name not in (SERVE_LOCK,))
    if entries:
        what = (
            "a memory store (serve a bank: MemoryBank.save(dir), or POST its notes to a new "
            "bank directory)"
            if (root / "store.sqlite3").exists()
            or (root / "CURRENT").exists()
            or (root / "LOCK").exists()
            else f"{len(entries)} other entries ({', '.join(entries[:3])})"
        )
        raise StoreError(
            f"bank_dir: {str(root)!r} holds no bank ({BANK_DB} is missing) but {what}; give a "
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

    limits = options.get("limits") or ServerLimits()
    app = create_app(bank_dir, **options)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        app.state.release()
        raise SoulMemError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    bound = sock.getsockname()[1]  # the real port (for --port 0: the one the system chose)
    if announce is not None:
        announce(host, bound)
    try:
        server = uvicorn.Server(
            uvicorn.Config(
                app, log_level=log_level, http=_idle_protocol(),
                timeout_keep_alive=limits.idle_timeout_s,
                limit_concurrency=limits.max_connections,
            )
        )  # fmt: skip
        server.run(sockets=[sock])
    finally:
        app.state.release()
