"""SlidingWindow: tagging rule, eviction, summary through fake async LLMs (no network)."""

from __future__ import annotations

import asyncio
import re

import pytest

from soulmem_torch.errors import LLMError, ValidationError
from soulmem_torch.runtime import (
    SUMMARY_SYSTEM_PROMPT,
    Assistant,
    PushResult,
    SlidingWindow,
    User,
    make_information,
)


class Scripted:
    """A fake async LLM: answers (or raises / hangs) from a script and records the prompts."""

    def __init__(self, *outcomes):
        self.outcomes = list(outcomes)
        self.prompts: list[tuple[str, str]] = []

    async def __call__(self, system: str, user: str) -> str:
        self.prompts.append((system, user))
        if not self.outcomes:
            raise RuntimeError("script exhausted")
        outcome = self.outcomes.pop(0)
        if outcome == "hang":
            await asyncio.sleep(3600)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    @property
    def calls(self) -> int:
        return len(self.prompts)


def run(coro):
    return asyncio.run(coro)


async def push_all(window: SlidingWindow, *texts: str, role: str = "user") -> list[PushResult]:
    return [await window.push_text(text, role) for text in texts]


def texts(window: SlidingWindow) -> list[str]:
    return [m.text for m in window.messages()]


# ---- tagging -------------------------------------------------------------------------------
def test_first_message_then_every_capacity_th_is_tagged():
    window = SlidingWindow(capacity=3)
    run(push_all(window, "1", "2", "3"))
    assert [m.tag for m in window.messages()] == [True, False, False]
    run(push_all(window, "4", "5", "6", "7"))
    assert [m.tag for m in window.messages()] == [False, False, True]  # 5, 6, 7; tags: 1, 4, 7
    assert texts(window) == ["5", "6", "7"]
    assert [m.text for m in window.messages() if m.tag] == ["7"]


def test_tag_pattern_over_a_long_run():
    window = SlidingWindow(capacity=4)
    tagged = []
    for i in range(1, 14):
        run(window.push(User(str(i))))
        tagged.append(window.messages()[-1].tag)
    assert [i + 1 for i, t in enumerate(tagged) if t] == [1, 5, 9, 13]


def test_capacity_one_tags_everything():
    window = SlidingWindow(capacity=1)
    run(push_all(window, "a"))
    assert window.messages()[0].tag


def test_newer_original_counter_start_is_an_option():
    window = SlidingWindow(capacity=3, tag_counter_start=0)
    run(push_all(window, "1", "2", "3", "4"))
    assert [m.tag for m in window.messages()] == [False, True, False]  # 2, 3, 4: only "3"


def test_clear_restarts_the_counter_and_keeps_the_summary():
    llm = Scripted("S")
    window = SlidingWindow(capacity=2, llm=llm)
    run(push_all(window, "1", "2", "3"))
    assert window.summary == "S"
    window.clear()
    assert len(window) == 0 and window.is_empty() and window.summary == "S"
    run(push_all(window, "x"))
    assert window.messages()[0].tag


def test_a_preset_tag_is_kept_and_the_input_is_copied():
    window = SlidingWindow(capacity=5)
    run(push_all(window, "first"))
    info = Assistant("marked", tag=True)
    run(window.push(info))
    stored = window.messages()[-1]
    assert stored.tag and stored is not info and stored == Assistant("marked", tag=True)


def test_manual_tag_and_untag_are_bounds_checked():
    window = SlidingWindow(capacity=5)
    run(push_all(window, "a", "b"))
    window.tag_information(1)
    window.untag_information(0)
    window.tag_information(2)
    window.untag_information(99)
    assert [m.tag for m in window.messages()] == [False, True]
    assert window.get(2) is None and window.get(-1) is None and window[1].text == "b"


# ---- eviction and summary ------------------------------------------------------------------------
def test_untagged_evictions_never_call_the_llm():
    llm = Scripted()
    window = SlidingWindow(capacity=3, llm=llm)
    window._messages.append(User("old"))  # an untagged message at the front
    run(push_all(window, "a", "b"))
    window.untag_information(1)  # "a" (tagged by the rule) -> untagged
    results = run(push_all(window, "c", "d"))
    assert llm.calls == 0
    assert [m.text for r in results for m in r.evicted] == ["old", "a"]
    assert texts(window) == ["b", "c", "d"]


def test_successful_summary_updates_and_evicts():
    llm = Scripted("  first summary  ")
    window = SlidingWindow(capacity=1, llm=llm)
    run(push_all(window, "a"))
    assert len(window) == 1 and llm.calls == 0
    result = run(window.push(User("b")))
    assert result.ok and result.summary_updated and [m.text for m in result.evicted] == ["a"]
    assert llm.calls == 1 and window.summary == "first summary"  # stripped
    assert texts(window) == ["b"] and window.last_error is None


def test_summary_prompt_layout():
    llm = Scripted("S1", "S2")
    window = SlidingWindow(capacity=2, llm=llm)
    run(window.push(User("第一句")))
    run(window.push(Assistant("second")))
    run(window.push(User("third")))  # evicts the tagged "第一句"
    system, user = llm.prompts[0]
    assert system == SUMMARY_SYSTEM_PROMPT and "summary" in system.lower()
    assert user == "[assistant]: \n[user]: 第一句\n[assistant]: second\n[user]: third\n"
    assert (
        window.build_summary_prompt()[1] == "[assistant]: S1\n[assistant]: second\n[user]: third\n"
    )


