"""``Timestamp``: a timezone-aware UTC datetime that keeps nanoseconds.

The Rust original stores ``chrono::DateTime<Utc>`` (nanosecond precision) and serde writes
RFC 3339 with 0, 3, 6 or 9 fraction digits and ``Z``. Python's ``datetime`` stops at
microseconds, so ``Timestamp`` subclasses it and carries the extra nanoseconds, which makes a
note written by the original read and write back byte for byte.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Any

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic_core import core_schema

__all__ = ["Timestamp", "parse_rfc3339"]

_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9})\d*)?"
    r"(Z|z|[+-]\d{2}:\d{2})$"
)
_CANONICAL = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?Z", re.ASCII)
"""What :meth:`Timestamp.to_rfc3339` writes (ASCII digits, ``T``, 0–9 fraction digits, ``Z``)."""
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_fromisoformat = datetime.fromisoformat
_UTC = timezone.utc
_datetime_new = datetime.__new__


class Timestamp(datetime):
    """Aware UTC datetime with nanoseconds (``nanosecond``: 0 … 999_999_999 within the second).

    Arithmetic and comparisons behave as for ``datetime`` (at microsecond resolution); the extra
    nanoseconds are kept for exact serialization and for :attr:`ns_since_epoch`.
    """

    _sub_us: int  # nanoseconds below the microsecond, 0..999

    def __new__(cls, *args: Any, sub_microsecond_ns: int = 0, **kwargs: Any) -> Timestamp:
        self = super().__new__(cls, *args, **kwargs)
        if self.tzinfo is None:
            raise ValueError("Timestamp needs a timezone-aware datetime (found a naive one)")
        if self.utcoffset() != timedelta(0):
            raise ValueError("Timestamp must be in UTC; use Timestamp.from_datetime to convert")
        if not 0 <= sub_microsecond_ns < 1000:
            raise ValueError(f"sub_microsecond_ns must be in [0, 1000), found {sub_microsecond_ns}")
        self._sub_us = int(sub_microsecond_ns)
        return self

    # -- construction -------------------------------------------------------------------
    @classmethod
    def from_datetime(cls, value: datetime, *, sub_microsecond_ns: int = 0) -> Timestamp:
        """Converts an aware datetime to UTC. A naive datetime is an error (it is ambiguous)."""
        if isinstance(value, Timestamp) and not sub_microsecond_ns:
            return value
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(
                f"expected a timezone-aware datetime, found naive {value.isoformat()!r}; "
                "attach a timezone (e.g. datetime.timezone.utc)"
            )
        utc = value.astimezone(timezone.utc)
        return cls(
            utc.year, utc.month, utc.day, utc.hour, utc.minute, utc.second, utc.microsecond,
            tzinfo=timezone.utc, sub_microsecond_ns=sub_microsecond_ns,
        )  # fmt: skip

    @classmethod
    def now(cls, tz: Any = None) -> Timestamp:  # type: ignore[override]
        """The current time, UTC."""
        return cls.from_datetime(datetime.now(timezone.utc))

    @classmethod
    def from_ns(cls, ns_since_epoch: int) -> Timestamp:
        """From integer nanoseconds since the Unix epoch."""
        us, sub = divmod(int(ns_since_epoch), 1000)
        return cls.from_datetime(_EPOCH + timedelta(microseconds=us), sub_microsecond_ns=sub)

    @classmethod
    def parse(cls, text: str) -> Timestamp:
        """Parses RFC 3339 (as chrono/serde write it); offsets are converted to UTC."""
        return parse_rfc3339(text)

    # -- accessors ----------------------------------------------------------------------
    @property
    def nanosecond(self) -> int:
        """Nanoseconds within the second (0 … 999_999_999)."""
        return self.microsecond * 1000 + self._sub_us

    @property
    def ns_since_epoch(self) -> int:
        """Integer nanoseconds since the Unix epoch (exact)."""
        delta = self - _EPOCH
        us = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
        return us * 1000 + self._sub_us

    def to_rfc3339(self) -> str:
        """RFC 3339 as serde/chrono write it: 0, 3, 6 or 9 fraction digits, then ``Z``."""
        base = f"{self.year:04d}-{self.month:02d}-{self.day:02d}T"
        base += f"{self.hour:02d}:{self.minute:02d}:{self.second:02d}"
        ns = self.nanosecond
        if ns == 0:
            frac = ""
        elif ns % 1_000_000 == 0:
            frac = f".{ns // 1_000_000:03d}"
        elif ns % 1000 == 0:
            frac = f".{ns // 1000:06d}"
        else:
            frac = f".{ns:09d}"
        return base + frac + "Z"

    def __str__(self) -> str:
        return self.to_rfc3339()

    def __repr__(self) -> str:
        return f"Timestamp('{self.to_rfc3339()}')"

    def __reduce__(self) -> Any:
        return (Timestamp.from_ns, (self.ns_since_epoch,))

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self.__reduce__()

    def __copy__(self) -> Timestamp:
        return self

    def __deepcopy__(self, memo: Any) -> Timestamp:
        return self

    # -- pydantic -----------------------------------------------------------------------
    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        def validate(value: Any) -> Timestamp:
            if isinstance(value, str):
                last = _LAST  # parse_rfc3339's cache, inlined (read once: threads)
                if type(value) is str and value == last[0]:
                    return last[1]  # type: ignore[return-value]
                return parse_rfc3339(value)
            if isinstance(value, datetime):
                return cls.from_datetime(value)
            raise ValueError(
                f"expected an RFC 3339 string or an aware datetime, found {type(value).__name__}"
            )

        return core_schema.no_info_plain_validator_function(
            validate,
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda v, info: v.to_rfc3339() if info.mode == "json" else v,
                info_arg=True,
            ),
        )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        return {"type": "string", "format": "date-time"}


def parse_rfc3339(text: str) -> Timestamp:
    """Parses an RFC 3339 timestamp with up to 9 fraction digits (more are truncated)."""
    global _LAST
    last_text, last = _LAST  # a note's two times (a record's too) are often the same text
    if type(text) is str and text == last_text:
        return last
    out = _parse_rfc3339(text)
    _LAST = (text, out)
    return out


_LAST: tuple[str | None, Timestamp | None] = (None, None)  # no text equals None


def _parse_rfc3339(text: str) -> Timestamp:
    if type(text) is str and _CANONICAL.fullmatch(text):  # the form every writer here uses:
        try:  # its fields by the C parser (the load path; ~5x the general path below)
            dt = _fromisoformat(text)
        except ValueError:  # e.g. day 31 of a 30-day month: the general path says so
            pass
        else:
            out = _datetime_new(
                Timestamp, dt.year, dt.month, dt.day, dt.hour, dt.minute, dt.second,
                dt.microsecond, _UTC,
            )  # fmt: skip
            out._sub_us = int(text[26:-1].ljust(3, "0")) if len(text) > 27 else 0
            return out
    return _parse_general(text)


def _parse_general(text: str) -> Timestamp:
    if not isinstance(text, str):
        raise ValueError(f"expected an RFC 3339 string, found {type(text).__name__}")
    m = _RFC3339.match(text.strip())
    if m is None:
        raise ValueError(
            f"expected an RFC 3339 timestamp such as '2026-07-17T13:59:33.699407100Z', "
            f"found {text!r}"
        )
    year, month, day, hour, minute, second, frac, off = m.groups()
    ns = int(frac.ljust(9, "0")) if frac else 0
    if off in ("Z", "z"):  # the form every writer here uses: built directly (the load path)
        try:
            out = _datetime_new(
                Timestamp, int(year), int(month), int(day), int(hour), int(minute),
                int(second), ns // 1000, _UTC,
            )  # fmt: skip
        except ValueError as exc:
            raise ValueError(f"invalid timestamp {text!r}: {exc}") from None
        out._sub_us = ns % 1000
        return out
    sign = 1 if off[0] == "+" else -1
    tz = timezone(sign * timedelta(hours=int(off[1:3]), minutes=int(off[4:6])))
    try:
        local = datetime(
            int(year), int(month), int(day), int(hour), int(minute), int(second),
            ns // 1000, tzinfo=tz,
        )  # fmt: skip
    except ValueError as exc:
        raise ValueError(f"invalid timestamp {text!r}: {exc}") from None
    return Timestamp.from_datetime(local, sub_microsecond_ns=ns % 1000)
