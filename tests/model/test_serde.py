"""Rust serde JSON: byte-for-byte round trip and the float layout of serde_json/ryu."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from soulmem_torch.model import MemoryNote, dump_notes_json, load_notes_json
from soulmem_torch.model.serde import F32Float, dumps_serde, f32_round, format_f32, format_f64
from tests.conftest import fixture_path


def test_rust_notes_round_trip_byte_for_byte() -> None:
    path = fixture_path("rust", "notes_written_by_rust.jsonl")
    raw = path.read_bytes()
    lines = raw.decode("utf-8").splitlines()
    assert len(lines) == 4
    for line in lines:
        note = MemoryNote.from_json(line)
        assert note.to_json() == line
    notes = load_notes_json(path)
    assert dump_notes_json(notes).encode("utf-8") == raw


def test_nanoseconds_kept() -> None:
    path = fixture_path("rust", "notes_written_by_rust.jsonl")
    note = MemoryNote.from_json(path.read_text(encoding="utf-8").splitlines()[0])
    assert note.create_time.nanosecond == 699_407_100
    assert note.create_time.ns_since_epoch % 1_000_000_000 == 699_407_100


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1.0, "1.0"),
        (0.95, "0.95"),
        (1e-5, "0.00001"),
        (1e-7, "1e-7"),
        (1e16, "1e16"),
        (1234567890123456.0, "1234567890123456.0"),
        (1.5e17, "1.5e17"),
        (12.34, "12.34"),
        (-0.5, "-0.5"),
        (0.0, "0.0"),
        (2.5e-10, "2.5e-10"),
    ],
)
def test_format_f64_matches_ryu(value: float, expected: str) -> None:
    assert format_f64(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0.9, "0.9"), (0.123456789, "0.12345679"), (123456789.0, "123456790.0"), (1e-7, "1e-7")],
)
def test_format_f32_shortest(value: float, expected: str) -> None:
    assert format_f32(value) == expected


@given(st.floats(allow_nan=False, allow_infinity=False, width=32))
def test_f32_shortest_reads_back_to_the_same_float32(x: float) -> None:
    text = format_f32(x)
    back = struct.unpack("<f", struct.pack("<f", float(text)))[0]
    assert back == struct.unpack("<f", struct.pack("<f", x))[0]
    assert f32_round(x) == float(text)


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_f64_text_reads_back_exactly(x: float) -> None:
    assert float(format_f64(x)) == x


def test_strings_escaped_like_serde() -> None:
    text = dumps_serde({"s": 'a"b\\c\n\x01\x7f中/', "f": F32Float(0.1), "n": None})
    assert text == '{"s":"a\\"b\\\\c\\n\\u0001\x7f中/","f":0.1,"n":null}'
    assert json.loads(text)["s"] == 'a"b\\c\n\x01\x7f中/'


def test_fast_id_and_time_parsers_match_the_general_ones() -> None:
    import uuid as _uuid

    from soulmem_torch.model import LinkId, MemoryId
    from soulmem_torch.model.serde import f32_round
    from soulmem_torch.model.timestamp import Timestamp, parse_rfc3339

    u = _uuid.uuid4()
    for text in (str(u), "{" + str(u) + "}", "urn:uuid:" + str(u), u.hex, str(u).upper()):
        got = MemoryId._from_text(text)
        assert type(got) is MemoryId and got == MemoryId(text) and got.int == u.int
        assert hash(got) == hash(MemoryId(text)) and got != LinkId(text)
    for bad in ("", "not-a-uuid", str(u)[:-1] + "g"):
        try:
            MemoryId._from_text(bad)
        except ValueError:
            continue
        raise AssertionError(bad)
    for text in ("2026-12-01T23:48:05.630317Z", "2026-12-01T23:48:05Z", "2026-12-01t23:48:05.1z",
                 "2026-12-01T23:48:05.123456789Z", "2026-12-01T23:48:05.630317+02:00"):  # fmt: skip
        got = parse_rfc3339(text)
        assert type(got) is Timestamp and got.utcoffset().total_seconds() == 0
        assert got == Timestamp.from_ns(got.ns_since_epoch)
        assert got.nanosecond == Timestamp.from_ns(got.ns_since_epoch).nanosecond
        assert parse_rfc3339(text) is got or parse_rfc3339(text) == got
    assert parse_rfc3339("2026-12-01T23:48:05.123456789Z").to_rfc3339().endswith(".123456789Z")
    assert str(f32_round(-0.0)) == "-0.0" and str(f32_round(0.0)) == "0.0"
    assert f32_round(0.1) == f32_round(0.1) == float("0.1")
