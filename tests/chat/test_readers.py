from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from soulmem_torch.chat import (
    ChatSession,
    ChatTurn,
    parse_chat_time,
    read_chat_jsonl,
    read_locomo,
    read_longmemeval,
    write_chat_jsonl,
)
from soulmem_torch.errors import ValidationError
from tests.chat._data import locomo_file, longmemeval_file

UTC = timezone.utc


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2023/05/20 (Sat) 07:47", datetime(2023, 5, 20, 7, 47, tzinfo=UTC)),
        ("2023/05/20", datetime(2023, 5, 20, tzinfo=UTC)),
        ("1:56 pm on 8 May, 2023", datetime(2023, 5, 8, 13, 56, tzinfo=UTC)),
        ("12:05 am on 1 January, 2024", datetime(2024, 1, 1, 0, 5, tzinfo=UTC)),
        ("2024-02-03T04:05:06Z", datetime(2024, 2, 3, 4, 5, 6, tzinfo=UTC)),
        ("2024-02-03T04:05:06+02:00", datetime(2024, 2, 3, 2, 5, 6, tzinfo=UTC)),
    ],
)
def test_parse_chat_time(text: str, expected: datetime) -> None:
    assert parse_chat_time(text) == expected


@pytest.mark.parametrize("bad", ["yesterday", "1:56 pm on 8 Maybe, 2023", "2023/13/01"])
def test_parse_chat_time_refuses(bad: str) -> None:
    with pytest.raises(ValidationError, match="time: expected a date"):
        parse_chat_time(bad)


def test_turn_and_session_checks() -> None:
    with pytest.raises(ValidationError, match="speaker"):
        ChatTurn("", "user", "hi")
    with pytest.raises(ValidationError, match="UTF-8"):
        ChatTurn("Ann", "user", "broken \ud83d emoji")
    with pytest.raises(ValidationError, match="naive"):
        ChatTurn("Ann", "user", "hi", datetime(2024, 1, 1))
    s = ChatSession("s", None, (ChatTurn("Ann", "user", "a"), ChatTurn("Bo", "user", "b")))
    assert [t.id for t in s.turns] == ["s_1", "s_2"]
    with pytest.raises(ValidationError, match="duplicate turn id"):
        ChatSession("s", None, (ChatTurn("A", "u", "a", id="x"), ChatTurn("A", "u", "b", id="x")))
    with pytest.raises(ValidationError, match="expected a ChatTurn"):
        ChatSession("s", None, ("hello",))  # type: ignore[arg-type]


def test_jsonl_round_trip(tmp_path) -> None:
    path = tmp_path / "chat.jsonl"
    lines = [
        {"session": "a", "speaker": "Ann", "role": "user", "text": "hello",
         "time": "2024-01-01T10:00:00Z"},
        {"session": "b", "speaker": "Bot", "role": "assistant", "text": "second session"},
        {"session": "a", "speaker": "Bot", "role": "assistant", "text": "hi Ann", "id": "t9"},
    ]  # fmt: skip
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n", encoding="utf-8")
    sessions = read_chat_jsonl(path)
    assert [s.id for s in sessions] == ["a", "b"]
    assert [t.id for t in sessions[0].turns] == ["a_1", "t9"]
    assert sessions[0].time == datetime(2024, 1, 1, 10, tzinfo=UTC)
    assert sessions[1].time is None and sessions[1].turns[0].role == "assistant"
    out = tmp_path / "again.jsonl"
    write_chat_jsonl(sessions, out)
    assert read_chat_jsonl(out) == sessions


def test_jsonl_errors_name_the_line(tmp_path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"session": "a", "speaker": "Ann", "text": "ok"}\n{"session": "a"}\n')
    with pytest.raises(ValidationError, match=r"line 2: missing field 'speaker'"):
        read_chat_jsonl(path)
    path.write_text("not json\n")
    with pytest.raises(ValidationError, match="line 1: not valid JSON"):
        read_chat_jsonl(path)
    with pytest.raises(ValidationError, match="no such file"):
        read_chat_jsonl(tmp_path / "missing.jsonl")


