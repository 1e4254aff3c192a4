"""The agent routes of ``soulmem serve`` (``bank/_http.py``), in process (Starlette's client).

Plain-text notes beside the serde shape, names, listing / reading / deleting notes, chat turns
into the short-term window, forgetting, JSON errors on every route, unknown fields refused and
no agent created by an empty write.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")

with warnings.catch_warnings():  # "use httpx2" (Starlette's test client)
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from soulmem_torch.bank import MemoryBank
from soulmem_torch.bank.serve import create_app
from soulmem_torch.errors import StoreError
from soulmem_torch.model.remember import note_from_text

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def client(tmp_path: Path):
    with TestClient(create_app(tmp_path / "bank")) as c:
        c.root = tmp_path / "bank"
        yield c


def _tea(client) -> dict:
    r = client.post(
        "/agents/npc-17/notes",
        json={
            "notes": [
                {"text": "I like tea", "name": "sem_tea", "tags": ["taste"]},
                {"text": "Shared a pot of tea with Mei", "kind": "situation",
                 "participants": ["Mei:friend"], "link_to": "sem_tea", "verb": "about"},
            ]
        },
    )  # fmt: skip
    assert r.status_code == 200, r.text
    return r.json()


def test_plain_notes_names_and_the_serde_shape(client) -> None:
    out = _tea(client)
    assert out["added"] == 2 and out["notes"] == 2 and len(out["ids"]) == 2
    serde = json.loads(note_from_text("osmanthus cake").to_json())
    r = client.post(
        "/agents/npc-17/notes", json={"notes": [serde], "names": {serde["id"]: "sem_osmanthus"}}
    )
    assert r.status_code == 200 and r.json()["notes"] == 3
    agent = client.get("/agents/npc-17").json()
    assert agent["notes"] == 3 and agent["links"] == 1
    assert set(agent["names"]) == {"sem_tea", "sem_osmanthus"}
    answer = client.post("/ask", json={"agent": "npc-17", "text": "tea"}).json()
    assert answer["association"][0]["name"] == "sem_tea"
    # persisted, names included
    bank = MemoryBank.load(client.root)
    assert bank.agent("npc-17").id_of("sem_osmanthus") is not None


def test_ask_answers_what_matches_and_all_everything(client) -> None:
    _tea(client)
    client.post("/agents/npc-17/notes", json={"notes": [{"text": "a red bicycle"}]})
    answer = client.post("/ask", json={"agent": "npc-17", "text": "tea"}).json()
    assert "a red bicycle" not in [m["name"] for m in answer["association"]]
    every = client.post("/ask", json={"agent": "npc-17", "text": "tea", "all": True}).json()
    assert len(every["association"]) >= len(answer["association"])
    nothing = client.post("/ask", json={"agent": "npc-17", "text": "quantum chromodynamics"})
    assert nothing.json()["association"] == []
    bad = client.post("/ask", json={"agent": "npc-17", "text": "tea", "all": "yes"})
    assert bad.status_code == 422 and "body.all" in bad.json()["error"]


def test_read_and_delete_notes(client) -> None:
    _tea(client)
    assert client.get("/agents").json() == {"agents": [{"id": "npc-17", "notes": 2, "links": 1}]}
    notes = client.get("/agents/npc-17/notes").json()["notes"]
    assert {n["name"] for n in notes} == {"sem_tea", None}
    one = client.get("/agents/npc-17/notes/sem_tea").json()
    assert one["label"] == "I like tea" and one["note"]["tags"] == ["taste"]
    assert client.get(f"/agents/npc-17/notes/{one['id']}").json()["id"] == one["id"]
    r = client.delete("/agents/npc-17/notes/sem_tea")
    assert r.status_code == 200 and r.json()["notes"] == 1
    assert client.get("/agents/npc-17/notes/sem_tea").status_code == 404
    assert len(MemoryBank.load(client.root).agent("npc-17")) == 1  # persisted
    assert client.delete("/agents/npc-17/notes/sem_tea").status_code == 404


def test_turns_reach_the_short_term_window(client) -> None:
    _tea(client)
    r = client.post(
        "/agents/npc-17/turns",
        json={"turns": [{"role": "user", "text": "hello"}, {"role": "assistant", "text": "hi!"}]},
    )
    assert r.status_code == 200 and r.json()["window"] == 2
    client.post("/agents/npc-17/turns", json={"text": "do you like tea?"})
    answer = client.post("/ask", json={"agent": "npc-17", "text": "tea"}).json()
    assert len(answer["short_history"]) == 3 and "do you like tea?" in answer["short_history"][-1]
    assert client.get("/agents/npc-17").json()["window"] == 3


def test_forget_dry_run_and_write(client) -> None:
    _tea(client)
    before = client.get("/agents/npc-17/notes").json()
    r = client.post("/agents/npc-17/forget", json={"now": "2099-01-01T00:00:00Z", "dry_run": True})
    assert r.status_code == 200 and r.json()["written"] is False
    assert client.get("/agents/npc-17/notes").json() == before
    r = client.post("/agents/npc-17/forget", json={"now": "2099-01-01T00:00:00Z"})
    assert r.status_code == 200 and r.json()["written"] is True
    assert client.get("/agents/npc-17/notes").json() != before


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "needle"),
    [
        ("POST", "/agents/npc-17/notes", {"notes": []}, 422, "creates no agent"),
        ("POST", "/agents/npc-17/notes", {"notes": [{"txt": "x"}]}, 422, "text"),
        ("POST", "/agents/npc-17/notes", {"notes": [{"text": "x", "colour": 1}]}, 422, "colour"),
        ("POST", "/agents/npc-17/notes", {"notes": [{"text": "x"}], "extra": 1}, 422, "extra"),
        ("POST", "/agents/npc-17/notes",
         {"notes": [{"text": "x", "link_to": "nope", "verb": "v"}]}, 422, "nope"),
        ("POST", "/agents/npc-17/notes", {"notes": [{"text": "x", "kind": "idea"}]}, 422, "kind"),
        ("POST", "/ask", {"agent": "npc-17", "text": "tea", "top": 3}, 422, "top"),
        ("POST", "/query", {"agent": "npc-17", "query": {}, "prio": 1}, 422, "prio"),
        ("POST", "/ask", {"agent": "nobody", "text": "tea"}, 404, "nobody"),
        ("GET", "/agents/nobody", None, 404, "nobody"),
        ("GET", "/agents/nobody/notes", None, 404, "nobody"),
        ("POST", "/agents/nobody/turns", {"text": "hi"}, 404, "nobody"),
        ("POST", "/agents/nobody/forget", {}, 404, "nobody"),
        ("POST", "/agents/npc-17/turns", {"turns": []}, 422, "turns"),
        ("POST", "/agents/npc-17/forget", {"now": "soon"}, 422, "now"),
        ("GET", "/nowhere", None, 404, "no route"),
        ("GET", "/ask", None, 405, "not allowed"),
    ],
)  # fmt: skip
def test_every_error_is_json(client, method, path, body, status, needle) -> None:
    r = client.request(method, path, json=body)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]
    assert client.get("/agents").json() == {"agents": []}  # no agent created by a failed write


def test_serve_refuses_a_path_that_is_not_a_bank(tmp_path: Path) -> None:
    from soulmem_torch import SoulMem

    store = tmp_path / "store"
    SoulMem.from_notes([note_from_text("tea")]).save(store)
    with pytest.raises(StoreError, match="memory store"):
        create_app(store)
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreError, match="is a file"):
        create_app(tmp_path / "file")
    (tmp_path / "empty").mkdir()
    create_app(tmp_path / "empty")  # an empty directory is a new bank
