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
