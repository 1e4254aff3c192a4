"""The server's write path and limits: a refused write is never served nor persisted, disk
errors are 503 (not 400), one server per bank, 413 for huge bodies / texts / batches, 503 at
the agent cap, idle connections closed, a missing manifest refused."""

from __future__ import annotations

import errno
import json
import socket
import sqlite3
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("starlette")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("httpx")
from starlette.testclient import TestClient  # noqa: E402

from soulmem_torch.bank import MemoryBank  # noqa: E402
from soulmem_torch.bank.serve import (  # noqa: E402
    ServerBusyError,
    ServerLimits,
    _idle_protocol,
    create_app,
)
from soulmem_torch.errors import StoreError, ValidationError  # noqa: E402
from soulmem_torch.store import db as store_db  # noqa: E402
from tests.bank.helpers import sample_notes  # noqa: E402


def _serde(text: str) -> dict:
    from soulmem_torch.model import MemoryNote, SemMemory

    note = MemoryNote.build(SemMemory(content=text, aliases=[], concept_type="Entity",
                                      description=""))  # fmt: skip
    return json.loads(note.to_json())


@pytest.fixture()
def bank_dir(tmp_path: Path) -> Path:
    bank = MemoryBank()
    bank.add_agent("npc-0", sample_notes(list(range(10))))
    bank.save(tmp_path)
    return tmp_path


def _client(root: Path, **limits: object) -> TestClient:
    return TestClient(create_app(root, limits=ServerLimits(**limits)))  # type: ignore[arg-type]


def test_lone_surrogate_is_422_and_never_served_or_persisted(bank_dir: Path) -> None:
    body = json.dumps({"notes": [_serde("cut emoji \ud83d")]})  # JSON escapes it: \\ud83d
    with _client(bank_dir) as client:
        r = client.post("/agents/npc-new/notes", content=body,
                        headers={"content-type": "application/json"})  # fmt: skip
        assert r.status_code == 422 and "surrogate" in r.json()["error"]
        assert client.get("/health").json()["agents"] == 1  # not registered
        r = client.post("/agents/npc-0/notes", json={"notes": [_serde("fine")]})
        assert r.status_code == 200, r.text
    assert MemoryBank.load(bank_dir).agents() == ["npc-0"]  # nor persisted later


