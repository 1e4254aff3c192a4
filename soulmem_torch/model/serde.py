"""Writing JSON exactly as the Rust original's ``serde_json`` does (docs/spec.md §1, §9).

* compact, struct field order, raw UTF-8 (only ``"``, ``\\`` and control characters escaped);
* floats in ``ryu``'s shortest form and layout (``1.0``, ``0.9``, ``1e-7``, ``1.5e16``); ``f32``
  fields printed as the shortest decimal of their float32 value;
* externally tagged enums (done by the models' serializers), UUIDs and RFC 3339 times as strings.
"""

from __future__ import annotations

import functools
import json
import math
import struct
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from enum import Enum
from typing import Any

__all__ = ["F32Float", "dumps_serde", "f32_round", "format_f32", "format_f64", "to_float32"]


class F32Float(float):
    """A float that serializes as a Rust ``f32`` (its float32 shortest decimal)."""

    __slots__ = ()


def to_float32(x: float) -> float:
    """Rounds to the nearest float32 (±inf beyond its range, as a Rust ``as f32`` cast)."""
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def _shortest_f32_digits(x: float) -> tuple[str, int]:
    """Shortest decimal digits and exponent that read back as the float32 ``x``.

    Returns ``(digits, e)`` with value = 0.d1d2… × 10^e … expressed as ``digits × 10^(e)`` where
    ``digits`` has no leading/trailing zeros (integer mantissa) — see :func:`_layout`.
    """
    target = to_float32(x)
    for p in range(1, 10):
        text = f"{target:.{p - 1}e}"
        if to_float32(float(text)) == target:
            mant, exp = text.split("e")
            digits = mant.replace(".", "").replace("-", "")
            # Correct rounding may miss a shortest neighbour that also round-trips; ryu prefers the
            # closest one, which is this one whenever it round-trips, so no neighbour search.
            return digits, int(exp) - (len(digits) - 1)
    raise AssertionError("unreachable: 9 digits always round-trip a float32")


def _shortest_f64_digits(x: float) -> tuple[str, int]:
    text = repr(abs(x))  # Python's repr is the shortest round-trip decimal, like ryu.
    if "e" in text or "E" in text:
        mant, exp_s = text.lower().split("e")
        exp = int(exp_s)
    else:
        mant, exp = text, 0
    if "." in mant:
        int_part, frac_part = mant.split(".")
    else:
        int_part, frac_part = mant, ""
    digits = (int_part + frac_part).lstrip("0")
    exp -= len(frac_part)
    stripped = digits.rstrip("0")
    exp += len(digits) - len(stripped)
    return stripped or "0", exp


def _layout(digits: str, exp: int, *, max_int_digits: int) -> str:
    """ryu's ``pretty`` layout of ``digits × 10^exp`` (16 for f64, 13 for f32)."""
    length = len(digits)
    kk = length + exp  # 10^(kk-1) <= v < 10^kk
    if 0 <= exp and kk <= max_int_digits:
        return digits + "0" * exp + ".0"
    if 0 < kk <= max_int_digits:
        return digits[:kk] + "." + digits[kk:]
    if -5 < kk <= 0:
        return "0." + "0" * (-kk) + digits
    if length == 1:
        return f"{digits}e{kk - 1}"
    return f"{digits[0]}.{digits[1:]}e{kk - 1}"


def format_f64(x: float) -> str:
    """``x`` as serde_json writes an ``f64`` (ryu shortest form). Non-finite → ``null``."""
    if not math.isfinite(x):
        return "null"
    if x == 0:
        return "-0.0" if math.copysign(1.0, x) < 0 else "0.0"
    digits, exp = _shortest_f64_digits(x)
    return ("-" if x < 0 else "") + _layout(digits, exp, max_int_digits=16)


def format_f32(x: float) -> str:
    """``x`` (cast to float32) as serde_json writes an ``f32``. Non-finite → ``null``."""
    x32 = to_float32(x) if math.isfinite(x) else x
    if not math.isfinite(x32):
        return "null"
    if x32 == 0:
        return "-0.0" if math.copysign(1.0, x32) < 0 else "0.0"
    digits, exp = _shortest_f32_digits(abs(x32))
    return ("-" if x32 < 0 else "") + _layout(digits, exp, max_int_digits=13)


def f32_round(x: float) -> float:
    """The Python float equal to the shortest decimal of ``float32(x)`` (what Rust keeps)."""
    if not math.isfinite(x):
        return x
    if x == 0:
        return float(format_f32(x))  # keeps the sign of -0.0 (which the cache would not)
    return _f32_round_finite(x)


@functools.lru_cache(maxsize=4096)
def _f32_round_finite(x: float) -> float:
    # cached: every f32 field of every note goes through here when notes are parsed, and
    # stored notes repeat a few values (confidences, intensities) over and over
    if not math.isfinite(to_float32(x)):
        raise ValueError(f"{x!r} is outside the float32 range (|x| <= 3.4028235e38)")
    return float(format_f32(x))


def _encode(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, Enum):
        _encode(value.value, out)
    elif isinstance(value, F32Float):
        out.append(format_f32(value))
    elif isinstance(value, float):
        out.append(format_f64(value))
    elif isinstance(value, int):
        out.append(str(int(value)))
    elif isinstance(value, str):
        out.append(json.dumps(value, ensure_ascii=False))
    elif isinstance(value, datetime):
        rfc = getattr(value, "to_rfc3339", None)
        out.append(json.dumps(rfc() if rfc else value.isoformat(), ensure_ascii=False))
    elif isinstance(value, uuid.UUID):
        out.append(f'"{value}"')
    elif isinstance(value, Mapping):
        out.append("{")
        first = True
        for k, v in value.items():
            if not first:
                out.append(",")
            first = False
            out.append(json.dumps(str(k), ensure_ascii=False))
            out.append(":")
            _encode(v, out)
        out.append("}")
    elif isinstance(value, Sequence):
        out.append("[")
        for i, v in enumerate(value):
            if i:
                out.append(",")
            _encode(v, out)
        out.append("]")
    else:
        raise TypeError(f"cannot encode {type(value).__name__} as serde JSON")


def dumps_serde(value: Any) -> str:
    """Compact JSON text of ``value`` in serde_json's exact layout (see module docstring)."""
    out: list[str] = []
    _encode(value, out)
    return "".join(out)
