"""Forgetting is all or nothing: an interrupted run leaves every note untouched, a finished one
leaves every note fully updated (text, embedding and cluster version together).

Before issue 11, cancelling ``SoulMem.forget`` mid-run left some notes rewritten in place with
their old embeddings and an unchanged cluster version.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from typing import Any

import pytest

from soulmem_torch import SoulMem
from soulmem_torch.forget import FakeLLM, forget_cluster, get_summary
from soulmem_torch.forget import cluster as cluster_mod
from soulmem_torch.runtime import MemoryCluster
from tests.forget._notes import T0, hours, link, make_sem, make_sit

NOW = T0 + hours(24 * 10)
TEXTS = [
    "鲁迅原名周树人浙江绍兴人",
    "今天下午我和张三在北京王府井的星巴克讨论了项目进展",
    "On a quiet night, I spent hours polishing the silver cutlery.",
    "那天深夜我在红魔馆的大厅擦洗银器，小姐突然要我泡一壶茶。",
]


def old_notes(n: int = 16) -> list[Any]:
    notes = []
    for i in range(n):
        text = TEXTS[i % len(TEXTS)] + f" #{i}"
        make = make_sit if i % 3 == 2 else make_sem
        notes.append(make(text, T0 + hours(i)))  # all old: every note is forgotten
    link(notes[0], notes[1], 0.5)
    return notes


def snapshot(mem: SoulMem) -> dict[Any, tuple[str | None, Any]]:
    return {e.note.id: (get_summary(e.note), e.embedding) for e in mem.cluster}


def assert_untouched(mem: SoulMem, before: dict[Any, Any], version: int) -> None:
    after = snapshot(mem)
    assert after.keys() == before.keys()
    for note_id, (text, embedding) in before.items():
        assert after[note_id][0] == text
        assert after[note_id][1] is embedding
    assert mem.cluster.version == version


def assert_fully_updated(mem: SoulMem, before: dict[Any, Any], version: int) -> None:
    after = snapshot(mem)
    for note_id, (text, embedding) in before.items():
        assert after[note_id][0] != text
        assert after[note_id][1] is not embedding
    assert mem.cluster.version > version


class CountingLLM:
    """Answers like FakeLLM; after ``n`` calls runs ``then()`` (cancel, raise, …)."""

    def __init__(self, n: int, then: Any) -> None:
        self.n, self.then, self.calls = n, then, 0
        self.fake = FakeLLM()

    async def __call__(self, system: str, user: str) -> str:
        self.calls += 1
        if self.calls == self.n:
            self.then()
        await asyncio.sleep(0)
        return self.fake.respond(system, user)


def test_task_cancel_mid_run_leaves_every_note_untouched() -> None:
    mem = SoulMem.from_notes(old_notes())
    before, version = snapshot(mem), mem.cluster.version

    async def main() -> None:
        task: asyncio.Task[Any] | None = None
        llm = CountingLLM(6, lambda: task.cancel())  # type: ignore[union-attr]
        task = asyncio.ensure_future(mem.forget(now=NOW, llm=llm, concurrency=2))
        with pytest.raises(asyncio.CancelledError):
            await task
        assert llm.calls >= 6

    asyncio.run(main())
    assert_untouched(mem, before, version)


def test_cancel_during_reembedding_leaves_every_note_untouched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mem = SoulMem.from_notes(old_notes(6))
    before, version = snapshot(mem), mem.cluster.version
    entered, release = threading.Event(), threading.Event()
    real = cluster_mod._default_embed_notes()

    def slow_embed(notes: list[Any], embedder: Any) -> list[Any]:
        entered.set()
        release.wait(10)
        return real(notes, embedder)

    monkeypatch.setattr(cluster_mod, "_default_embed_notes", lambda: slow_embed)

    async def main() -> None:
        task = asyncio.ensure_future(mem.forget(now=NOW, llm=FakeLLM()))
        while not entered.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(main())
    finally:
        release.set()
    assert_untouched(mem, before, version)


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("asynchronous", [True, False])
def test_llm_raising_keyboard_interrupt_or_exit(exc: type, asynchronous: bool) -> None:
    mem = SoulMem.from_notes(old_notes())
    before, version = snapshot(mem), mem.cluster.version
    fake, calls = FakeLLM(), [0]

    def sync_llm(system: str, user: str) -> str:
        calls[0] += 1
        if calls[0] == 5:
            raise exc()
        return fake.respond(system, user)

    async def async_llm(system: str, user: str) -> str:
        return sync_llm(system, user)

    with pytest.raises(exc):
        asyncio.run(mem.forget(now=NOW, llm=async_llm if asynchronous else sync_llm, concurrency=3))
    assert_untouched(mem, before, version)


def test_completed_run_updates_text_embedding_and_version_together() -> None:
    mem = SoulMem.from_notes(old_notes())
    before, version = snapshot(mem), mem.cluster.version
    report = asyncio.run(mem.forget(now=NOW, llm=FakeLLM(), prune_below=0.9))
    assert report.written and len(report.reembedded) == len(before)
    assert_fully_updated(mem, before, version)
    assert mem.cluster.links() == [] and [p.id for p in report.pruned]


def test_embedding_failure_writes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(notes: list[Any], embedder: Any) -> list[Any]:
        raise RuntimeError("embedder down")

    monkeypatch.setattr(cluster_mod, "_default_embed_notes", lambda: broken)
    mem = SoulMem.from_notes(old_notes(5))
    before, version = snapshot(mem), mem.cluster.version
    report = asyncio.run(mem.forget(now=NOW, llm=FakeLLM(), prune_below=0.9))
    assert not report.written and "nothing written" in report.summary()
    assert [f.stage for f in report.failures] == ["embed"]
    assert_untouched(mem, before, version)
    assert len(mem.cluster.links()) == 1


def test_a_bad_embedding_rolls_back_the_ones_already_stored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = cluster_mod._default_embed_notes()

    def one_bad(notes: list[Any], embedder: Any) -> list[Any]:
        out = real(notes, embedder)
        out[-1] = "not an embedding"
        return out

    monkeypatch.setattr(cluster_mod, "_default_embed_notes", lambda: one_bad)
    mem = SoulMem.from_notes(old_notes(5))
    before = snapshot(mem)
    with pytest.raises(Exception, match="embedding"):
        asyncio.run(mem.forget(now=NOW, llm=FakeLLM()))
    after = snapshot(mem)
    assert all(after[i][0] == before[i][0] and after[i][1] is before[i][1] for i in before)


class InterruptingCluster(MemoryCluster):
    """Sends SIGINT to the process in the middle of the commit (on the 2nd embedding)."""

    calls = 0

    def set_embedding(self, id: Any, embedding: Any) -> None:
        type(self).calls += 1
        if type(self).calls == 2:
            signal.raise_signal(signal.SIGINT)
        super().set_embedding(id, embedding)


def test_sigint_inside_the_commit_is_deferred_to_its_end() -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are delivered to the main thread only")
    mem = SoulMem.from_notes(old_notes(6))
    cluster = InterruptingCluster()
    cluster.add_notes([e.note for e in mem.cluster], [e.embedding for e in mem.cluster])
    before = {e.note.id: (get_summary(e.note), e.embedding) for e in cluster}
    version = cluster.version
    InterruptingCluster.calls = 0
    # a known SIGINT handler, whatever earlier tests (or libraries they ran) left installed
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    report = None
    try:
        try:
            report = asyncio.run(
                forget_cluster(cluster, FakeLLM(), now=NOW, embedder=mem.embedder, progress=False)
            )
        except KeyboardInterrupt:
            interrupted = True
        else:
            interrupted = False
    finally:
        signal.signal(signal.SIGINT, previous)
    assert interrupted, (
        f"no KeyboardInterrupt: set_embedding calls={InterruptingCluster.calls}, "
        f"written={getattr(report, 'written', None)}, failures={getattr(report, 'failures', None)}"
    )
    assert InterruptingCluster.calls == len(before)  # the commit ran to its end
    for entry in cluster:
        text, embedding = before[entry.note.id]
        assert get_summary(entry.note) != text and entry.embedding is not embedding
    assert cluster.version > version
