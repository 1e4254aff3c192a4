"""The HTTP JSON API of ``soulmem serve``: a :class:`MemoryBank` behind a
:class:`BatchingRetriever`, on Starlette (ASGI) + uvicorn (``pip install soulmem_torch[serve]``).

Routes (JSON in, JSON out; every error is ``{"error": "..."}``: 400 malformed body, 404 unknown
agent, 409 a damaged agent, 413 a body / text / batch over the limits, 422 invalid values, 429
the queue is full, 503 the server's own trouble — a full disk, too many connections, the agent
cap — and 500 anything unexpected):

``GET /health``
    ``{"status": "ok", "agents": n, "notes": n, "queued": n, "answered": n, "batches": n}``
``POST /ask``
    ``{"agent": "npc-17", "text": "who lent me an umbrella?"}`` → one result.
``POST /query``
    ``{"agent": "npc-17", "query": {MemoryRetrieveQuery JSON}, "priority": 0}`` → one result.
``POST /agents/{id}/notes``
    ``{"notes": [MemoryNote serde JSON, ...]}`` → ``{"agent": id, "added": n, "notes": n}``;
    creates the agent if absent. The write is validated completely first (note shapes, text
    that cannot be stored as UTF-8, the limits), then applied and persisted as one SQLite
    transaction touching only those notes' rows (``BANK_DIR/bank.sqlite3``) before the reply;
    if anything fails the agent is put back as it is on disk — a refused note is never served
    nor persisted later.

Limits (:class:`ServerLimits`, ``soulmem serve --max-body-bytes`` …): request body 8 MiB, a
question or a note's JSON 20,000 characters, 1,000 notes per write, 100,000 agents, idle
connections closed after 15 s, 512 concurrent connections. One server per bank directory: a
second one is refused (an OS lock on ``BANK_DIR/SERVE.lock``).

A result is ``{"association": [{"id", "name", "score"}], "action": [...], "seeds": [...],
"short_history": [...], "short_mem": "...", "priority": n}``. Concurrent requests are answered
in micro-batches (one bank call each); writes run in queue order on the bank's thread.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from soulmem_torch.errors import NotFoundError, SoulMemError, StoreError, ValidationError

__all__ = ["SERVE_LOCK", "ServerBusyError", "ServerLimits", "create_app", "result_json",
           "run_server"]  # fmt: skip

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
    from soulmem_torch.bank._persist import DamagedAgentError
    from soulmem_torch.bank.batching import BatchingRetriever
    from soulmem_torch.store import StoreLockedError, StoreWriteError

    limits = ServerLimits() if limits is None else limits
    if not isinstance(limits, ServerLimits):
        raise ValidationError(f"limits: expected a ServerLimits, found {type(limits).__name__}")
    root = Path(bank_dir)
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
            }
        )

    async def ask(request: Request) -> Any:
        data = await body(request)
        agent = field(data, "agent", str, "an agent id (string)")
        text = field(data, "text", str, "a question (string)")
        if len(text) > limits.max_text_chars:
            raise _TooLarge(
                f"body.text: {len(text)} characters, more than the limit of {limits.max_text_chars}"
            )
        result = await retriever.ask(agent, text)
        return JSONResponse(result_json(bank, agent, result))

    async def query(request: Request) -> Any:
        from soulmem_torch.model.query import MemoryRetrieveQuery

        data = await body(request)
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
        return JSONResponse(result_json(bank, agent, result))

    async def add_notes(request: Request) -> Any:
        from soulmem_torch.model.serde_io import parse_notes_text

        agent = request.path_params["agent"]
        data = await body(request)
        raw = field(data, "notes", list, "a list of MemoryNote JSON objects")
        if len(raw) > limits.max_batch:
            raise _TooLarge(
                f"body.notes: {len(raw)} notes, more than the limit of {limits.max_batch} per write"
            )
        notes = parse_notes_text(json.dumps(raw), source="body.notes")
        for i, note in enumerate(notes):
            size = len(note.to_json())
            if size > limits.max_text_chars:
                raise _TooLarge(
                    f"body.notes[{i}]: {size} characters of JSON, more than the limit of "
                    f"{limits.max_text_chars}"
                )

        def write(b: Any) -> tuple[int, int]:
            if agent not in b and len(b) >= limits.max_agents:
                raise _Unavailable(
                    f"the bank holds {len(b)} agents, the limit (--max-agents); agent "
                    f"{agent!r} was not created"
                )
            # validated, applied and persisted as one transaction; rolled back on failure
            return b.write_notes(root, agent, notes)

        added, total = await retriever.call(write)
        return JSONResponse({"agent": agent, "added": added, "notes": total})

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        await retriever.start()
        try:
            yield
        finally:
            await retriever.aclose()
            if held is not None:
                held.release()

    def route(path: str, handler: Any, methods: list[str]) -> Any:
        async def endpoint(request: Request) -> Any:
            return await guarded(handler, request)

        return Route(path, endpoint, methods=methods)

    starlette_app = Starlette(
        routes=[
            route("/health", health, ["GET"]),
            route("/ask", ask, ["POST"]),
            route("/query", query, ["POST"]),
            route("/agents/{agent}/notes", add_notes, ["POST"]),
        ],
        lifespan=lifespan,
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


def run_server(
    bank_dir: str | os.PathLike[str],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "warning",
    **options: Any,
) -> None:
    """Serves ``bank_dir`` with uvicorn until interrupted (see :func:`create_app`)."""
    try:
        import uvicorn
    except ImportError as exc:  # pragma: no cover - the extra is installed in CI
        raise _missing_extra(exc) from None
    limits = options.get("limits") or ServerLimits()
    app = create_app(bank_dir, **options)
    try:
        uvicorn.run(
            app, host=host, port=port, log_level=log_level, http=_idle_protocol(),
            timeout_keep_alive=limits.idle_timeout_s, limit_concurrency=limits.max_connections,
        )  # fmt: skip
    finally:
        app.state.release()
