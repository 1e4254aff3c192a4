"""``soulmem serve``: the HTTP API over a real socket (uvicorn on a free loopback port)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("starlette")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from soulmem_torch.bank import MemoryBank  # noqa: E402
from soulmem_torch.bank.serve import create_app  # noqa: E402
from tests.bank.helpers import TEXTS, config, sample_notes  # noqa: E402

CFG = config("power")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Server:
    """uvicorn in a thread, serving ``app`` on a free loopback port."""

    def __init__(self, app) -> None:
        self.port = _free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(
                app, host="127.0.0.1", port=self.port, log_level="error", lifespan="on",
                # a loaded CI box can starve the client's thread for seconds between two requests
                # on one keep-alive connection; uvicorn's 5 s default then closes it while the
                # client sends (httpx.ReadError). The idle limit itself is tested elsewhere.
                timeout_keep_alive=600,
            )  # fmt: skip
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # what `soulmem serve --threads 1` does (a shared 2-core box)
    root = tmp_path_factory.mktemp("bank")
    bank = MemoryBank()
    bank.add_agent("npc-0", sample_notes(list(range(0, 40))))
    bank.add_agent("npc-1", sample_notes(list(range(30, 77))))
    bank.save(root)
    app = create_app(root, config=CFG, max_batch=64, max_wait_ms=5)
    try:
        with _Server(app) as url:
            yield url, root, app
    finally:
        torch.set_num_threads(threads)


def test_health_ask_query_and_errors(served) -> None:
    url, _, app = served
    with httpx.Client(base_url=url, timeout=60) as client:
        health = client.get("/health").json()
        assert health["status"] == "ok" and health["agents"] == 2 and health["notes"] == 87
        r = client.post("/ask", json={"agent": "npc-0", "text": TEXTS[0]})
        assert r.status_code == 200, r.text
        body = r.json()
        want = app.state.bank.ask(["npc-0"], [TEXTS[0]], config=CFG)[0]
        assert [a["id"] for a in body["association"]] == [str(i) for i, _ in want.association]
        assert all(isinstance(a["name"], str) and a["name"] for a in body["association"])
        q = {"variant": {"Situation": [{"narrative": "rain at the café"}]}, "tag": []}
        r = client.post("/query", json={"agent": "npc-1", "query": q, "priority": 2})
        assert r.status_code == 200, r.text
        assert r.json()["priority"] == 2
        # errors: one line each, with the right status
        r = client.post("/ask", json={"agent": "nobody", "text": "hi"})
        assert r.status_code == 404 and "'nobody' is not in the bank" in r.json()["error"]
        r = client.post("/ask", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 400 and "expected JSON" in r.json()["error"]
        r = client.post("/ask", json={"agent": "npc-0"})
        assert r.status_code == 422 and "body.text" in r.json()["error"]
        r = client.post("/query", json={"agent": "npc-0", "query": {"variant": 3}})
        assert r.status_code == 422 and "body.query" in r.json()["error"]
        r = client.post("/agents/npc-0/notes", json={"notes": [{"id": "x"}]})
        assert r.status_code == 422 and "body.notes" in r.json()["error"]
        assert client.get("/ask").status_code == 405


def test_add_notes_is_persisted(served) -> None:
    url, root, _ = served
    notes = [json.loads(n.to_json()) for n in sample_notes(list(range(60, 70)))]
    with httpx.Client(base_url=url, timeout=60) as client:
        r = client.post("/agents/npc-new/notes", json={"notes": notes})
        assert r.status_code == 200, r.text
        assert r.json() == {
            "agent": "npc-new",
            "added": 10,
            "notes": 10,
            "ids": [n["id"] for n in notes],
        }
        r = client.post("/agents/npc-new/notes", json={"notes": notes[:3]})
        assert r.json()["added"] == 0  # the same notes again: nothing new
        r = client.post("/ask", json={"agent": "npc-new", "text": TEXTS[3]})
        assert r.status_code == 200
        for chunk in (notes[:5], notes[5:]):  # an agent loaded from the directory, twice
            r = client.post("/agents/npc-0/notes", json={"notes": chunk})
            assert r.status_code == 200, r.text
        assert r.json()["notes"] == 50
    loaded = MemoryBank.load(root)
    assert "npc-new" in loaded and len(loaded.agent("npc-new")) == 10
    assert len(loaded.agent("npc-0")) == 50
    assert not [p for p in Path(root).iterdir() if p.name.startswith(".bank.json.")]


def test_load_2000_requests_from_64_clients(served) -> None:
    """Every request answered, nothing lost; throughput and latency printed."""
    url, _, app = served
    total, clients = 2000, 64

    async def main() -> list[float]:
        latencies: list[float] = []
        jobs = iter(range(total))
        limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
        async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

            async def worker() -> None:
                for i in jobs:
                    t0 = time.perf_counter()
                    r = await client.post(
                        "/ask", json={"agent": f"npc-{i % 2}", "text": TEXTS[i % len(TEXTS)]}
                    )
                    latencies.append(time.perf_counter() - t0)
                    assert r.status_code == 200, r.text
                    assert r.json()["agent"] == f"npc-{i % 2}"

            await asyncio.gather(*(worker() for _ in range(clients)))
        return latencies

    before = app.state.retriever.stats.answered
    t0 = time.perf_counter()
    latencies = asyncio.run(main())
    wall = time.perf_counter() - t0
    assert len(latencies) == total
    assert app.state.retriever.stats.answered - before == total
    latencies.sort()
    p50, p99 = latencies[total // 2], latencies[int(total * 0.99)]
    stats = app.state.retriever.stats
    print(
        f"\nserve load: {total} requests, {clients} clients: {total / wall:.0f} req/s, "
        f"p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms, largest batch {stats.largest_batch}"
    )
    assert stats.largest_batch > 1


def test_soulmem_serve_command(tmp_path) -> None:
    """The installed command line: `soulmem serve BANK_DIR --port P` answers, then stops."""
    bank = MemoryBank()
    bank.add_agent("npc-0", sample_notes(list(range(20))))
    bank.save(tmp_path / "bank")
    port = _free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "soulmem_torch", "serve", str(tmp_path / "bank"),
           "--port", str(port), "--threads", "1", "-q"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except httpx.HTTPError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(proc.communicate()[1].decode()) from None
                time.sleep(0.2)
        assert r.json()["agents"] == 1
        r = httpx.post(f"http://127.0.0.1:{port}/ask", json={"agent": "npc-0", "text": "rain"})
        assert r.status_code == 200 and "association" in r.json()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    bad = subprocess.run(
        [sys.executable, "-m", "soulmem_torch", "serve", str(tmp_path), "--port", "70000"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "port" in bad.stderr
