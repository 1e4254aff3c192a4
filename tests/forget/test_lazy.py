"""lazy_forget (SPEC §8): thresholds, prompts, LLM success / failure / timeout / junk."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

import pytest

from soulmem_torch.errors import LLMError, ValidationError
from soulmem_torch.forget import (
    MASK_THRESHOLD,
    MASK_WORD,
    RECONSTRUCT_SYSTEM_PROMPT,
    REVISE_THRESHOLD,
    FakeLLM,
    MaskOnly,
    NoAction,
    Revised,
    call_llm,
    compute_missing_degree,
    get_summary,
    lazy_forget,
    mask_text,
    set_summary,
)
from tests.forget._notes import T0, hours, make_abstract, make_proc, make_sem, make_sit

UTC = timezone.utc
LUXUN = "鲁迅原名周树人浙江绍兴人"
MEETING = "今天下午我和张三在北京王府井的星巴克讨论了项目进展"


class Recorder:
    """An async LLM that answers ``reply`` and records every (system, user)."""

    def __init__(self, reply: Any = "鲁迅是浙江绍兴人原名周树人") -> None:
        self.reply = reply
        self.calls: list[tuple[str, str]] = []

    async def __call__(self, system: str, user: str) -> Any:
        self.calls.append((system, user))
        return self.reply


async def raising(system: str, user: str) -> str:
    raise RuntimeError("boom")


async def hanging(system: str, user: str) -> str:
    await asyncio.sleep(30)
    return "too late"


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# ---- which notes are forgotten ---------------------------------------------------------------
@pytest.mark.parametrize("make", [make_proc, make_abstract], ids=["procedure", "abstract"])
def test_other_kinds_are_not_forgotten(make: Any) -> None:
    note = make(created=T0)
    llm = Recorder()
    action = run(lazy_forget(note, T0 + hours(1000), None, llm))
    assert isinstance(action, NoAction)
    assert action.old_summary is None
    assert action.missing_degree > REVISE_THRESHOLD
    assert llm.calls == []


def test_fresh_note_no_action() -> None:
    note = make_sem("data", datetime.now(UTC))
    action = run(lazy_forget(note, None, None, Recorder()))
    assert action == NoAction("data", 0.0)
    assert get_summary(note) == "data"


def test_mask_only_band_does_not_call_the_llm() -> None:
    note = make_sem(MEETING)
    now = T0 + hours(3)  # md ≈ 0.083
    md = compute_missing_degree(T0, 0, now)
    assert MASK_THRESHOLD <= md < REVISE_THRESHOLD
    llm = Recorder()
    action = run(lazy_forget(note, now, None, llm))
    expected = mask_text(MEETING, md)
    assert action == MaskOnly(md, expected.masked_count, expected.masked_text, MEETING, None)
    assert get_summary(note) == expected.masked_text
    assert MASK_WORD.strip() in get_summary(note)
    assert llm.calls == []


@pytest.mark.parametrize(("h", "kind"), [(1, NoAction), (2, MaskOnly), (5, MaskOnly), (6, Revised)])
def test_branch_boundaries(h: int, kind: type) -> None:
    note = make_sem(MEETING)
    action = run(lazy_forget(note, T0 + hours(h), None, FakeLLM()))
    assert type(action) is kind


# ---- reconstruction -------------------------------------------------------------------------
def test_revised_with_the_spec_prompts() -> None:
    note = make_sem(LUXUN, T0)
    llm = Recorder("  鲁迅是浙江绍兴人原名周树人\n")
    now = T0 + hours(24 * 30)
    action = run(lazy_forget(note, now, None, llm))
    md = compute_missing_degree(T0, 0, now)
    masked = mask_text(LUXUN, md)
    assert action == Revised(
        LUXUN, "鲁迅是浙江绍兴人原名周树人", masked.masked_text, md, masked.masked_count
    )
    assert get_summary(note) == "鲁迅是浙江绍兴人原名周树人"
    assert llm.calls == [(RECONSTRUCT_SYSTEM_PROMPT, "Masked text: " + masked.masked_text)]
    assert "[masked]" in llm.calls[0][1]


def test_situation_narrative_and_custom_system_prompt() -> None:
    narrative = "早上八点我在公园慢跑看到一只金毛犬在湖边嬉水"
    note = make_sit(narrative, T0)
    llm = Recorder("清晨在公园湖边慢跑时遇见一只金毛犬正在嬉水")
    action = run(lazy_forget(note, T0 + hours(100), None, llm, system_prompt="You are Sakuya."))
    assert isinstance(action, Revised)
    assert action.old_summary == narrative
    assert note.mem_type.narrative == "清晨在公园湖边慢跑时遇见一只金毛犬正在嬉水"
    assert llm.calls[0][0] == "You are Sakuya."


def test_sync_llm_is_accepted() -> None:
    note = make_sem(LUXUN, T0)
    action = run(lazy_forget(note, T0 + hours(100), None, lambda s, u: "同步回答"))
    assert isinstance(action, Revised) and action.new_summary == "同步回答"


def test_wrapped_note_and_given_missing_degree() -> None:
    note = make_sem(LUXUN, datetime.now(UTC))  # fresh, but the caller says md = 0.9
    wrapped = SimpleNamespace(note=note, embedding=None)
    action = run(lazy_forget(wrapped, None, None, FakeLLM(), missing_degree=0.9))
    assert isinstance(action, Revised) and action.missing_degree == 0.9
    assert get_summary(note) == action.new_summary


def test_progressive_forgetting_across_time() -> None:
    original = "张三上个月去杭州出差在西湖边吃了东坡肉和龙井虾仁"
    note = make_sem(original, datetime(2024, 6, 1, tzinfo=UTC))

    async def questions(system: str, user: str) -> str:
        assert MASK_WORD.strip() in user
        return user.removeprefix("Masked text: ").replace(MASK_WORD, "?")

    for t in [(2024, 6, 1, 3), (2024, 6, 2, 0), (2024, 6, 8, 0), (2024, 7, 1, 0)]:
        run(lazy_forget(note, datetime(*t, tzinfo=UTC), None, questions))
    assert get_summary(note) != original


# ---- failures -------------------------------------------------------------------------------
def assert_masked_fallback(note: Any, action: Any, old: str, error_part: str) -> None:
    assert isinstance(action, MaskOnly)
    assert action.old_summary == old
    assert get_summary(note) == action.masked_text
    assert action.masked_text != old
    assert error_part in action.llm_error


def test_llm_raises() -> None:
    note = make_sem(MEETING)
    action = run(lazy_forget(note, T0 + hours(200), None, raising))
    assert_masked_fallback(note, action, MEETING, "RuntimeError: boom")


def test_llm_hangs_past_the_timeout() -> None:
    note = make_sem(MEETING)
    start = time.perf_counter()
    action = run(lazy_forget(note, T0 + hours(200), None, hanging, timeout=0.05))
    assert time.perf_counter() - start < 5
    assert_masked_fallback(note, action, MEETING, "timeout of 0.05 s")


@pytest.mark.parametrize("junk", ["", "   \n\t ", None, 42, b"bytes", ["list"]])
def test_llm_returns_junk(junk: Any) -> None:
    note = make_sem(MEETING)
    action = run(lazy_forget(note, T0 + hours(200), None, Recorder(junk)))
    assert_masked_fallback(note, action, MEETING, "llm: expected")


def test_no_llm_masks_only() -> None:
    note = make_sem(MEETING)
    action = run(lazy_forget(note, T0 + hours(200)))
    assert_masked_fallback(note, action, MEETING, "none given")


def test_cancellation_is_not_swallowed() -> None:
    async def main() -> None:
        note = make_sem(MEETING)
        task = asyncio.ensure_future(lazy_forget(note, T0 + hours(200), None, hanging))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert get_summary(note) == MEETING

    run(main())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"timeout": 0}, "timeout: expected None or a finite number of seconds > 0, found 0"),
        ({"timeout": float("nan")}, "timeout"),
        ({"timeout": float("inf")}, "timeout"),
        ({"missing_degree": float("nan")}, "missing_degree: expected a finite number, found nan"),
        ({"now": datetime(2024, 1, 1)}, "now: expected a timezone-aware datetime"),
    ],
)
def test_validation(kwargs: dict, match: str) -> None:
    now = kwargs.pop("now", T0 + hours(10))
    with pytest.raises(ValidationError, match=match):
        run(lazy_forget(make_sem(MEETING), now, None, FakeLLM(), **kwargs))


def test_call_llm_errors() -> None:
    with pytest.raises(LLMError, match="RuntimeError: boom"):
        run(call_llm(raising, "s", "u"))
    with pytest.raises(LLMError, match="timeout"):
        run(call_llm(hanging, "s", "u", timeout=0.01))
    with pytest.raises(LLMError, match="expected a str reply, found int"):
        run(call_llm(Recorder(1), "s", "u"))
    with pytest.raises(LLMError, match="async callable"):
        run(call_llm(None, "s", "u"))  # type: ignore[arg-type]
    assert run(call_llm(Recorder(" "), "s", "u", require_text=False)) == " "


def test_get_and_set_summary() -> None:
    sem, sit, proc = make_sem("c"), make_sit("n"), make_proc()
    assert (get_summary(sem), get_summary(sit), get_summary(proc)) == ("c", "n", None)
    set_summary(sem, "c2")
    set_summary(sit, "n2")
    assert (sem.mem_type.content, sit.mem_type.narrative) == ("c2", "n2")
    with pytest.raises(ValidationError, match="found ProcMemory"):
        set_summary(proc, "x")
