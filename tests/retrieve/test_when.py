"""The time channel: time expressions relative to ``now`` and the kernel on note times."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import pytest
import torch

from soulmem_torch import MemoryBank, SoulMem
from soulmem_torch.chat import ChatSession, ChatTurn
from soulmem_torch.errors import ValidationError
from soulmem_torch.retrieve import DefaultPipelineConfig
from soulmem_torch.retrieve.when import time_reference, time_scores

UTC = timezone.utc
NOW = datetime(2023, 5, 30, 10, 0, tzinfo=UTC)  # a Tuesday


@pytest.mark.parametrize(
    ("text", "days_back", "spread_days"),
    [
        ("Which book did I finish a week ago?", 7, 3.5),
        ("what did I cook a couple of days ago", 2, 0.5),
        ("3 months ago", 3 * 30.4375, 15.21875),
        ("yesterday at the park", 1, 0.5),
        ("last Saturday", 3, 0.5),
        ("last month", 30.4375, 15.21875),
        ("我三天前做了什么", 3, 0.5),
        ("上周的会议", 7, 3.5),
        ("两个月前", 2 * 30.4375, 15.21875),
    ],
)
def test_time_reference(text: str, days_back: float, spread_days: float) -> None:
    target, spread = time_reference(text, NOW)
    assert abs((NOW - target) / timedelta(days=1) - days_back) < 1e-9
    assert abs(spread / timedelta(days=1) - spread_days) < 1e-9


def test_time_reference_month_and_none() -> None:
    target, spread = time_reference("How many museums did I visit in March?", NOW)
    assert target == datetime(2023, 3, 16, 12, tzinfo=UTC) and spread == timedelta(days=15.5)
    # a month after now's month is last year's
    target, _ = time_reference("in December", NOW)
    assert target.year == 2022
    assert time_reference("where does my cat sleep?", NOW) is None
    assert time_reference("a week ago", None) is None
    # the first expression wins
    target, _ = time_reference("yesterday, not a week ago", NOW)
    assert (NOW - target).days == 1


def test_time_scores_closed_form() -> None:
    day = 86_400 * 10**9
    now_ns = int(NOW.timestamp()) * 10**9
    notes = torch.tensor([now_ns - 7 * day, now_ns - 9 * day, now_ns + 3 * day, 0])
    got = time_scores(notes, ["a week ago", "no time here"], [NOW, NOW])
    z = -2 / 3.5
    want = [1.0, math.exp(-0.5 * z * z), 0.0, 0.0]  # after now / undated: 0
    assert torch.allclose(got[0], torch.tensor(want, dtype=torch.float64))
    assert torch.equal(got[1], torch.zeros(4, dtype=torch.float64))
    valid = torch.tensor([[True, False, True, True], [True] * 4])
    masked = time_scores(notes, ["a week ago", None], [NOW, None], valid=valid)
    assert masked[0, 1] == 0 and masked[0, 0] == 1.0 and not masked[1].any()


def _history() -> list[ChatSession]:
    days = [NOW - timedelta(days=d) for d in (20, 7, 1)]
    return [
        ChatSession(f"s{i}", t, (ChatTurn("me", "user", f"I went hiking at {place}"),))
        for i, (t, place) in enumerate(zip(days, ["the lake", "the ridge", "the coast"]))
    ]


def test_time_channel_through_ask_and_the_bank() -> None:
    cfg = DefaultPipelineConfig.for_questions().model_copy(update={"channels": ("text", "time")})
    mem = SoulMem()
    mem.add_sessions(_history())
    (r,) = mem.ask("where did I go hiking a week ago?", config=cfg, now=NOW)
    assert mem.chat_source(r.association[0][0]) == ("s1", "s1_1")
    (plain,) = mem.ask("where did I go hiking a week ago?", config=cfg)  # no now: no time
    bank = MemoryBank()
    bank.add_sessions("me", _history())
    (b,) = bank.ask(["me"], ["where did I go hiking a week ago?"], config=cfg, now=[NOW])
    agent = bank.agent("me")  # the same notes (other ids): the same sources in the same order
    assert [agent.chat_source(i) for i, _ in b.association] == [
        mem.chat_source(i) for i, _ in r.association
    ]
    assert [s for _, s in b.association] == pytest.approx([s for _, s in r.association])
    assert plain.association != r.association


def test_now_errors() -> None:
    mem = SoulMem()
    mem.add_sessions(_history())
    with pytest.raises(ValidationError, match="now: expected 2 times"):
        mem.ask(["a", "b"], now=[NOW])
    with pytest.raises(ValidationError, match=r"now\[0\]: expected an aware datetime"):
        mem.ask(["a"], now=[datetime(2023, 1, 1)])
    with pytest.raises(ValidationError, match="now: expected an aware datetime"):
        mem.ask(["a"], now="yesterday")
