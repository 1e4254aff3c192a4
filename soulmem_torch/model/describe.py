"""Readable one-line descriptions of pydantic validation errors."""

from __future__ import annotations

import pydantic

__all__ = ["describe_validation_error"]


def describe_validation_error(exc: pydantic.ValidationError) -> str:
    """``field.path: message; ...`` — tagged-union tags appear once in the path, not twice."""
    parts = []
    for err in exc.errors():
        loc: list[str] = []
        for part in err["loc"]:
            text = str(part)
            if not loc or loc[-1] != text:
                loc.append(text)
        parts.append(f"{'.'.join(loc) or '<root>'}: {err['msg']}")
    return "; ".join(parts)
