"""SoulMem as a newcomer meets it: a readable repr, runnable docstring examples, and a
synchronous forget that cannot be silently skipped."""

from __future__ import annotations

import asyncio
import doctest
from datetime import timedelta

import pytest

import soulmem_torch.api
from soulmem_torch import FakeLLM, SoulMem
from soulmem_torch.api import EventLoopRunningError
from soulmem_torch.data import sample_memory_path
from soulmem_torch.errors import SoulMemError


@pytest.fixture(scope="module")
def sample() -> SoulMem:
    return SoulMem.from_graph_file(sample_memory_path())


def test_repr_names_size_embedder_device_and_window(sample: SoulMem) -> None:
    assert repr(sample) == (
        "SoulMem(77 notes, 212 links, embedder=HashingEmbedder, device=cpu, window 0/20)"
    )
    auto = SoulMem(device="auto", window_capacity=3)  # the device it resolved to
    assert repr(auto).endswith(f"device={auto.device}, window 0/3)")
    assert auto.device.type in ("cpu", "cuda")


def test_docstring_examples_run() -> None:
    result = doctest.testmod(soulmem_torch.api, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 5 and result.failed == 0


def _aged(days: float) -> tuple[SoulMem, object]:
    mem = SoulMem.from_graph_file(sample_memory_path())
    newest = max(e.note.create_time for e in mem.cluster)
    return mem, newest + timedelta(days=days)


def test_forget_sync_equals_awaiting_forget() -> None:
    mem_a, now = _aged(3)
    mem_b, _ = _aged(3)
    report_sync = mem_a.forget_sync(now=now, llm=FakeLLM())
    report_async = asyncio.run(mem_b.forget(now=now, llm=FakeLLM()))
    assert report_sync.counts == report_async.counts
    assert report_sync.revised > 0  # three days: something was forgotten and reconstructed
    texts_a = sorted(e.note.to_json() for e in mem_a.cluster)
    assert len(texts_a) == 77


def test_forget_sync_inside_a_running_loop_is_a_clear_error(sample: SoulMem) -> None:
    async def inside() -> None:
        sample.forget_sync()

    with pytest.raises(EventLoopRunningError, match="await mem.forget") as info:
        asyncio.run(inside())
    assert isinstance(info.value, SoulMemError) and isinstance(info.value, RuntimeError)


def test_forget_docstring_says_it_must_be_awaited() -> None:
    assert "await" in (SoulMem.forget.__doc__ or "")
    assert asyncio.iscoroutinefunction(SoulMem.forget)
