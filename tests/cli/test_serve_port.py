"""``soulmem serve`` as a user starts it: ``--port 0`` prints the port it really got, and a path
that is not a bank is refused with one line (nothing written into it)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from tests.conftest import REPO  # noqa: E402


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONIOENCODING="utf-8", OMP_NUM_THREADS="1")


def test_port_0_prints_the_bound_port_and_serves(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "soulmem_torch", "serve", str(tmp_path / "bank"), "--port", "0"],
        cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = proc.stdout.readline()
        m = re.search(r"on http://127\.0\.0\.1:(\d+)$", line.strip())
        assert m, line
        port = int(m.group(1))
        assert port != 0
        deadline = time.monotonic() + 60
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
                time.sleep(0.2)
        assert r.status_code == 200 and r.json()["agents"] == 0
        r = httpx.post(f"http://127.0.0.1:{port}/nowhere", json={}, timeout=5)
        assert r.status_code == 404 and "error" in r.json()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_store_is_not_served(tmp_path: Path) -> None:
    store = tmp_path / "my_store"
    subprocess.run(
        [sys.executable, "-m", "soulmem_torch", "-q", "add", str(store), "--semantic", "tea"],
        cwd=REPO, env=_env(), check=True, capture_output=True,
    )  # fmt: skip
    before = sorted(p.name for p in store.iterdir())
    proc = subprocess.run(
        [sys.executable, "-m", "soulmem_torch", "serve", str(store), "--port", "0"],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    (error,) = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
    assert "holds no bank" in error and "memory store" in error
    assert sorted(p.name for p in store.iterdir()) == before  # nothing written into it
