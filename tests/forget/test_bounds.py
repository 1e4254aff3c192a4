"""Forgetting is bounded: a default timeout that holds for blocking callables, bounded replies.

Each test failed on the code before issue 11: a blocking callable hung past ``timeout``, a 1 MB
reply was stored, an LLM's own ``CancelledError`` aborted the whole run.
"""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from soulmem_torch.errors import LLMError
from soulmem_torch.forget import (
    DEFAULT_LLM_TIMEOUT_S,
    RECONSTRUCT_SYSTEM_PROMPT,
    REPLY_LENGTH_FACTOR,
    REPLY_LENGTH_SLACK,
    FakeLLM,
    ForgetConfig,
    LLMReplyWarning,
    MaskOnly,
    Revised,
    align_sem_fields,
    call_llm,
    check_reply,
    forget_cluster,
    get_summary,
    lazy_forget,
    max_reply_chars,
)
from tests.forget._notes import T0, hours, make_sem

OLD = T0 + hours(200)  # missing degree well past the revise threshold
MEETING = "今天下午我和张三在北京王府井的星巴克讨论了项目进展"
ROOT = Path(__file__).resolve().parents[2]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# ---- timeouts --------------------------------------------------------------------------------
def test_default_timeout_is_documented_and_applied() -> None:
    assert DEFAULT_LLM_TIMEOUT_S == 60.0
    assert ForgetConfig().timeout == DEFAULT_LLM_TIMEOUT_S
    for fn in (lazy_forget, call_llm, align_sem_fields):
        assert inspect.signature(fn).parameters["timeout"].default == DEFAULT_LLM_TIMEOUT_S
    assert ForgetConfig(timeout=None).timeout is None  # an explicit opt-out stays possible


def test_blocking_sync_callable_times_out() -> None:
    release = threading.Event()

    def blocking(system: str, user: str) -> str:  # a plain client call that never returns
        release.wait(30)
        return "too late"

    note = make_sem(MEETING)
    start = time.perf_counter()
    try:
        action = run(lazy_forget(note, OLD, None, blocking, timeout=0.2))
    finally:
        release.set()
    assert time.perf_counter() - start < 10
    assert isinstance(action, MaskOnly) and "timeout of 0.2 s" in action.llm_error
    assert get_summary(note) == action.masked_text


