"""Loading a user's object named ``MODULE:ATTR`` or ``path/to/file.py:ATTR`` (the CLI's
``--llm`` and ``--embedder`` specs): one importer, one set of error messages."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from soulmem_torch.errors import ValidationError

__all__ = ["import_object"]


def import_object(spec: str, *, what: str) -> Any:
    """The object ``spec`` names: ``module.path:attr.path`` or ``path/to/file.py:attr``.

    A module name is imported as ``python -m`` would (the working directory first on the
    path); a file is loaded under a private module name derived from its resolved path.

    Args:
        spec: ``MODULE:ATTR`` (dotted attribute paths allowed) or ``FILE.py:ATTR``.
        what: how errors name the spec, e.g. ``"--llm"`` or ``"embedder"``.

    Raises:
        ValidationError: no ``:``, a missing file, a module that cannot be imported or raises
            while importing, or a missing attribute — each naming the spec and the part.
    """
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValidationError(f"{what} {spec}: expected MODULE:NAME or path/to/file.py:NAME")
    try:
        if module_name.endswith(".py") or os.sep in module_name or "/" in module_name:
            file = Path(module_name)
            if not file.is_file():
                raise ValidationError(f"{what} {spec}: no such file {module_name!r}")
            digest = hashlib.sha256(str(file.resolve()).encode()).hexdigest()[:12]
            name = f"_soulmem_user_{digest}"
            mod_spec = importlib.util.spec_from_file_location(name, file)
            if mod_spec is None or mod_spec.loader is None:
                raise ValidationError(f"{what} {spec}: cannot load {module_name!r} as a module")
            module = importlib.util.module_from_spec(mod_spec)
            sys.modules[name] = module
            mod_spec.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path and "" not in sys.path:
                sys.path.insert(0, os.getcwd())  # as `python -m` does: modules next to you
            module = importlib.import_module(module_name)
    except ValidationError:
        raise
    except ModuleNotFoundError as exc:
        raise ValidationError(
            f"{what} {spec}: cannot import module {module_name!r} ({exc}); is it on PYTHONPATH?"
        ) from None
    except Exception as exc:  # the user's module raised while importing
        raise ValidationError(
            f"{what} {spec}: importing {module_name!r} raised {type(exc).__name__}: {exc}"
        ) from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValidationError(
                f"{what} {spec}: module {module_name!r} has no attribute {attr!r}"
            )
        obj = getattr(obj, part)
    return obj
