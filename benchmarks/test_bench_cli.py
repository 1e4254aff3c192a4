"""Process time of one ``soulmem`` command on a small store (fast feedback, issue 19).

Run: ``pytest benchmarks/test_bench_cli.py --benchmark-enable --benchmark-only -s``.

Each round runs the command in a fresh interpreter (``python -m soulmem_torch``) and reads the
child's CPU time (user + system, ``resource.getrusage(RUSAGE_CHILDREN)``): what a user waits
for at the prompt on an idle machine, with imports included. Side by side in one run:

* ``python -c "import torch"`` — the floor every command that touches tensors pays;
* ``versions`` — a command that reads a store without retrieving (no PyTorch Geometric);
* ``query`` — a text question on a 3-note store (imports PyG: ``MemoryGraph`` is a PyG
  ``Data``).

Target (issue 19): a query on a small store in <= 1.5 s of process time.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {
    "import_torch": ["-c", "import torch"],
    "versions": ["-m", "soulmem_torch", "versions", "{store}"],
    "query": ["-m", "soulmem_torch", "-q", "query", "{store}", "osmanthus cake"],
}


def _cpu_seconds(argv: list[str], env: dict[str, str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, *argv], env=env, check=True, capture_output=True, cwd=ROOT)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "s"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for flags in (
        ["--semantic", "osmanthus cake", "--name", "sem_osmanthus"],
        ["--situation", "Baked osmanthus cake with Grandma"],
        ["--action", "Offer a slice of osmanthus cake"],
    ):
        subprocess.run(
            [sys.executable, "-m", "soulmem_torch", "-q", "add", str(path), *flags],
            env=env, check=True, capture_output=True, cwd=ROOT,
        )  # fmt: skip
    return path


@pytest.mark.parametrize("name", list(COMMANDS))
def test_cli_process_time(benchmark, store: Path, name: str) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    argv = [a.format(store=store) for a in COMMANDS[name]]
    cpu: list[float] = []
    benchmark.pedantic(lambda: cpu.append(_cpu_seconds(argv, env)), rounds=3, iterations=1)
    benchmark.extra_info["cpu_seconds_min"] = round(min(cpu), 3)
    print(f"\n{name}: process time {min(cpu):.2f} s (min of {len(cpu)})")
