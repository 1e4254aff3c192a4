"""``BatchingRetriever``: concurrent ``await r.ask(agent, text)`` calls answered in batches.

Requests wait in a bounded ``asyncio.Queue`` (a full queue makes callers wait: backpressure).
One worker task takes the first waiting request, gathers more for up to ``max_wait_ms`` or
until ``max_batch`` are in hand, and answers them with one :class:`MemoryBank` call run in a
worker thread (the event loop stays free). Every bank call — reads and writes — runs on that
one thread, in queue order, so a write (``add_notes``) is never seen half-done by a batch.

* A bad request fails alone: it is checked before it joins a batch (unknown agent, empty
  text), and if a batch call still raises, the batch is split in halves and retried until the
  failing requests are isolated; every other request gets its answer.
* Cancellation-safe: a caller cancelled while waiting is dropped (its slot in the batch is
  skipped, or its result discarded); the others are unaffected. :meth:`aclose` fails the
  requests still queued with :class:`RetrieverClosedError`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from dataclasses import dataclass, field
from typing import Any

from soulmem_torch.errors import NotFoundError, SoulMemError, ValidationError

__all__ = ["BatchingRetriever", "RetrieverClosedError", "RetrieverStats"]


class RetrieverClosedError(SoulMemError, RuntimeError):
    """The retriever was closed before the request was answered."""


@dataclass
class RetrieverStats:
    """Counters: requests answered / failed, bank calls, the largest batch."""

    answered: int = 0
    failed: int = 0
    batches: int = 0
    largest_batch: int = 0
    busy_seconds: float = 0.0


@dataclass
class _Item:
    kind: str  # "ask" | "query" | "call"
    agent: str | None
    payload: Any
    future: asyncio.Future[Any]
    priority: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def _positive(name: str, value: Any, *, integer: bool) -> Any:
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or value < (1 if integer else 0):
        want = "an int >= 1" if integer else "a number >= 0"
        raise ValidationError(f"{name}: expected {want}, found {value!r}")
    return value


class BatchingRetriever:
    """Micro-batches concurrent requests to a :class:`~soulmem_torch.bank.MemoryBank`.

    Args:
        bank: the bank (only this retriever should call it while it runs).
        max_batch: >= 1. Most requests per bank call.
        max_wait_ms: >= 0. How long the first request of a batch waits for company.
        max_queue: >= 1. Queue bound; ``ask`` waits while the queue is full.
        config: ``DefaultPipelineConfig`` for every request (``None`` → the default).

    Use it inside a running event loop, as an async context manager or with :meth:`start` /
    :meth:`aclose`::

        async with BatchingRetriever(bank, max_batch=256, max_wait_ms=2) as r:
            result = await r.ask("npc-17", "who lent me an umbrella?")
    """

    def __init__(
        self,
        bank: Any,
        *,
        max_batch: int = 256,
        max_wait_ms: float = 2.0,
        max_queue: int = 4096,
        config: Any = None,
    ) -> None:
        self.bank = bank
        self.max_batch = _positive("max_batch", max_batch, integer=True)
        self.max_wait = _positive("max_wait_ms", max_wait_ms, integer=False) / 1000.0
        self.max_queue = _positive("max_queue", max_queue, integer=True)
        self.config = config
        self.stats = RetrieverStats()
        self._queue: asyncio.Queue[_Item] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._closed = False
        self._inflight: list[_Item] = []
        self._getter: asyncio.Future[_Item] | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> BatchingRetriever:
        """Starts the worker (idempotent)."""
        if self._closed:
            raise RetrieverClosedError("retriever: it was closed; make a new one")
        if self._worker is None:
            self._queue = asyncio.Queue(maxsize=self.max_queue)
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="soulmem-bank"
            )
            self._worker = asyncio.get_running_loop().create_task(self._run())
        return self

    async def aclose(self) -> None:
        """Stops the worker; queued requests fail with :class:`RetrieverClosedError`."""
        self._closed = True
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
            self._worker = None
        pending = list(self._inflight)
        if self._getter is not None:
            if self._getter.done() and not self._getter.cancelled():
                pending.append(self._getter.result())
            else:
                self._getter.cancel()
            self._getter = None
        if self._queue is not None:
            while not self._queue.empty():
                pending.append(self._queue.get_nowait())
        for item in pending:
            if not item.future.done():
                item.future.set_exception(RetrieverClosedError("retriever: closed"))
        self._inflight = []
        if self._executor is not None:
            executor, self._executor = self._executor, None
            # a bank call in flight finishes on its thread; wait for it without blocking the loop
            await asyncio.get_running_loop().run_in_executor(None, executor.shutdown, True)

    async def __aenter__(self) -> BatchingRetriever:
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    @property
    def queued(self) -> int:
        """Requests waiting in the queue."""
        return 0 if self._queue is None else self._queue.qsize()

    # -- requests ----------------------------------------------------------------------------
    def _check_agent(self, agent: Any) -> str:
        if not isinstance(agent, str) or not agent:
            raise ValidationError(f"agent: expected a non-empty string, found {agent!r}")
        if agent not in self.bank:
            raise NotFoundError(f"agent: {agent!r} is not in the bank")
        return agent

    async def _submit(self, item: _Item) -> Any:
        if self._closed:
            raise RetrieverClosedError("retriever: closed")
        await self.start()
        assert self._queue is not None
        await self._queue.put(item)  # waits while the queue is full (backpressure)
        return await item.future

    async def ask(self, agent: str, text: str, *, only_matching: bool = True) -> Any:
        """One free-text question to one agent (``MemoryBank.ask``), batched with others
        (``only_matching=False``: every fused result, see ``MemoryBank.ask``)."""
        self._check_agent(agent)
        if not isinstance(text, str) or not text.strip():
            raise ValidationError(f"text: expected a non-empty string, found {text!r}")
        if not isinstance(only_matching, bool):
            raise ValidationError(f"only_matching: expected a bool, found {only_matching!r}")
        loop = asyncio.get_running_loop()
        item = _Item("ask", agent, text, loop.create_future())
        if not only_matching:
            item.extra["only_matching"] = False
        return await self._submit(item)

    async def query(self, agent: str, query: Any, *, priority: int = 0) -> Any:
        """One structured (or plain) query to one agent (``MemoryBank.query``), batched."""
        self._check_agent(agent)
        loop = asyncio.get_running_loop()
        return await self._submit(_Item("query", agent, query, loop.create_future(), priority))

    async def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Runs ``fn(bank, *args, **kwargs)`` on the bank's thread, in queue order (for writes:
        ``await r.call(lambda b: b.add_notes("npc-17", notes))``)."""
        loop = asyncio.get_running_loop()
        item = _Item("call", None, (fn, args, kwargs), loop.create_future())
        return await self._submit(item)

    # -- the worker --------------------------------------------------------------------------
    async def _next(self, timeout: float | None) -> _Item | None:
        """The next queued request, or ``None`` after ``timeout`` seconds.

        One ``queue.get()`` task is kept across calls and never cancelled on a timeout
        (``asyncio.wait_for`` around ``Queue.get`` can drop an item that arrives just as the
        timeout fires, before Python 3.12): no request is ever lost.
        """
        assert self._queue is not None
        if self._getter is None:
            try:
                return self._queue.get_nowait()
            except asyncio.QueueEmpty:
                self._getter = asyncio.ensure_future(self._queue.get())
        if timeout is not None and timeout <= 0 and not self._getter.done():
            return None
        done, _ = await asyncio.wait({self._getter}, timeout=timeout)
        if not done:
            return None
        item = self._getter.result()
        self._getter = None
        return item

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        held: _Item | None = None
        while True:
            first = held if held is not None else await self._next(None)
            held = None
            assert first is not None
            if first.kind == "call":
                await self._run_call(first)
                continue
            batch = [first]
            deadline = loop.time() + self.max_wait
            while len(batch) < self.max_batch:
                nxt = await self._next(deadline - loop.time())
                if nxt is None:
                    break
                if nxt.kind == "call":  # a write: answer the reads gathered so far first
                    held = nxt
                    break
                batch.append(nxt)
            live = [it for it in batch if not it.future.done()]  # drop cancelled callers
            if live:
                await self._answer(live)

    async def _run_call(self, item: _Item) -> None:
        if item.future.done():
            return
        fn, args, kwargs = item.payload
        loop = asyncio.get_running_loop()
        self._inflight = [item]
        try:
            result = await loop.run_in_executor(
                self._executor, lambda: fn(self.bank, *args, **kwargs)
            )
        except Exception as exc:
            if not item.future.done():
                item.future.set_exception(exc)
            return
        if not item.future.done():
            item.future.set_result(result)

    def _bank_call(self, items: list[_Item]) -> list[Any]:
        """One bank call for a batch (asks and queries run as two calls when mixed)."""
        out: list[Any] = [None] * len(items)
        asks = [i for i, it in enumerate(items) if it.kind == "ask"]
        queries = [i for i, it in enumerate(items) if it.kind == "query"]
        if asks:
            flags = [items[i].extra.get("only_matching", True) for i in asks]
            # passed only when asked for, so any bank with MemoryBank.ask's first arguments fits
            extra = {} if all(flags) else {"only_matching": flags}
            res = self.bank.ask(
                [items[i].agent for i in asks], [items[i].payload for i in asks],
                config=self.config, **extra,
            )  # fmt: skip
            for i, r in zip(asks, res):
                out[i] = r
        if queries:
            res = self.bank.query(
                [(items[i].agent, items[i].payload) for i in queries],
                config=self.config,
                priorities=[items[i].priority for i in queries],
            )
            for i, r in zip(queries, res):
                out[i] = r
        return out

    async def _answer(self, items: list[_Item]) -> None:
        loop = asyncio.get_running_loop()
        start = time.perf_counter()
        self._inflight = items
        try:
            results = await loop.run_in_executor(self._executor, self._bank_call, items)
        except Exception as exc:
            if len(items) == 1:
                self.stats.failed += 1
                if not items[0].future.done():
                    items[0].future.set_exception(exc)
                return
            half = len(items) // 2
            await self._answer(items[:half])
            await self._answer(items[half:])
            return
        finally:
            self.stats.busy_seconds += time.perf_counter() - start
        self.stats.batches += 1
        self.stats.largest_batch = max(self.stats.largest_batch, len(items))
        for item, result in zip(items, results):
            if not item.future.done():
                item.future.set_result(result)
                self.stats.answered += 1