def test_disk_full_is_503_and_rolled_back(bank_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(self, *a, **k):  # type: ignore[no-untyped-def]
        raise OSError(errno.ENOSPC, "No space left on device")

    with _client(bank_dir) as client:
        monkeypatch.setattr(store_db.Database, "commit_version", full)
        r = client.post("/agents/npc-0/notes", json={"notes": [_serde("refused write")]})
        assert r.status_code == 503 and "disk is full" in r.json()["error"]
        monkeypatch.undo()
        assert client.get("/health").json()["notes"] == 10  # memory rolled back
        r = client.post("/agents/npc-0/notes", json={"notes": [_serde("accepted")]})
        assert r.json()["notes"] == 11
    assert len(MemoryBank.load(bank_dir).agent("npc-0")) == 11


def test_a_second_server_on_one_bank_is_refused(bank_dir: Path) -> None:
    with _client(bank_dir):
        with pytest.raises(ServerBusyError, match="another soulmem serve"):
            create_app(bank_dir)
    with _client(bank_dir):  # released at shutdown
        pass


def test_body_text_and_batch_limits_are_413(bank_dir: Path) -> None:
    with _client(bank_dir, max_body_bytes=4096, max_text_chars=300, max_batch=2) as client:
        r = client.post("/ask", content=b"{" + b" " * 10_000 + b"}",
                        headers={"content-type": "application/json"})  # fmt: skip
        assert r.status_code == 413 and "limit of 4096 bytes" in r.json()["error"]

        def chunks():  # no Content-Length: counted while it streams
            for _ in range(10):
                yield b" " * 1000

        r = client.post("/ask", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413
        r = client.post("/ask", json={"agent": "npc-0", "text": "x" * 301})
        assert r.status_code == 413 and "301 characters" in r.json()["error"]
        r = client.post("/agents/npc-0/notes", json={"notes": [_serde("a")] * 3})
        assert r.status_code == 413 and "3 notes" in r.json()["error"]
        r = client.post("/agents/npc-0/notes", json={"notes": [_serde("y" * 400)]})
        assert r.status_code == 413
        assert client.post("/ask", json={"agent": "npc-0", "text": "rain"}).status_code == 200


def test_agent_cap_is_503(bank_dir: Path) -> None:
    with _client(bank_dir, max_agents=2) as client:
        assert client.post("/agents/b/notes", json={"notes": [_serde("b")]}).status_code == 200
        r = client.post("/agents/c/notes", json={"notes": [_serde("c")]})
        assert r.status_code == 503 and "limit" in r.json()["error"]
        assert client.post("/agents/b/notes", json={"notes": [_serde("b2")]}).status_code == 200


def test_bad_limits_and_missing_manifest(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="limits.max_batch"):
        ServerLimits(max_batch=0)
    (tmp_path / "agents" / "x").mkdir(parents=True)  # agents/ without any manifest
    with pytest.raises(StoreError, match="refusing to start an empty bank"):
        create_app(tmp_path)
    create_app(tmp_path / "fresh").state.release()  # an empty directory: an empty bank


def test_idle_connections_are_closed(bank_dir: Path) -> None:
    app = create_app(bank_dir)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="error", http=_idle_protocol(),
        timeout_keep_alive=0.5, limit_concurrency=64,
    ))  # fmt: skip
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.02)
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(40)]
        for sock in idle:
            sock.settimeout(5)
        closed = sum(sock.recv(1) == b"" for sock in idle)  # the server hung up on each
        assert closed == len(idle)
        import httpx

        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200
        for sock in idle:
            sock.close()
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_kill_9_during_writes_loses_no_acknowledged_note(bank_dir: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "soulmem_torch", "serve", str(bank_dir), "--port", str(port),
           "--threads", "1", "-q"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=dict(os.environ, PYTHONUNBUFFERED="1"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    acked: list[str] = []
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                httpx.get(url + "/health", timeout=2)
                break
            except httpx.HTTPError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
                time.sleep(0.2)
        stop = threading.Event()

        def writer(tag: str) -> None:
            with httpx.Client(base_url=url, timeout=30) as client:
                for j in range(10_000):
                    if stop.is_set():
                        return
                    note = _serde(f"note {tag} {j}")
                    try:
                        r = client.post(f"/agents/{tag}/notes", json={"notes": [note]})
                    except httpx.HTTPError:
                        return
                    if r.status_code == 200:
                        acked.append(note["id"])

        threads = [threading.Thread(target=writer, args=(f"w{k}",)) for k in range(4)]
        for t in threads:
            t.start()
        while len(acked) < 40 and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)  # in the middle of the writes
        proc.wait(timeout=30)
        stop.set()
        for t in threads:
            t.join(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert len(acked) >= 40
    bank = MemoryBank.load(bank_dir)  # loadable, every agent whole
    assert not bank.damaged
    stored = {str(i) for a in bank.agents() for i in bank.graph(a).ids}
    assert set(acked) <= stored


def test_requests_in_flight_over_the_cap_are_503_json() -> None:
    import asyncio

    from soulmem_torch.bank.serve import _Guard, _send_json

    class Slow:
        state = None
        routes = ()

        async def __call__(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
            await asyncio.sleep(0.2)
            await _send_json(send, 200, {"ok": True})

    guard = _Guard(Slow(), max_in_flight=2)

    async def one() -> tuple[int, dict]:
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        await guard({"type": "http"}, None, send)
        return sent[0]["status"], json.loads(sent[1]["body"])

    async def main() -> list[tuple[int, dict]]:
        return await asyncio.gather(*(one() for _ in range(3)))

    results = asyncio.run(main())
    assert sorted(code for code, _ in results) == [200, 200, 503]
    assert any("in flight" in body.get("error", "") for _, body in results)
    assert guard.in_flight == 0


def test_serve_reuses_the_banks_recorded_embedder(tmp_path: Path) -> None:
    import argparse

    from soulmem_torch.cli._errors import CLIError
    from soulmem_torch.cli.serve import _bank_embedder
    from soulmem_torch.embedding import HashingEmbedder
    from soulmem_torch.embedding.identity import embedder_from_spec

    bank = MemoryBank(embedder=embedder_from_spec("hashing"))
    bank.add_agent("npc-0", sample_notes(list(range(3))))
    bank.save(tmp_path)
    args = argparse.Namespace(embedder=None, bank_dir=str(tmp_path))
    assert isinstance(_bank_embedder(args), HashingEmbedder)
    args.embedder = "hashing"
    assert isinstance(_bank_embedder(args), HashingEmbedder)
    with sqlite3.connect(tmp_path / "bank.sqlite3") as conn:  # a recorded code spec
        (gen, written, info) = conn.execute("SELECT gen, written_at, info FROM versions").fetchone()
        data = json.loads(info)
        data["embedder"]["spec"] = "my_pkg.embedders:make"
        text = json.dumps(data, sort_keys=True, separators=(",", ":"))
        conn.execute("UPDATE versions SET info = ?, sha = ?",
                     (text, store_db.version_digest(gen, written, text)))  # fmt: skip
    args.embedder = None
    with pytest.raises(CLIError, match="pass --embedder my_pkg.embedders:make"):
        _bank_embedder(args)


def test_a_bank_write_from_outside_the_running_server_is_refused(bank_dir: Path) -> None:
    from soulmem_torch.store import StoreLockedError

    outsider = MemoryBank.load(bank_dir)
    with _client(bank_dir) as client:
        with pytest.raises(StoreLockedError, match="soulmem serve is serving this bank"):
            outsider.save(bank_dir)
        r = client.post("/agents/npc-0/notes", json={"notes": [_serde("through the API")]})
        assert r.status_code == 200
    outsider.save(bank_dir)  # the server is gone: allowed again
