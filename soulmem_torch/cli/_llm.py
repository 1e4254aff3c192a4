"""LLM loading (``forget --llm MODULE:FUNCTION``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from soulmem_torch._imports import import_object
from soulmem_torch.cli._errors import CLIError
from soulmem_torch.errors import ValidationError


def _load_llm(spec: str) -> Callable[[str, str], Any]:
    """Imports ``module:function`` (or ``path/to/file.py:function``); checks it is callable
    with ``(system, user)``."""
    try:
        obj = import_object(spec, what="--llm")
    except ValidationError as exc:
        raise CLIError(str(exc)) from None
    attr = spec.rpartition(":")[2]
    if not callable(obj):
        raise CLIError(
            f"--llm {spec}: {attr!r} is a {type(obj).__name__}, not a callable "
            "(expected an async function (system, user) -> str)"
        )
    try:
        inspect.signature(obj).bind("system", "user")
    except TypeError as exc:
        raise CLIError(
            f"--llm {spec}: {attr!r} cannot be called as (system, user): {exc}"
        ) from None
    except ValueError:  # no signature available (some builtins): trust it
        pass
    return obj
