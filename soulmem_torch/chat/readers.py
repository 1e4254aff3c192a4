"""Readers of chat histories: a plain JSON Lines log, LongMemEval and LoCoMo (docs/spec.md §11).

Every reader returns :class:`~soulmem_torch.chat.ChatSession` objects (and, for the benchmarks,
their questions); malformed input raises :class:`~soulmem_torch.errors.ValidationError` naming
the file, the record and the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from os import PathLike
from pathlib import Path
from typing import Any

import pydantic_core

from soulmem_torch._gcpause import gc_paused
from soulmem_torch.chat._types import ChatSession, ChatTurn, checked_turn
from soulmem_torch.errors import ValidationError

__all__ = [
    "LoCoMoQuestion",
    "LoCoMoSample",
    "LongMemEvalQuestion",
    "parse_chat_time",
    "read_chat_jsonl",
    "read_locomo",
    "read_longmemeval",
    "write_chat_jsonl",
]

_LME_TIME = re.compile(
    r"^\s*(\d{4})/(\d{1,2})/(\d{1,2})(?:\s*\([A-Za-z]+\))?(?:\s+(\d{1,2}):(\d{2}))?\s*$"
)
_LOCOMO_TIME = re.compile(
    r"^\s*(\d{1,2}):(\d{2})\s*([ap])\.?m\.?\s+on\s+(\d{1,2})\s+([A-Za-z]+),?\s+(\d{4})\s*$",
    re.IGNORECASE,
)
_MONTHS = {
    m: i + 1
    for i, names in enumerate(
        [("jan", "january"), ("feb", "february"), ("mar", "march"), ("apr", "april"),
         ("may",), ("jun", "june"), ("jul", "july"), ("aug", "august"),
         ("sep", "sept", "september"), ("oct", "october"), ("nov", "november"),
         ("dec", "december")]
    )
    for m in names
}  # fmt: skip
_DIA_ID = re.compile(r"D(\d+):(\d+)")


def parse_chat_time(text: str) -> datetime:
    """A chat timestamp as an aware UTC datetime.

    Accepts ISO 8601 (``2023-05-20T07:47:00Z``; a naive one is taken as UTC), LongMemEval's
    ``2023/05/20 (Sat) 07:47`` and LoCoMo's ``1:56 pm on 8 May, 2023``. Benchmarks give local
    times without a zone: they are read as UTC (only differences and calendar days matter).
    """
    if not isinstance(text, str):
        raise ValidationError(f"time: expected a string, found {text!r}")
    m = _LME_TIME.match(text)
    try:
        if m:
            y, mo, d, hh, mm = m.groups()
            return datetime(
                int(y), int(mo), int(d), int(hh or 0), int(mm or 0), tzinfo=timezone.utc
            )
        m = _LOCOMO_TIME.match(text)
        if m:
            hh, mm, ap, d, month, y = m.groups()
            mo = _MONTHS.get(month.lower())
            if mo is None:
                raise ValueError(f"unknown month {month!r}")
            hour = int(hh) % 12 + (12 if ap.lower() == "p" else 0)
            return datetime(int(y), mo, int(d), hour, int(mm), tzinfo=timezone.utc)
        value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError as exc:
        raise ValidationError(f"time: expected a date and time, found {text!r} ({exc})") from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


def _load_json(path: str | PathLike[str], what: str) -> Any:
    p = Path(path)
    if not p.is_file():
        raise ValidationError(f"{what} {p}: no such file")
    raw = p.read_bytes()
    # pydantic-core's parser (Rust; the values json.load gives, NaN / Infinity and big ints
    # included): 2-5x faster on a benchmark's 100 MB of chat history
    try:
        return pydantic_core.from_json(raw)
    except ValueError:
        pass  # json's reading then: its error, or the value (pydantic-core refuses a lone
        # surrogate escape, which the reader's checks name where it stands)
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValidationError(f"{what} {p}: not valid JSON ({exc})") from None


def _field(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict):
        raise ValidationError(f"{where}: expected an object, found {type(obj).__name__}")
    if key not in obj:
        raise ValidationError(f"{where}: missing field {key!r}")
    value = obj[key]
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ValidationError(
            f"{where}.{key}: expected {names}, found {type(value).__name__} {value!r:.60}"
        )
    return value


# ---- plain JSON Lines ----------------------------------------------------------------------
def read_chat_jsonl(path: str | PathLike[str]) -> list[ChatSession]:
    """A chat log in JSON Lines: one turn per line, sessions in order of first appearance.

    Each line: ``{"session": "s1", "speaker": "Ann", "text": "…"}`` with optional ``"role"``
    (default: the speaker), ``"time"`` (ISO 8601 or the benchmark formats), ``"id"`` (the turn's
    id; default ``f"{session}_{i+1}"``) and ``"session_time"`` (the session's time; default its
    first turn's). Blank lines are skipped.
    """
    p = Path(path)
    if not p.is_file():
        raise ValidationError(f"chat log {p}: no such file")
    order: dict[str, list[ChatTurn]] = {}
    session_time: dict[str, datetime | None] = {}
    with p.open("r", encoding="utf-8") as fh:
        for n, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"chat log {p}: line {n}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValidationError(f"{where}: not valid JSON ({exc})") from None
            sid = _field(obj, "session", (str, int), where)
            sid = str(sid)
            speaker = _field(obj, "speaker", str, where)
            text = _field(obj, "text", str, where)
            role = obj.get("role", speaker)
            try:
                time = parse_chat_time(obj["time"]) if obj.get("time") is not None else None
                stime = (
                    parse_chat_time(obj["session_time"])
                    if obj.get("session_time") is not None
                    else None
                )
                turn = ChatTurn(
                    speaker, role, text, time, None if obj.get("id") is None else str(obj["id"])
                )
            except ValidationError as exc:
                raise ValidationError(f"{where}: {exc}") from None
            order.setdefault(sid, []).append(turn)
            if sid not in session_time or session_time[sid] is None:
                session_time[sid] = stime if stime is not None else time
    out = []
    for sid, turns in order.items():
        try:
            out.append(ChatSession(sid, session_time.get(sid), tuple(turns)))
        except ValidationError as exc:
            raise ValidationError(f"chat log {p}: {exc}") from None
    return out


def write_chat_jsonl(sessions: Iterable[ChatSession], path: str | PathLike[str]) -> None:
    """Writes sessions in the format :func:`read_chat_jsonl` reads."""
    with Path(path).open("w", encoding="utf-8") as fh:
        for s in sessions:
            for i, t in enumerate(s.turns):
                obj: dict[str, Any] = {"session": s.id, "speaker": t.speaker, "role": t.role}
                obj["text"] = t.text
                obj["id"] = t.id
                if t.time is not None:
                    obj["time"] = t.time.isoformat()
                if i == 0 and s.time is not None:
                    obj["session_time"] = s.time.isoformat()
                fh.write(json.dumps(obj, ensure_ascii=False) + "\n")


# ---- LongMemEval ---------------------------------------------------------------------------
@dataclass(frozen=True)
class LongMemEvalQuestion:
    """One LongMemEval question with its own haystack (``sessions``, in haystack order)."""

    question_id: str
    question_type: str
    question: str
    question_date: datetime
    answer: str
    answer_session_ids: tuple[str, ...]
    sessions: tuple[ChatSession, ...]

    @property
    def abstention(self) -> bool:
        """An abstention question (``_abs`` in its id): the benchmark skips it in recall."""
        return "_abs" in self.question_id


def _lme_sessions(item: dict[str, Any], where: str) -> tuple[ChatSession, ...]:
    ids = _field(item, "haystack_session_ids", list, where)
    dates = _field(item, "haystack_dates", list, where)
    sessions = _field(item, "haystack_sessions", list, where)
    if not len(ids) == len(dates) == len(sessions):
        raise ValidationError(
            f"{where}: haystack_session_ids, haystack_dates and haystack_sessions differ in "
            f"length ({len(ids)}, {len(dates)}, {len(sessions)})"
        )
    out = []
    names: set[str] = set()  # the role strings checked
    for j, (sid, date, turns) in enumerate(zip(ids, dates, sessions)):
        w = f"{where}.haystack_sessions[{j}]"
        if not isinstance(turns, list):
            raise ValidationError(f"{w}: expected a list of turns, found {type(turns).__name__}")
        sid = str(sid)
        chat = []
        for i, t in enumerate(turns):
            if type(t) is dict:  # (the common case without a call per field)
                role, content = t.get("role"), t.get("content")
            if type(t) is not dict or type(role) is not str or type(content) is not str:
                role = _field(t, "role", str, f"{w}[{i}]")
                content = _field(t, "content", str, f"{w}[{i}]")
            has = t.get("has_answer")
            try:
                chat.append(
                    checked_turn(role, role, content, f"{sid}_{i + 1}",
                                 bool(has) if has is not None else None, names=names)
                )  # fmt: skip
            except ValidationError as exc:
                raise ValidationError(f"{w}[{i}]: {exc}") from None
        try:
            out.append(ChatSession(sid, parse_chat_time(str(date)), tuple(chat)))
        except ValidationError as exc:
            raise ValidationError(f"{w}: {exc}") from None
    return tuple(out)


def read_longmemeval(path: str | PathLike[str]) -> list[LongMemEvalQuestion]:
    """LongMemEval (``longmemeval_s*.json`` / ``_m`` / ``_oracle``): a JSON list of questions,
    each with its haystack. Turn ids follow the benchmark: ``f"{session_id}_{i+1}"``, ``i`` the
    index among all turns of the session."""
    with gc_paused():  # millions of small acyclic objects (see soulmem_torch._gcpause)
        return _read_longmemeval(path)


def _read_longmemeval(path: str | PathLike[str]) -> list[LongMemEvalQuestion]:
    data = _load_json(path, "LongMemEval file")
    if not isinstance(data, list):
        raise ValidationError(
            f"LongMemEval file {path}: expected a JSON list of questions, found "
            f"{type(data).__name__}"
        )
    out = []
    for n, item in enumerate(data):
        where = f"LongMemEval file {path}: [{n}]"
        qid = str(_field(item, "question_id", (str, int), where))
        answer = item.get("answer", "")
        out.append(
            LongMemEvalQuestion(
                question_id=qid,
                question_type=str(item.get("question_type", "")),
                question=_field(item, "question", str, where),
                question_date=parse_chat_time(_field(item, "question_date", str, where)),
                answer=answer if isinstance(answer, str) else json.dumps(answer),
                answer_session_ids=tuple(
                    str(s) for s in _field(item, "answer_session_ids", list, where)
                ),
                sessions=_lme_sessions(item, where),
            )
        )
    return out


# ---- LoCoMo --------------------------------------------------------------------------------
@dataclass(frozen=True)
class LoCoMoQuestion:
    """One LoCoMo question: ``id`` = ``f"{sample_id}:{j}"`` (``j`` its index in ``qa``),
    ``evidence`` the dia_ids found in the evidence strings (``D\\d+:\\d+``; malformed entries
    such as ``"D8:6; D9:17"`` give every id they hold), ``category`` (5 = adversarial)."""

    id: str
    question: str
    answer: str
    evidence: tuple[str, ...]
    category: int


@dataclass(frozen=True)
class LoCoMoSample:
    """One LoCoMo conversation: its sessions (``session_<n>`` ids, in order) and questions."""

    sample_id: str
    speakers: tuple[str, ...]
    sessions: tuple[ChatSession, ...]
    questions: tuple[LoCoMoQuestion, ...]


def locomo_session_of(dia_id: str) -> str:
    """The session id of a LoCoMo dia_id: ``"D3:5"`` → ``"session_3"``."""
    m = _DIA_ID.fullmatch(dia_id)
    if m is None:
        raise ValidationError(f"dia_id: expected 'D<session>:<turn>', found {dia_id!r}")
    return f"session_{int(m.group(1))}"


def _session_keys(conv: dict[str, Any]) -> Iterator[tuple[int, str]]:
    for key in conv:
        m = re.fullmatch(r"session_(\d+)", key)
        if m:
            yield int(m.group(1)), key


def read_locomo(path: str | PathLike[str]) -> list[LoCoMoSample]:
    """LoCoMo (``locomo10.json``): conversations with ``session_<n>`` turns (``speaker``,
    ``dia_id``, ``text``, optional ``blip_caption``), ``session_<n>_date_time`` and ``qa``."""
    data = _load_json(path, "LoCoMo file")
    if not isinstance(data, list):
        raise ValidationError(
            f"LoCoMo file {path}: expected a JSON list of samples, found {type(data).__name__}"
        )
    out = []
    for n, item in enumerate(data):
        where = f"LoCoMo file {path}: [{n}]"
        sample_id = str(item.get("sample_id", n)) if isinstance(item, dict) else str(n)
        conv = _field(item, "conversation", dict, where)
        speakers = tuple(
            conv[k] for k in ("speaker_a", "speaker_b") if isinstance(conv.get(k), str)
        )
        roles = {name: key for key, name in zip(("speaker_a", "speaker_b"), speakers)}
        sessions = []
        for num, key in sorted(_session_keys(conv)):
            turns = conv[key]
            w = f"{where}.conversation.{key}"
            if not isinstance(turns, list):
                raise ValidationError(
                    f"{w}: expected a list of turns, found {type(turns).__name__}"
                )
            date = conv.get(f"{key}_date_time")
            chat = []
            for i, t in enumerate(turns):
                speaker = _field(t, "speaker", str, f"{w}[{i}]")
                text = t.get("text", "") if isinstance(t.get("text", ""), str) else ""
                caption = t.get("blip_caption")
                dia = t.get("dia_id")
                try:
                    chat.append(
                        ChatTurn(
                            speaker,
                            roles.get(speaker, speaker),
                            text,
                            None,
                            str(dia) if dia is not None else f"D{num}:{i + 1}",
                            caption if isinstance(caption, str) else None,
                        )
                    )
                except ValidationError as exc:
                    raise ValidationError(f"{w}[{i}]: {exc}") from None
            try:
                time = parse_chat_time(date) if isinstance(date, str) else None
                sessions.append(ChatSession(f"session_{num}", time, tuple(chat)))
            except ValidationError as exc:
                raise ValidationError(f"{w}: {exc}") from None
        questions = []
        for j, qa in enumerate(item.get("qa", []) or []):
            w = f"{where}.qa[{j}]"
            question = _field(qa, "question", str, w)
            evidence = qa.get("evidence") or []
            if isinstance(evidence, str):
                evidence = [evidence]
            ids: list[str] = []
            for e in evidence if isinstance(evidence, list) else []:
                for m in _DIA_ID.finditer(str(e)):
                    dia = f"D{int(m.group(1))}:{int(m.group(2))}"
                    if dia not in ids:
                        ids.append(dia)
            answer = qa.get("answer", qa.get("adversarial_answer", ""))
            category = qa.get("category", 0)
            questions.append(
                LoCoMoQuestion(
                    f"{sample_id}:{j}",
                    question,
                    answer if isinstance(answer, str) else json.dumps(answer),
                    tuple(ids),
                    int(category)
                    if isinstance(category, (int, str)) and str(category).isdigit()
                    else 0,
                )
            )
        out.append(LoCoMoSample(sample_id, speakers, tuple(sessions), tuple(questions)))
    return out
