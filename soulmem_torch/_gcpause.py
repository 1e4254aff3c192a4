"""``gc_paused()``: the cyclic garbage collector held off during one batched call.

A batched call builds tens of thousands of small, acyclic Python objects (queries, result
lists of ``(MemoryId, score)`` tuples), most of which die before it returns. With the collector
on, the ones alive at each young-generation collection are promoted, and every few calls that
triggers a full collection, which walks every object in the process — after importing torch and
PyG about 340k of them, 40–200 ms on a small CPU. Reference counting frees all of the call's
acyclic garbage either way; pausing the collector only keeps it from scanning mid-call.

The pause is process-wide (``gc`` has no other kind), so it is shared and bounded: nested and
concurrent pauses count as one, the collector is re-enabled when the last one ends, or at the
end of any thread's outermost call once it has been off for ``MAX_PAUSE_S`` (so overlapping
calls in a server cannot keep it off), and never when it was already disabled by someone else.
A pause nested in another of the same thread (a store load inside ``SoulMem.load``, every
agent of a bank load) never ends it early: one long call (loading 100,000 notes) stays one
pause. When a pause ends, the objects allocated during it are moved to the oldest generation
as they are (``gc.freeze()`` then ``gc.unfreeze()``, two list splices) instead of being
walked by the next young collection — after a load that one walk over a million new objects
cost ~10 % of the load; cycles among them are found by the next full collection, as for any
long-lived object. Skipped when the application froze objects itself (``gc.freeze`` is then
its own).
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["MAX_PAUSE_S", "gc_paused"]

MAX_PAUSE_S: float = 1.0
"""Longest continuous pause (seconds) that overlapping calls can hold the collector off."""

_lock = threading.Lock()
_depth = 0  # calls inside gc_paused()
_since: float | None = None  # when this module disabled the collector (None: it did not)
_local = threading.local()  # .depth: this thread's nesting


@contextmanager
def gc_paused() -> Iterator[None]:
    """Holds the cyclic garbage collector off for the body (see the module docstring)."""
    global _depth, _since
    mine = getattr(_local, "depth", 0)
    _local.depth = mine + 1
    with _lock:
        _depth += 1
        if _since is None and gc.isenabled():
            gc.disable()
            _since = time.monotonic()
    try:
        yield
    finally:
        _local.depth = mine
        with _lock:
            _depth -= 1
            if _since is not None and (
                _depth == 0 or (mine == 0 and time.monotonic() - _since > MAX_PAUSE_S)
            ):
                _since = None
                if gc.get_freeze_count() == 0:
                    gc.freeze()  # the new objects join the oldest generation unwalked
                    gc.unfreeze()
                gc.enable()
