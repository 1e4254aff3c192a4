"""soulmem_torch: the SoulMem agent memory system on PyTorch and PyTorch Geometric.

The data model (``soulmem_torch.model``) imports no torch; everything else is tensor code.
"""

from __future__ import annotations

from soulmem_torch.errors import (
    ConfigError,
    NotFoundError,
    SoulMemError,
    StoreError,
    ValidationError,
)
from soulmem_torch.model import *  # noqa: F403
from soulmem_torch.model import __all__ as _model_all

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "NotFoundError",
    "SoulMemError",
    "StoreError",
    "ValidationError",
    "__version__",
    *_model_all,
]
