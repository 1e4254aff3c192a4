"""Errors and exit statuses of the ``soulmem`` command line."""

from __future__ import annotations

import argparse
import json
from typing import NoReturn

PROG = "soulmem"
EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class CLIError(Exception):
    """An error to report as one line and an exit status (1 = runtime, 2 = usage)."""

    def __init__(self, message: str, code: int = EXIT_RUNTIME) -> None:
        super().__init__(message)
        self.code = code


class _UsageError(CLIError):
    def __init__(self, message: str, prog: str) -> None:
        super().__init__(message, EXIT_USAGE)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are raised (one line, exit 2), never printed + exited."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(message, self.prog)


def _one_line(text: str) -> str:
    """Folds a multi-line message (e.g. a list of bad graph nodes) into one line."""
    out = ""
    for part in (p.strip() for p in str(text).splitlines()):
        if part:
            out += part if not out else (" " if out.endswith(":") else "; ") + part
    return out or "(no message)"


def _describe_exception(exc: BaseException) -> tuple[str, int]:
    """``(message, exit status)`` for any exception that reaches the top level."""
    import pydantic

    if isinstance(exc, CLIError):
        return str(exc), exc.code
    if isinstance(exc, pydantic.ValidationError):
        from soulmem_torch.model.describe import describe_validation_error

        return f"invalid {exc.title}: {describe_validation_error(exc)}", EXIT_RUNTIME
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON: {exc}", EXIT_RUNTIME
    from soulmem_torch.errors import SoulMemError

    if isinstance(exc, SoulMemError):
        return str(exc), EXIT_RUNTIME
    if isinstance(exc, OSError):
        if exc.filename is not None and exc.strerror:
            return f"{exc.filename}: {exc.strerror}", EXIT_RUNTIME
        return str(exc) or type(exc).__name__, EXIT_RUNTIME
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text ({exc})", EXIT_RUNTIME
    return (
        f"unexpected {type(exc).__name__}: {exc} (run with --debug for the traceback)",
        EXIT_RUNTIME,
    )
