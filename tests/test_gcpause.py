"""``gc_paused``: the collector is off inside, restored after, shared by nested / concurrent
calls, bounded in time, and never re-enabled when someone else had disabled it."""

from __future__ import annotations

import gc
import threading

import pytest

from soulmem_torch import _gcpause
from soulmem_torch._gcpause import gc_paused


@pytest.fixture(autouse=True)
def _collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_off_inside_on_after_even_on_error():
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_nested_pauses_count_as_one():
    with gc_paused():
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer call is still running
    assert gc.isenabled()


def test_leaves_a_disabled_collector_disabled():
    gc.disable()
    with gc_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_overlapping_threads_share_the_pause():
    inside, release = threading.Barrier(2), threading.Event()

    def worker():
        with gc_paused():
            inside.wait()
            release.wait()

    t = threading.Thread(target=worker)
    t.start()
    with gc_paused():
        inside.wait()
    assert not gc.isenabled()  # the worker's call still holds the pause
    release.set()
    t.join()
    assert gc.isenabled()


def test_overlapping_calls_cannot_hold_it_off_past_the_bound(monkeypatch):
    monkeypatch.setattr(_gcpause, "MAX_PAUSE_S", 0.0)
    started, release = threading.Event(), threading.Event()

    def worker():
        with gc_paused():
            started.set()
            release.wait()

    t = threading.Thread(target=worker)
    t.start()
    started.wait()
    with gc_paused():
        pass
    assert gc.isenabled()  # this call ended after the bound: back on, though the worker's runs
    release.set()
    t.join()
    assert gc.isenabled()


def test_a_nested_pause_does_not_end_a_long_call_early(monkeypatch):
    monkeypatch.setattr(_gcpause, "MAX_PAUSE_S", 0.0)
    with gc_paused():
        with gc_paused():  # e.g. the store load inside SoulMem.load
            pass
        assert not gc.isenabled()  # the same thread's outer call is still running
    assert gc.isenabled()


def test_objects_of_a_pause_join_the_oldest_generation_and_cycles_are_still_collected():
    import weakref

    class Node:
        pass

    with gc_paused():
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle made during the pause
        probe = weakref.ref(a)
    assert gc.get_freeze_count() == 0  # nothing left frozen
    del a, b
    gc.collect()
    assert probe() is None  # the cycle is collected by a full collection


def test_an_application_freeze_is_left_alone():
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with gc_paused():
            pass
        # not unfrozen by the pause (that would empty the permanent generation); a few frozen
        # objects may be freed meanwhile, which lowers the count by as many
        assert frozen // 2 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()
