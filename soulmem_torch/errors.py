"""One root error, with subclasses that also inherit the matching built-in.

Messages name the argument, what was expected and what was found.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "DeviceResolutionError",
    "GraphLoadError",
    "LLMError",
    "NotFoundError",
    "SoulMemError",
    "StoreError",
    "TimeConflictError",
    "ValidationError",
]


class SoulMemError(Exception):
    """Root of every error raised by soulmem_torch."""


class ValidationError(SoulMemError, ValueError):
    """An argument or a field had a value outside what is accepted."""


class ConfigError(ValidationError):
    """A configuration value is invalid."""


class TimeConflictError(ValidationError):
    """``last_accessed_time`` is earlier than ``create_time``."""


class NotFoundError(SoulMemError, KeyError):
    """An id or a key that is not present."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable.
        return str(self.args[0]) if self.args else ""


class GraphLoadError(ValidationError):
    """An evaluation graph (docs/spec.md §9) could not be loaded; ``problems`` lists every bad node."""

    def __init__(self, message: str, problems: list[tuple[str, str]] | None = None) -> None:
        super().__init__(message)
        self.problems: list[tuple[str, str]] = list(problems or [])


class DeviceResolutionError(SoulMemError, ValueError):
    """A device string could not be resolved (e.g. ``"cuda"`` without CUDA)."""


class LLMError(SoulMemError, RuntimeError):
    """The injected LLM callable failed, timed out or answered nothing usable."""


class StoreError(SoulMemError, OSError):
    """A memory store on disk is missing, truncated, corrupted or of an unknown version."""
