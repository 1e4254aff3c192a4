"""``soulmem consolidate`` and the serve idle trigger."""

from __future__ import annotations

import json

import pytest

from soulmem_torch import SoulMem
from soulmem_torch.cli import main
from soulmem_torch.data import sample_memory_path


@pytest.fixture
def store(tmp_path):
    mem = SoulMem.from_graph_file(sample_memory_path())
    for _ in range(2):
        mem.ask("a rainy afternoon at the café")
    mem.working_memory.sliding_window.set_summary("Oliver came in the rain. He asked for tea.")
    mem.save(tmp_path / "s")
    return tmp_path / "s"


def test_consolidate_fake_saves_notes_and_links(store, capsys):
    assert main(["consolidate", str(store), "--fake", "--json", "-q"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["saved"] and len(out["notes_added"]) == 2 and out["links_changed"]
    back = SoulMem.load(store)
    assert len(back) == 79 and back.working_memory.sliding_window.summary == ""
    # nothing left: the second run changes nothing
    assert main(["consolidate", str(store), "--fake", "--json", "-q"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert not again["saved"] and again["summary_was_empty"]


def test_consolidate_with_a_failing_llm_exits_1_and_keeps_the_store(store, tmp_path, capsys):
    (tmp_path / "bad_llm.py").write_text("async def complete(system, user):\n    return 'junk'\n")
    from soulmem_torch.store import MemoryStore

    before = MemoryStore(store).current_version()
    code = main(["consolidate", str(store), "--llm", f"{tmp_path / 'bad_llm.py'}:complete", "-q"])
    assert code == 1
    assert "not changed" in capsys.readouterr().err
    assert MemoryStore(store).current_version() == before


def test_consolidate_needs_an_llm_choice(store):
    assert main(["consolidate", str(store)]) == 2


def test_serve_idle_trigger_updates_plasticity(tmp_path):
    pytest.importorskip("starlette")
    import asyncio

    from soulmem_torch.bank.bank import MemoryBank
    from soulmem_torch.bank.serve import create_app
    from soulmem_torch.model.soul_tune import load_soul_tune_graph

    bank = MemoryBank()
    bank.add_agent("npc", load_soul_tune_graph(sample_memory_path()).notes)
    bank.save(tmp_path / "bank")
    app = create_app(tmp_path / "bank", idle_after=0.05, idle_interval=0.02)

    async def run():
        import httpx

        transport = httpx.ASGITransport(app=app)
        inner = app.app  # the Starlette app inside the connection guard
        async with inner.router.lifespan_context(inner):
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                for _ in range(2):
                    r = await client.post("/ask", json={"agent": "npc", "text": "rain at the café"})
                    assert r.status_code == 200
                for _ in range(50):
                    await asyncio.sleep(0.05)
                    health = (await client.get("/health")).json()
                    if health["idle_runs"]:
                        break
                return health

    try:
        health = asyncio.run(run())
    finally:
        app.state.release()  # the bank directory's SERVE.lock
    assert health["idle_runs"] >= 1
    # the idle run's plasticity update is persisted: some link's intensity moved on disk
    # (the bank database keeps notes and links; retrieval records are kept by stores only)
    original = {
        lk.id: lk.intensity for n in bank.agent("npc").cluster.notes() for lk in n.mem_links
    }
    loaded = MemoryBank.load(tmp_path / "bank")
    stored = {
        lk.id: lk.intensity for n in loaded.agent("npc").cluster.notes() for lk in n.mem_links
    }
    assert set(stored) == set(original)
    assert any(stored[k] != v for k, v in original.items())