def test_longmemeval_reader(tmp_path) -> None:
    qs = read_longmemeval(longmemeval_file(tmp_path / "lme.json"))
    assert [q.question_id for q in qs] == ["q1", "q2_abs"]
    assert [q.abstention for q in qs] == [False, True]
    q = qs[0]
    assert q.question_date == datetime(2023, 5, 30, 10, 18, tzinfo=UTC)
    cat = q.sessions[1]
    assert cat.id == "answer_cat" and cat.time == datetime(2023, 5, 21, 9, tzinfo=UTC)
    assert [t.id for t in cat.turns] == ["answer_cat_1", "answer_cat_2", "answer_cat_3"]
    assert [t.role for t in cat.turns] == ["user", "assistant", "user"]
    assert [t.has_answer for t in cat.turns] == [None, None, True]


def test_longmemeval_reader_errors(tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"question_id": "x"}))
    with pytest.raises(ValidationError, match="expected a JSON list"):
        read_longmemeval(bad)
    data = json.loads(longmemeval_file(tmp_path / "lme.json").read_text())
    data[0]["haystack_dates"] = data[0]["haystack_dates"][:1]
    bad.write_text(json.dumps(data))
    with pytest.raises(ValidationError, match=r"\[0\]: haystack_session_ids, haystack_dates"):
        read_longmemeval(bad)
    for broken in (b"", b'[{"question_id": "x",', b"\xff[]", b'["a\\ud83d', b"[1] 2"):
        bad.write_bytes(broken)
        with pytest.raises(ValidationError, match=r"bad.json: not valid JSON \(.+\)"):
            read_longmemeval(bad)
    # the values json.load gives: NaN, Infinity, big ints, the last of a repeated key
    bad.write_text('[{"question_id": 12345678901234567890123, "question_id": NaN}]')
    with pytest.raises(ValidationError, match=r"question_id: expected str/int, found float nan"):
        read_longmemeval(bad)


def test_longmemeval_turns_are_checked_as_chat_turns(tmp_path) -> None:
    data = json.loads(longmemeval_file(tmp_path / "lme.json").read_text())
    qs = read_longmemeval(longmemeval_file(tmp_path / "lme.json"))
    for q in qs:  # the reader's turns are the turns the constructor makes
        for s in q.sessions:
            for t in s.turns:
                assert t == ChatTurn(t.speaker, t.role, t.text, None, t.id, None, t.has_answer)
    for field, value, message in [
        ("role", "", "speaker: expected a non-empty string"),
        ("role", 3, "expected str, found int"),
        ("content", "broken \ud83d emoji", "text: expected text that can be written as UTF-8"),
    ]:
        broken = json.loads(json.dumps(data))
        broken[0]["haystack_sessions"][1][2][field] = value
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(broken))
        with pytest.raises(ValidationError, match=r"haystack_sessions\[1\]\[2\]"):
            read_longmemeval(bad)
        with pytest.raises(ValidationError, match=message):
            read_longmemeval(bad)


def test_locomo_reader(tmp_path) -> None:
    (sample,) = read_locomo(locomo_file(tmp_path / "locomo.json"))
    assert sample.sample_id == "conv-x" and sample.speakers == ("Caroline", "Melanie")
    assert [s.id for s in sample.sessions] == ["session_1", "session_2"]
    assert sample.sessions[0].time == datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    bowl = sample.sessions[0].turns[2]
    assert bowl.id == "D1:3" and bowl.role == "speaker_a"
    assert bowl.content == "A blue bowl. [image: a photo of a blue ceramic bowl]"
    q = sample.questions
    assert [x.id for x in q] == ["conv-x:0", "conv-x:1", "conv-x:2"]
    assert q[1].evidence == ("D2:1", "D1:1")  # a malformed "D2:1; D1:1" gives both ids
    assert q[2].category == 5 and q[2].answer == "a sunset" and q[2].evidence == ()