def test_blocking_callable_does_not_hang_the_process_at_exit() -> None:
    """``asyncio.run`` joins executor threads at exit; the LLM thread must not be one."""
    code = textwrap.dedent(
        """
        import asyncio, threading
        from soulmem_torch.errors import LLMError
        from soulmem_torch.forget import call_llm
        def forever(system, user):
            threading.Event().wait()
        try:
            asyncio.run(call_llm(forever, "s", "u", timeout=0.3))
        except LLMError as exc:
            print("OK", exc)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("OK llm: no reply within the timeout of 0.3 s")


def test_sync_callable_runs_off_the_event_loop_thread() -> None:
    seen: list[int] = []

    def sync_llm(system: str, user: str) -> str:
        seen.append(threading.get_ident())
        return FakeLLM().respond(system, user)

    note = make_sem(MEETING)
    action = run(lazy_forget(note, OLD, None, sync_llm, timeout=5))
    assert isinstance(action, Revised)
    assert seen and seen[0] != threading.get_ident()


def test_sync_callable_returning_a_coroutine() -> None:
    fake = FakeLLM()
    action = run(lazy_forget(make_sem(MEETING), OLD, None, lambda s, u: fake(s, u)))
    assert isinstance(action, Revised) and fake.calls == 1


@pytest.mark.parametrize("asynchronous", [True, False])
def test_llm_raising_cancelled_error_is_an_llm_failure(asynchronous: bool) -> None:
    async def async_cancel(system: str, user: str) -> str:
        raise asyncio.CancelledError

    def sync_cancel(system: str, user: str) -> str:
        raise asyncio.CancelledError

    notes = [make_sem(MEETING), make_sem(MEETING + "。")]
    llm = async_cancel if asynchronous else sync_cancel
    report = run(forget_cluster(notes, llm, now=OLD, progress=False))
    assert report.mask_only == 2
    assert [f.stage for f in report.failures] == ["llm", "llm"]
    assert all("CancelledError" in f.error for f in report.failures)


def test_cancelling_the_caller_still_propagates() -> None:
    async def slow(system: str, user: str) -> str:
        await asyncio.sleep(30)
        return "never"

    async def main() -> None:
        task = asyncio.ensure_future(lazy_forget(make_sem(MEETING), OLD, None, slow))
        await asyncio.sleep(0.05)
        task.cancel()
        await task

    with pytest.raises(asyncio.CancelledError):
        run(main())


# ---- reply bounds ----------------------------------------------------------------------------
def test_max_reply_chars() -> None:
    assert max_reply_chars("abc") == REPLY_LENGTH_FACTOR * 3 + REPLY_LENGTH_SLACK
    system, user = RECONSTRUCT_SYSTEM_PROMPT, "Masked text: a [masked] c"
    assert (
        check_reply("x" * max_reply_chars("abc"), original="abc", system=system, user=user) is None
    )
    too_long = check_reply(
        "x" * (max_reply_chars("abc") + 1), original="abc", system=system, user=user
    )
    assert too_long is not None and "longer than" in too_long


@pytest.mark.parametrize(
    "reply, reason",
    [
        ("记" * 1_000_000, "longer than"),
        (RECONSTRUCT_SYSTEM_PROMPT + "\n今天", "system prompt"),
        ("Masked text: 今天下午我和张三", "starts with 'Masked text:'"),
    ],
    ids=["1MB", "echo-system", "echo-user"],
)
def test_unbounded_or_echoed_reply_keeps_the_masked_text(reply: str, reason: str) -> None:
    async def llm(system: str, user: str) -> str:
        return reply

    note = make_sem(MEETING)
    with pytest.warns(LLMReplyWarning, match=f"note {note.id}: .*{reason}"):
        action = run(lazy_forget(note, OLD, None, llm))
    assert isinstance(action, MaskOnly) and reason in action.llm_error
    assert get_summary(note) == action.masked_text
    assert len(get_summary(note)) < 10 * len(MEETING)


def test_reply_repeating_the_masked_text_is_an_echo() -> None:
    async def llm(system: str, user: str) -> str:
        return user.removeprefix("Masked text: ")

    note = make_sem(MEETING)
    with pytest.warns(LLMReplyWarning, match="repeats the masked text"):
        action = run(lazy_forget(note, OLD, None, llm))
    assert isinstance(action, MaskOnly)


def test_reply_bounds_are_reported_per_note_in_a_cluster() -> None:
    async def llm(system: str, user: str) -> str:
        return "x" * 100_000

    notes = [make_sem(MEETING), make_sem("鲁迅原名周树人浙江绍兴人")]
    with pytest.warns(LLMReplyWarning) as record:
        report = run(forget_cluster(notes, llm, now=OLD, progress=False))
    messages = " ".join(str(w.message) for w in record)
    assert all(str(n.id) in messages for n in notes)
    assert [f.note_id for f in report.failures] == [n.id for n in notes]
    assert all("longer than" in f.error for f in report.failures)
    assert report.mask_only == 2
    assert all(len(get_summary(n)) < 10 * len(MEETING) for n in notes)


def test_align_rejects_an_unbounded_reply() -> None:
    async def llm(system: str, user: str) -> str:
        return "Aliases: a\nDescription: " + "d" * 1_000_000 + "\nConceptType: Entity"

    note = make_sem(MEETING, aliases=["x"])
    before = note.model_dump()
    with pytest.raises(LLMError, match="at most"):
        run(align_sem_fields(note, llm, missing_degree=0.9))
    assert note.model_dump() == before