def test_summary_carries_the_previous_summary_forward():
    llm = Scripted("first", "second")
    window = SlidingWindow(capacity=1, llm=llm)
    run(push_all(window, "a", "b"))
    assert window.summary == "first"
    run(push_all(window, "c"))
    assert window.summary == "second"
    assert llm.prompts[1][1].startswith("[assistant]: first\n")


@pytest.mark.parametrize(
    ("outcome", "timeout", "message"),
    [
        (ConnectionError("transport down"), None, r"failed \(ConnectionError: transport down\)"),
        ("hang", 0.05, r"timed out after 0.05 s"),
        ("   \n ", None, "blank"),
        ("", None, "blank"),
        (42, None, r"expected the summary text \(str\), found int"),
    ],
)
def test_llm_failure_keeps_every_message_and_the_old_summary(outcome, timeout, message):
    llm = Scripted("old summary", outcome)
    window = SlidingWindow(capacity=1, llm=llm, timeout=timeout)
    run(push_all(window, "a", "b"))
    assert window.summary == "old summary" and texts(window) == ["b"]
    result = run(window.push(User("c")))
    assert not result.ok and not result.summary_updated and result.evicted == ()
    assert isinstance(result.error, LLMError)
    assert result.error.args[0].startswith("llm: ")
    assert re.search(message, str(result.error))
    assert window.last_error is result.error
    assert window.summary == "old summary"
    assert texts(window) == ["b", "c"]  # over capacity: a soft bound


def test_a_failed_summary_is_retried_on_the_next_push():
    llm = Scripted(TimeoutError("slow"), "rescued")
    window = SlidingWindow(capacity=1, llm=llm)
    run(push_all(window, "a"))
    assert not run(window.push(User("b"))).ok
    assert texts(window) == ["a", "b"]
    result = run(window.push(User("c")))
    assert result.ok and window.summary == "rescued" and window.last_error is None
    assert llm.calls == 2  # at most one LLM call per push
    assert texts(window) == ["b", "c"]
    assert "[user]: a\n[user]: b\n" in llm.prompts[1][1]  # the kept message is summarized


def test_raise_on_error_raises_after_keeping_everything():
    window = SlidingWindow(capacity=1, llm=Scripted(ValueError("nope")))
    run(push_all(window, "a"))
    with pytest.raises(LLMError, match="ValueError: nope") as info:
        run(window.push(User("b"), raise_on_error=True))
    assert isinstance(info.value.__cause__, ValueError)
    assert texts(window) == ["a", "b"] and window.summary == ""


def test_pop_summarizes_a_tagged_front_and_keeps_it_on_failure():
    window = SlidingWindow(capacity=10, llm=Scripted(RuntimeError("down"), "S"))
    run(push_all(window, "a", "b"))
    result = run(window.pop())
    assert not result.ok and texts(window) == ["a", "b"]
    result = run(window.pop())
    assert result.ok and [m.text for m in result.evicted] == ["a"] and window.summary == "S"
    result = run(window.pop())  # "b" is untagged
    assert [m.text for m in result.evicted] == ["b"] and window.is_empty()
    assert run(window.pop()) == PushResult()  # empty: no-op


def test_without_llm_the_window_is_a_ring_buffer():
    window = SlidingWindow(capacity=2)
    results = run(push_all(window, "a", "b", "c", "d"))
    assert texts(window) == ["c", "d"] and window.summary == ""
    assert all(r.ok for r in results)


def test_sync_llm_callable_is_accepted():
    window = SlidingWindow(capacity=1, llm=lambda system, user: "sync summary")
    run(push_all(window, "a", "b"))
    assert window.summary == "sync summary"


def test_concurrent_pushes_keep_every_message_and_serialize_summaries():
    started = []

    async def slow_llm(system, user):
        started.append(user)
        await asyncio.sleep(0.01)
        return f"summary {len(started)}"

    async def main():
        window = SlidingWindow(capacity=3, llm=slow_llm)
        await asyncio.gather(*(window.push(User(f"m{i}")) for i in range(10)))
        return window

    window = run(main())
    assert texts(window) == ["m7", "m8", "m9"]
    assert window.summary == f"summary {len(started)}" and len(started) == 3  # m0, m3, m6 tagged
    assert started[1].startswith("[assistant]: summary 1\n")


def test_capacity_and_argument_validation():
    window = SlidingWindow()
    assert window.capacity == 20
    window.capacity = 2
    run(push_all(window, "a", "b", "c"))
    assert texts(window) == ["b", "c"]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValidationError, match="capacity: expected an int >= 1"):
            SlidingWindow(capacity=bad)
    with pytest.raises(ValidationError, match="llm: expected a callable"):
        SlidingWindow(llm="gpt")
    with pytest.raises(ValidationError, match="timeout"):
        SlidingWindow(timeout=0)
    with pytest.raises(ValidationError, match="info: expected a User or Assistant"):
        run(window.push("plain text"))


def test_make_information_maps_roles_like_the_original():
    assert make_information("x", "assistant") == Assistant("x")
    assert make_information("x", "user") == User("x")
    assert make_information("x", "system") == User("x")  # unknown roles fall back to user
    assert User("x").role == "user" and Assistant("x").role == "assistant"
