"""LLM loading (``forget --llm MODULE:FUNCTION``)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from soulmem_torch.cli._errors import CLIError


def _load_llm(spec: str) -> Callable[[str, str], Any]:
    """Imports ``module:function`` (or ``path/to/file.py:function``); checks it is callable
    with ``(system, user)``."""
    module_name, _, attr = spec.rpartition(":")
    try:
        if module_name.endswith(".py") or os.sep in module_name or "/" in module_name:
            file = Path(module_name)
            if not file.is_file():
                raise CLIError(f"--llm {spec}: no such file {module_name!r}")
            name = f"_soulmem_llm_{abs(hash(str(file.resolve())))}"
            mod_spec = importlib.util.spec_from_file_location(name, file)
            if mod_spec is None or mod_spec.loader is None:
                raise CLIError(f"--llm {spec}: cannot load {module_name!r} as a Python module")
            module = importlib.util.module_from_spec(mod_spec)
            sys.modules[name] = module
            mod_spec.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path and "" not in sys.path:
                sys.path.insert(0, os.getcwd())  # as `python -m` does: modules next to you
            module = importlib.import_module(module_name)
    except CLIError:
        raise
    except ModuleNotFoundError as exc:
        raise CLIError(
            f"--llm {spec}: cannot import module {module_name!r} ({exc}); is it on PYTHONPATH?"
        ) from None
    except Exception as exc:  # the user's module raised while importing
        raise CLIError(
            f"--llm {spec}: importing {module_name!r} raised {type(exc).__name__}: {exc}"
        ) from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CLIError(
                f"--llm {spec}: module {module_name!r} has no attribute {attr!r}"
            ) from None
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
