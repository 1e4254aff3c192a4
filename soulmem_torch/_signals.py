"""``sigint_deferred()``: a Ctrl-C that arrives while a write is being applied waits for its end.

Used around the steps that must not be cut in the middle (forgetting's write-back, the
consolidation and plasticity updates applying what was persisted).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["sigint_deferred"]


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """Holds a SIGINT that arrives inside the block and delivers it at the block's end.

    Only in the main thread (where Python runs signal handlers); elsewhere a no-op.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[tuple[int, Any]] = []
    try:
        previous = signal.signal(
            signal.SIGINT, lambda signum, frame: received.append((signum, frame))
        )
    except (ValueError, OSError):  # pragma: no cover - not the main interpreter
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            if callable(previous):
                previous(*received[0])
            elif previous != signal.SIG_IGN:
                raise KeyboardInterrupt
