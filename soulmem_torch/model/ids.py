"""``MemoryId`` and ``LinkId``: UUID v4 newtypes (docs/spec.md §1).

Hashable, ordered, printable; their JSON form is the bare UUID string. A ``MemoryId`` never
compares equal to a ``LinkId`` with the same bits: they name different things.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic_core import core_schema

__all__ = ["LinkId", "MemoryId", "bulk_parsing", "parsed_ids"]

_new = object.__new__
_set = object.__setattr__
_UNKNOWN = uuid.SafeUUID.unknown
_SEEN_MAX = 1 << 16  # ids kept by the parser of each id type (immutable: shared safely)
_SEEN: dict[type, dict[str, Any]] = {}
_BULK = [0, _SEEN_MAX]  # bulk parses in flight, the cache's current cap
_BULK_LOCK = threading.Lock()


@contextlib.contextmanager
def bulk_parsing() -> Iterator[None]:
    """Lifts the cap of the id parsers' caches while a bulk parse (a store's load) runs, so
    every id text it meets is built once: a note's id again as a link's ``from`` / ``to`` or
    a record's ``memory_id``, and :func:`parsed_ids` can check a row's id column by identity.
    When the last one ends, caches grown past the usual cap are dropped (memory is bounded
    by the loads in flight). Nests, and is safe across threads."""
    with _BULK_LOCK:
        _BULK[0] += 1
        _BULK[1] = 1 << 62
    try:
        yield
    finally:
        with _BULK_LOCK:
            _BULK[0] -= 1
            if not _BULK[0]:
                _BULK[1] = _SEEN_MAX
                for seen in _SEEN.values():
                    if len(seen) > _SEEN_MAX:
                        seen.clear()


def parsed_ids(cls: type) -> Mapping[str, Any]:
    """The ids the parser of ``cls`` built, by their exact text (a read-only view of its
    cache: an id found here was parsed from that very text)."""
    return MappingProxyType(_SEEN.setdefault(cls, {}))


class _UuidNewtype(uuid.UUID):
    """A UUID subclass that only equals instances of the same newtype."""

    __slots__ = ()

    def __init__(self, value: str | uuid.UUID | None = None) -> None:
        if value is None:
            value = uuid.uuid4()
        if isinstance(value, uuid.UUID):
            super().__init__(int=value.int)
            return
        if not isinstance(value, str):
            raise TypeError(
                f"{type(self).__name__}: expected a UUID string or uuid.UUID, "
                f"found {type(value).__name__}"
            )
        super().__init__(value)

    @classmethod
    def _from_text(cls, text: str) -> Any:
        """``cls(text)`` without the generic constructor's overhead (the same parsing as
        ``uuid.UUID(hex)``: braces, hyphens and a URN prefix optional). Notes are parsed in
        bulk on every load, so this is on the load's hot path."""
        hex_ = text.replace("-", "") if len(text) == 36 else ""  # the canonical form
        if len(hex_) != 32:
            hex_ = text.replace("urn:", "").replace("uuid:", "").strip("{}").replace("-", "")
            if len(hex_) != 32:
                raise ValueError("badly formed hexadecimal UUID string")
        value = int(hex_, 16)
        self = _new(cls)
        _set(self, "int", value)
        _set(self, "is_safe", _UNKNOWN)
        return self

    @classmethod
    def new(cls) -> _UuidNewtype:
        """A fresh random (v4) id."""
        return cls(uuid.uuid4())

    def __eq__(self, other: object) -> bool:
        if type(other) is type(self):
            return self.int == other.int  # type: ignore[attr-defined]
        return NotImplemented

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.int))  # the subclasses override it (faster)

    def __lt__(self, other: object) -> bool:
        if type(other) is type(self):
            return self.int < other.int  # type: ignore[attr-defined]
        return NotImplemented

    def __repr__(self) -> str:
        return f"{type(self).__name__}('{self}')"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self),))

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        from_text = cls._from_text
        seen = _SEEN.setdefault(cls, {})  # ids repeat (a link's "from", a record's note)
        bulk = _BULK

        def parse(value: Any) -> Any:
            if type(value) is str:
                out = seen.get(value)
                if out is not None:
                    return out
                try:
                    out = from_text(value)
                except ValueError:
                    raise ValueError(f"expected a UUID string, found {value!r}") from None
                if len(seen) >= bulk[1]:
                    seen.clear()
                seen[value] = out
                return out
            if isinstance(value, str):
                try:
                    return from_text(value)
                except ValueError:
                    raise ValueError(f"expected a UUID string, found {value!r}") from None
            if isinstance(value, cls):
                return value
            if isinstance(value, uuid.UUID):
                return cls(value)
            raise ValueError(f"expected a UUID string, found {type(value).__name__}")

        return core_schema.no_info_plain_validator_function(
            parse, serialization=core_schema.to_string_ser_schema()
        )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        return {"type": "string", "format": "uuid"}


class MemoryId(_UuidNewtype):
    """Id of a memory note (UUID v4). ``MemoryId()`` makes a fresh one."""

    __slots__ = ()

    def __hash__(self) -> int:  # hashed in every dict of the cluster: kept cheap
        return hash(self.int)


class LinkId(_UuidNewtype):
    """Id of a memory link (UUID v4). ``LinkId()`` makes a fresh one."""

    __slots__ = ()

    def __hash__(self) -> int:  # differs from a MemoryId's with the same bits
        return ~hash(self.int)
