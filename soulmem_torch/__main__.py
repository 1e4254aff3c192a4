"""``python -m soulmem_torch``: the ``soulmem`` command line (see :mod:`soulmem_torch.cli`)."""

from __future__ import annotations

import sys

from soulmem_torch.cli import main

if __name__ == "__main__":
    sys.exit(main())
