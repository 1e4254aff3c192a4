"""The time channel: when a question points in time, which notes lie there (docs/spec.md §7).

A question asked at ``now`` may name a time relative to it — "yesterday", "three days ago",
"a couple of weeks ago", "last month", "last Saturday", "in March", "上周", "三天前" —
and notes are dated (``create_time``; chat turns: when they were said). :func:`time_reference`
reads the first such expression into a target instant and a spread (half its unit: ±0.5 day
for days, ±3.5 days for weeks, ±15 days for months, ±0.5 year for years; a month name: its
whole month, the latest one not after ``now``); :func:`time_scores` gives every dated note
``exp(−½ ((t − target) / spread)²)``, notes after ``now`` or undated (at the Unix epoch) 0.
A question without such an expression, or without ``now``, gets an all-zero row: the channel
then adds nothing to the fusion.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone

import torch
from torch import Tensor

__all__ = ["time_reference", "time_scores"]

_DAY = 86_400 * 10**9
_UNIT_DAYS = {"day": 1.0, "week": 7.0, "month": 30.4375, "year": 365.25}
_NUMBERS = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
    "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12,
    "couple of": 2, "a couple of": 2, "few": 3, "a few": 3, "several": 3,
}  # fmt: skip
_ZH_NUMBERS = {"一": 1, "两": 2, "二": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8,
               "九": 9, "十": 10, "几": 3}  # fmt: skip
_WEEKDAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
_MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august",
           "september", "october", "november", "december"]  # fmt: skip
_NUM = r"(\d+|a couple of|couple of|a few|few|several|an?|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve)"
_AGO = re.compile(rf"\b{_NUM}\s+(day|week|month|year)s?\s+ago\b", re.I)
_LAST = re.compile(r"\b(?:last|past|previous)\s+(week|weekend|month|year)\b", re.I)
_LAST_DAY = re.compile(rf"\blast\s+({'|'.join(_WEEKDAYS)})\b", re.I)
_YESTERDAY = re.compile(
    r"\b(yesterday|the day before yesterday|today|this morning|tonight)\b", re.I
)
_IN_MONTH = re.compile(rf"\b(?:in|during|since|of|last)\s+({'|'.join(_MONTHS)})\b", re.I)
_ZH_AGO = re.compile(r"([0-9一两二三四五六七八九十几]+)\s*(天|周|星期|个月|月|年)前")
_ZH_WORDS = {"昨天": 1.0, "前天": 2.0, "今天": 0.0, "上周": 7.0, "上星期": 7.0, "上个月": 30.4375,
             "去年": 365.25}  # fmt: skip
_ZH_UNIT = {"天": "day", "周": "week", "星期": "week", "个月": "month", "月": "month", "年": "year"}


def _zh_number(text: str) -> int:
    if text.isdigit():
        return int(text)
    if len(text) == 2 and text[0] == "十":
        return 10 + _ZH_NUMBERS.get(text[1], 0)
    if len(text) == 2 and text[1] == "十":
        return _ZH_NUMBERS.get(text[0], 1) * 10
    return _ZH_NUMBERS.get(text, 1)


def time_reference(text: str, now: datetime | None) -> tuple[datetime, timedelta] | None:
    """``(target instant, spread)`` of the first time expression of ``text`` relative to
    ``now`` (aware), or ``None`` (no expression, or no ``now``).

    >>> from datetime import datetime, timezone
    >>> now = datetime(2023, 5, 30, 10, 0, tzinfo=timezone.utc)
    >>> t, spread = time_reference("Which book did I finish a week ago?", now)
    >>> t.date().isoformat(), spread.days
    ('2023-05-23', 3)
    """
    if now is None or not isinstance(text, str):
        return None
    if now.tzinfo is None:
        now = now.replace(tzinfo=timezone.utc)
    found: list[tuple[int, datetime, timedelta]] = []

    def add(pos: int, days_back: float, unit_days: float) -> None:
        found.append((pos, now - timedelta(days=days_back), timedelta(days=unit_days / 2)))

    for m in _AGO.finditer(text):
        n = m.group(1).lower()
        count = int(n) if n.isdigit() else _NUMBERS.get(n, 1)
        unit = _UNIT_DAYS[m.group(2).lower()]
        add(m.start(), count * unit, unit)
    for m in _LAST.finditer(text):
        unit = m.group(1).lower()
        if unit == "weekend":  # the Saturday–Sunday before now
            back = (now.weekday() - 5) % 7 or 7
            found.append((m.start(), now - timedelta(days=back - 0.5), timedelta(days=1)))
        else:
            add(m.start(), _UNIT_DAYS[unit], _UNIT_DAYS[unit])
    for m in _LAST_DAY.finditer(text):
        back = (now.weekday() - _WEEKDAYS.index(m.group(1).lower())) % 7 or 7
        add(m.start(), back, 1.0)
    for m in _YESTERDAY.finditer(text):
        word = m.group(1).lower()
        add(
            m.start(),
            2.0 if word.startswith("the day") else 1.0 if word == "yesterday" else 0.0,
            1.0,
        )
    for m in _IN_MONTH.finditer(text):
        month = _MONTHS.index(m.group(1).lower()) + 1
        year = now.year if month <= now.month else now.year - 1
        start = datetime(year, month, 1, tzinfo=timezone.utc)
        end = datetime(year + (month == 12), month % 12 + 1, 1, tzinfo=timezone.utc)
        found.append((m.start(), start + (end - start) / 2, (end - start) / 2))
    for word, days in _ZH_WORDS.items():
        pos = text.find(word)
        if pos >= 0:
            unit = 1.0 if days <= 2 else days
            add(pos, days, unit)
    for m in _ZH_AGO.finditer(text):
        unit = _UNIT_DAYS[_ZH_UNIT[m.group(2)]]
        add(m.start(), _zh_number(m.group(1)) * unit, unit)
    if not found:
        return None
    _, target, spread = min(found, key=lambda f: f[0])
    return target, spread


def time_scores(
    note_time_ns: Tensor,
    texts: Sequence[str | None],
    nows: Sequence[datetime | None],
    *,
    valid: Tensor | None = None,
) -> Tensor:
    """The time channel of B questions: (B, M) float64.

    Args:
        note_time_ns: (B, M) int64 — each candidate note's time, ns since the epoch (≤ 0:
            undated), or (M,) shared by every row.
        texts: B question texts (``None``: no time expression).
        nows: B times of asking (``None``: the row is 0).
        valid: (B, M) bool or None.
    """
    b = len(texts)
    t = note_time_ns if note_time_ns.dim() == 2 else note_time_ns.unsqueeze(0).expand(b, -1)
    refs = [time_reference(x, n) if x is not None else None for x, n in zip(texts, nows)]
    out = torch.zeros(t.shape, dtype=torch.float64, device=t.device)
    rows = [i for i, r in enumerate(refs) if r is not None]
    if not rows:
        return out
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)

    def ns(d: datetime) -> int:
        return (d - epoch) // timedelta(microseconds=1) * 1000

    idx = torch.tensor(rows, device=t.device)
    center = torch.tensor([ns(refs[i][0]) for i in rows], dtype=torch.float64, device=t.device)
    spread = torch.tensor(
        [refs[i][1] / timedelta(microseconds=1) * 1000 for i in rows],
        dtype=torch.float64, device=t.device,
    )  # fmt: skip
    limit = torch.tensor([ns(nows[i]) for i in rows], dtype=torch.float64, device=t.device)
    sub = t.index_select(0, idx).to(torch.float64)
    z = (sub - center.unsqueeze(1)) / spread.unsqueeze(1)
    score = torch.exp(-0.5 * z * z)
    dated = (sub > 0) & (sub <= limit.unsqueeze(1) + _DAY)  # (a note of the same day counts)
    score = torch.where(dated, score, 0.0)
    if valid is not None:
        score = torch.where(valid.index_select(0, idx), score, 0.0)
    out.index_copy_(0, idx, score)
    return out
