"""One writer at a time: the lock serializes writers (threads and processes), is released when
its holder dies, is bounded by a timeout; stale reads fail clearly instead of losing data; and
readers see whole versions only while a writer prunes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from soulmem_torch import SoulMem
from soulmem_torch.embedding import HashingEmbedder
from soulmem_torch.errors import StoreError, ValidationError
from soulmem_torch.store import (
    DirectoryStore,
    MemoryStore,
    StoreChangedError,
    StoreLockedError,
)
from tests.conftest import REPO
from tests.store._helpers import notes


def test_lock_is_reentrant_and_save_inside_it_works(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path)
    other_spelling = tmp_path / "x" / ".." / "."
    (tmp_path / "x").mkdir()
    with store.lock(), MemoryStore(other_spelling, lock_timeout=2).lock():  # re-entered
        store.save(notes(0, 2))
    assert len(store.load().notes) == 2
    assert (tmp_path / "LOCK").exists()


def test_lock_timeout_gives_a_clear_error(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path, lock_timeout=0.2)
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with MemoryStore(tmp_path).lock():
            holding.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert holding.wait(10)
        t0 = time.monotonic()
        with pytest.raises(StoreLockedError, match=r"another writer has held .*LOCK for 0.2 s"):
            store.save(notes(0, 1))
        assert time.monotonic() - t0 < 5
    finally:
        release.set()
        thread.join()
    assert not store.exists()  # nothing was written while locked out
    store.save(notes(0, 1))


def test_bad_lock_timeouts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for bad in (0, -1, float("inf"), float("nan"), "3"):
        with pytest.raises(ValidationError, match="lock_timeout: expected a finite number"):
            MemoryStore(tmp_path, lock_timeout=bad)  # type: ignore[arg-type]
    monkeypatch.setenv("SOULMEM_LOCK_TIMEOUT", "soon")
    with pytest.raises(ValidationError, match=r"\$SOULMEM_LOCK_TIMEOUT: expected a number"):
        MemoryStore(tmp_path)
    monkeypatch.setenv("SOULMEM_LOCK_TIMEOUT", "12.5")
    assert MemoryStore(tmp_path).lock_timeout == 12.5


def test_lock_of_a_killed_process_is_released(tmp_path: Path) -> None:
    """A writer killed with SIGKILL while holding the lock leaves no stale lock behind."""
    code = (
        "import os, signal, sys\n"
        "from soulmem_torch.store import MemoryStore\n"
        "with MemoryStore(sys.argv[1]).lock():\n"
        "    print('locked', flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], cwd=REPO, capture_output=True, text=True
    )
    assert proc.stdout.strip() == "locked" and proc.returncode == -9
    store = MemoryStore(tmp_path, lock_timeout=2)
    store.save(notes(0, 2))  # the lock is free at once
    assert len(store.load().notes) == 2


def test_threads_read_merge_write_under_the_lock_lose_nothing(tmp_path: Path) -> None:
    store_path = tmp_path / "s"
    errors: list[BaseException] = []

    def writer(k: int) -> None:
        try:
            for j in range(5):
                store = MemoryStore(store_path)
                with store.lock():
                    old = store.load().notes if store.exists() else []
                    store.save([*old, *notes(100 * k + j, 100 * k + j + 1)])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    ids = {str(n.id) for n in MemoryStore(store_path).load().notes}
    assert ids == {str(n.id) for k in range(3) for n in notes(100 * k, 100 * k + 5)}


def test_stale_base_version_fails_clearly(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path)
    store.save(notes(0, 2))
    base = store.current_version()
    MemoryStore(tmp_path).save(notes(0, 3))  # another writer commits in between
    with pytest.raises(StoreChangedError, match="another writer saved version .* nothing was"):
        store.save(notes(0, 1), base_version=base)
    assert len(store.load().notes) == 3
    with pytest.raises(StoreChangedError, match="read from an empty store"):
        store.save(notes(0, 1), base_version=None)
    store.save(notes(0, 4), base_version=store.current_version())
    assert len(store.load().notes) == 4


def test_soulmem_save_after_a_concurrent_write_fails_instead_of_losing_it(
    tmp_path: Path,
) -> None:
    emb = HashingEmbedder(64)
    mem = SoulMem(embedder=emb)
    mem.add_notes(notes(0, 2))
    mem.save(tmp_path)
    mem.save(tmp_path)  # saving twice from the same object is fine
    first = SoulMem.load(tmp_path, embedder=emb)
    second = SoulMem.load(tmp_path, embedder=emb)
    second.add_notes(notes(2, 4))
    second.save(tmp_path)
    first.add_notes(notes(4, 5))
    with pytest.raises(StoreChangedError):
        first.save(tmp_path)
    assert len(MemoryStore(tmp_path).load().notes) == 4
    first.save(tmp_path / "elsewhere")  # another store: no base to check


def test_readers_see_whole_versions_while_a_writer_prunes(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path, keep_versions=1)
    store.save(notes(0, 1))
    stop = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                contents = MemoryStore(tmp_path).load()
                seen.append(len(contents.notes))
                assert contents.notes == notes(0, len(contents.notes))
            except BaseException as exc:
                errors.append(exc)
                return

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for n in range(2, 40):
            store.save(notes(0, n))
    finally:
        stop.set()
        thread.join()
    assert not errors, errors[:1]
    assert seen


def test_load_retries_when_the_version_vanishes_under_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deterministic version of the race above (the legacy directory format): the first read
    hits a pruned version."""
    MemoryStore = DirectoryStore
    store = MemoryStore(tmp_path, keep_versions=1)
    store.save(notes(0, 1))
    real = MemoryStore._load_version
    calls = []

    def racing(self: MemoryStore, version_dir: Path):  # type: ignore[no-untyped-def]
        calls.append(version_dir.name)
        if len(calls) == 1:
            MemoryStore(tmp_path, keep_versions=1).save(notes(0, 5))  # swap + prune
        return real(self, version_dir)

    monkeypatch.setattr(MemoryStore, "_load_version", racing)
    assert len(store.load().notes) == 5
    assert len(calls) == 2 and calls[0] != calls[1]


def test_bad_store_damage_is_not_retried_forever(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path)  # the legacy directory format
    store.save(notes(0, 2))
    vdir = tmp_path / "versions" / store.current_version()
    os.remove(vdir / "notes.jsonl")
    with pytest.raises(StoreError, match="notes.jsonl: missing"):
        store.load()
