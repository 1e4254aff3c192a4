"""Bounded stress tests of the store's writer lock and atomicity, across real processes.

* 3 processes × 10 ``soulmem import`` runs into one store at once → every note is present and
  the store loads (before the lock, one batch in most runs was silently lost);
* ``kill -9`` of an importer at random moments → the store holds exactly the notes of some
  whole number of imports (the previous or the new version, never a mix), the next writer is
  not blocked (the OS dropped the dead writer's lock) and cleans the leftovers;
* ``kill -9`` in the middle of a write transaction (half the rows inserted) and just before
  its ``COMMIT`` → the previous version stays live, the next save is not blocked.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from soulmem_torch.store import MemoryStore
from tests.conftest import REPO
from tests.store._helpers import note

IMPORTER = """
import sys
from soulmem_torch.cli import main
store, files = sys.argv[1], sys.argv[2:]
for f in files:
    code = main(["import", f, store, "-q"])
    print(f"done {f} {code}", flush=True)
    if code:
        sys.exit(code)
"""


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONIOENCODING="utf-8", SOULMEM_LOCK_TIMEOUT="60")


def _batches(tmp_path: Path, tag: int, count: int, size: int) -> list[tuple[Path, set[str]]]:
    out = []
    for j in range(count):
        ids = range(10_000 * tag + size * j, 10_000 * tag + size * (j + 1))
        path = tmp_path / f"batch-{tag}-{j}.jsonl"
        path.write_text("".join(note(i).to_json() + "\n" for i in ids), encoding="utf-8")
        out.append((path, {str(note(i).id) for i in ids}))
    return out


def test_three_processes_ten_imports_each_lose_nothing(tmp_path: Path) -> None:
    store = tmp_path / "store"
    batches = {k: _batches(tmp_path, k, 10, 2) for k in range(3)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", IMPORTER, str(store), *(str(p) for p, _ in batches[k])],
            cwd=REPO,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(3)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err
        assert out.count(" 0\n") == 10, out
    contents = MemoryStore(store).load()
    expected = set().union(*(ids for k in range(3) for _, ids in batches[k]))
    assert {str(n.id) for n in contents.notes} == expected
    assert len(contents.notes) == 60
    assert contents.embedder_identity is not None
    assert all(e is not None for e in contents.embeddings)


def test_kill_9_during_imports_leaves_a_whole_version(tmp_path: Path) -> None:
    store = tmp_path / "store"
    batches = _batches(tmp_path, 0, 40, 150)
    rng = random.Random(11)
    for round_ in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-c", IMPORTER, str(store), *(str(p) for p, _ in batches)],
            cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        assert proc.stdout is not None
        line = proc.stdout.readline()
        while line and not line.startswith("done"):  # one import done: the next are under way
            line = proc.stdout.readline()
        assert line.startswith("done"), line
        time.sleep(rng.uniform(0.0, 0.6))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL, round_

        contents = MemoryStore(store, lock_timeout=5).load()  # loads: never a half state
        ids = {str(n.id) for n in contents.notes}
        prefixes = [set().union(*(b for _, b in batches[:m])) for m in range(1, 41)]
        assert ids in prefixes, f"round {round_}: {len(ids)} notes, not a whole number of imports"
        # the next writer is not blocked by the dead one and cleans its leftovers
        MemoryStore(store, lock_timeout=5).save(contents.notes, contents.embeddings)


KILL_AT = """
import os, signal, sys
from soulmem_torch.store import MemoryStore
from soulmem_torch.store import db as store_db
from tests.store._helpers import notes
where = sys.argv[2]
if where == "mid-rows":  # SIGKILL while the rows are being inserted
    calls = []
    real_digest = store_db.NoteRow.digest
    def dying_digest(self, agent):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        return real_digest(self, agent)
    store_db.NoteRow.digest = dying_digest
else:  # SIGKILL after every row and the version row, just before COMMIT
    real_commit = store_db.Database.commit_version
    def dying_commit(self, *args, **kwargs):
        real_commit(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)
    store_db.Database.commit_version = dying_commit
MemoryStore(sys.argv[1]).save(notes(0, 5))
"""


def test_kill_9_at_the_commit_point_keeps_the_previous_version(tmp_path: Path) -> None:
    for where in ("mid-rows", "before-commit"):
        store_path = tmp_path / where
        store = MemoryStore(store_path, keep_versions=1, lock_timeout=5)
        store.save([note(0)])
        live = store.current_version()
        proc = subprocess.run(
            [sys.executable, "-c", KILL_AT, str(store_path), where],
            cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        assert store.current_version() == live
        assert [n.id for n in store.load().notes] == [note(0).id]
        store.save([note(0), note(1)])  # not blocked by the dead writer
        assert len(store.load().notes) == 2, where


ADDER = """
import sys
from soulmem_torch.cli import main
store, tag = sys.argv[1], sys.argv[2]
for j in range(5):
    code = main(["add", store, "--semantic", f"concept {tag}-{j}", "-q"])
    print(f"done {j} {code}", flush=True)
"""


def test_concurrent_adds_all_land(tmp_path: Path) -> None:
    store = tmp_path / "store"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", ADDER, str(store), tag],
            cwd=REPO,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for tag in ("a", "b")
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0 and out.count(" 0\n") == 5, (out, err)
    contents = MemoryStore(store).load()
    names = sorted(n.mem_type.content for n in contents.notes)
    assert names == sorted(f"concept {t}-{j}" for t in "ab" for j in range(5))
