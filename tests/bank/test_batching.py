"""BatchingRetriever: concurrent asks answered in batches, failures isolated, cancellation-safe."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from soulmem_torch import BatchingRetriever, HashingEmbedder, MemoryBank
from soulmem_torch.bank.batching import RetrieverClosedError
from soulmem_torch.errors import NotFoundError, ValidationError

from .helpers import TEXTS, assert_same_result, config, random_agent_graph, sample_notes

CFG = config("power")


@pytest.fixture(scope="module")
def bank() -> MemoryBank:
    bank = MemoryBank()
    for a in range(4):
        bank.add_agent(f"npc-{a}", sample_notes(list(range(a * 10, a * 10 + 35))))
    return bank


def test_concurrent_asks_are_batched_and_equal_direct_calls(bank) -> None:
    pairs = [(f"npc-{i % 4}", TEXTS[i % len(TEXTS)]) for i in range(40)]

    async def main():
        async with BatchingRetriever(bank, max_batch=16, max_wait_ms=20, config=CFG) as r:
            results = await asyncio.gather(*(r.ask(a, t) for a, t in pairs))
            return results, r.stats

    results, stats = asyncio.run(main())
    assert stats.answered == 40 and stats.failed == 0
    assert stats.batches < 40 and stats.largest_batch <= 16 and stats.largest_batch > 1
    want = bank.ask([a for a, _ in pairs], [t for _, t in pairs], config=CFG)
    for got, w in zip(results, want):
        assert_same_result(got, w)


def test_a_failing_request_fails_alone() -> None:
    bank = MemoryBank(embedder=HashingEmbedder(dim=4))
    for a in range(2):
        bank.add_agent_graph(f"g{a}", random_agent_graph(8, 16, 4, a))
    good = [torch.ones(4), torch.arange(4.0)]

    async def main():
        async with BatchingRetriever(bank, max_batch=8, max_wait_ms=50, config=CFG) as r:
            with pytest.raises(NotFoundError, match="'nobody' is not in the bank"):
                await r.query("nobody", good[0])
            with pytest.raises(ValidationError, match="text"):
                await r.ask("g0", "   ")
            tasks = [
                r.query("g0", good[0]),
                r.query("g1", torch.ones(5)),  # wrong width: fails inside the bank call
                r.query("g1", good[1]),
                r.query("g0", torch.full((4,), float("nan"))),
            ]
            return await asyncio.gather(*tasks, return_exceptions=True), r.stats

    out, stats = asyncio.run(main())
    assert isinstance(out[1], ValidationError) and "width 4" in str(out[1])
    assert isinstance(out[3], ValidationError) and "finite" in str(out[3])
    assert_same_result(out[0], bank.query([("g0", good[0])], config=CFG)[0])
    assert_same_result(out[2], bank.query([("g1", good[1])], config=CFG)[0])
    assert stats.failed == 2 and stats.answered == 2


def test_backpressure_and_writes_in_order(bank) -> None:
    release = threading.Event()

    async def main():
        async with BatchingRetriever(
            bank, max_batch=4, max_wait_ms=1, max_queue=3, config=CFG
        ) as r:
            blocker = asyncio.create_task(r.call(lambda b: release.wait(5)))
            await asyncio.sleep(0.05)  # the worker is now stuck in the blocking call
            tasks = [asyncio.create_task(r.ask("npc-0", TEXTS[i % 5])) for i in range(10)]
            await asyncio.sleep(0.1)
            assert r.queued == 3  # bounded: the other callers wait to enqueue
            assert sum(t.done() for t in tasks) == 0
            release.set()
            assert await blocker is True
            results = await asyncio.gather(*tasks)
            count = await r.call(lambda b: len(b.agent("npc-0")))
            return results, count

    results, count = asyncio.run(main())
    direct = bank.ask(["npc-0"] * 10, [TEXTS[i % 5] for i in range(10)], config=CFG)
    assert [r.association for r in results] == [d.association for d in direct]
    assert any(res.association for res in results)
    assert count == 35


def test_cancellation_is_safe(bank) -> None:
    async def main():
        async with BatchingRetriever(bank, max_batch=8, max_wait_ms=30, config=CFG) as r:
            tasks = [asyncio.create_task(r.ask(f"npc-{i % 4}", TEXTS[i % 5])) for i in range(12)]
            await asyncio.sleep(0)
            for t in tasks[::3]:
                t.cancel()
            done = await asyncio.gather(*tasks, return_exceptions=True)
            after = await r.ask("npc-1", TEXTS[0])  # the worker still runs
            return done, after, r.stats.answered

    done, after, _ = asyncio.run(main())
    cancelled = [d for d in done if isinstance(d, asyncio.CancelledError)]
    answered = [d for d in done if not isinstance(d, BaseException)]
    assert len(cancelled) == 4 and len(answered) == 8
    (direct,) = bank.ask(["npc-1"], [TEXTS[0]], config=CFG)
    assert after.association == direct.association


def test_close_fails_queued_requests_and_bad_settings(bank) -> None:
    async def main():
        r = BatchingRetriever(bank, max_batch=2, max_wait_ms=1, config=CFG)
        await r.start()
        release = threading.Event()
        blocker = asyncio.create_task(r.call(lambda b: release.wait(0.3)))
        await asyncio.sleep(0.05)
        waiting = asyncio.create_task(r.ask("npc-0", TEXTS[0]))
        await asyncio.sleep(0.05)
        closing = asyncio.create_task(r.aclose())
        release.set()
        await closing
        with pytest.raises((RetrieverClosedError, asyncio.CancelledError)):
            await waiting
        await asyncio.gather(blocker, return_exceptions=True)
        with pytest.raises(RetrieverClosedError):
            await r.ask("npc-0", TEXTS[0])

    asyncio.run(main())
    for kwargs, name in [({"max_batch": 0}, "max_batch"), ({"max_wait_ms": -1}, "max_wait_ms"),
                         ({"max_queue": True}, "max_queue")]:  # fmt: skip
        with pytest.raises(ValidationError, match=name):
            BatchingRetriever(bank, **kwargs)


def test_no_request_is_lost_when_batch_windows_time_out() -> None:
    """Thousands of requests against batch windows that keep timing out: every caller gets
    exactly its own answer (a wait_for-based queue read could drop one and hang its caller)."""
    import random

    class Echo:  # instant answers: only the batcher's bookkeeping is exercised
        def __contains__(self, agent: object) -> bool:
            return True

        def ask(self, agents, texts, config=None):
            return [f"{a}:{t}" for a, t in zip(agents, texts)]

    rng = random.Random(0)

    async def main():
        async with BatchingRetriever(Echo(), max_batch=7, max_wait_ms=0.05) as r:

            async def client(c: int) -> list[str]:
                out = []
                for i in range(60):
                    out.append(await r.ask(f"a{c}", f"t{i}"))
                    if i % 3 == 0:
                        await asyncio.sleep(rng.random() * 0.0005)
                return out

            return await asyncio.wait_for(asyncio.gather(*(client(c) for c in range(40))), 60)

    got = asyncio.run(main())
    assert got == [[f"a{c}:t{i}" for i in range(60)] for c in range(40)]
