"""The daily-work CLI: ``soulmem add`` (flags, serde notes on stdin), ``query`` with several
texts in one batch, no zero-score rows; every bad input is one line, the right exit status, no
traceback, and nothing written. Subprocess tests, like tests/cli/test_cli.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from soulmem_torch.data import sample_memory_path
from soulmem_torch.store import MemoryStore
from tests.cli.test_cli import fails, ok, soulmem
from tests.conftest import REPO


def soulmem_stdin(stdin: str, *args: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
    """``python -m soulmem_torch ARGS`` with ``stdin`` as its standard input."""
    return subprocess.run(
        [sys.executable, "-m", "soulmem_torch", *map(str, args)],
        cwd=REPO,
        env=dict(os.environ, PYTHONIOENCODING="utf-8"),
        input=stdin,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=180,
    )


def load(store: Path):
    from soulmem_torch import SoulMem

    return SoulMem.load(store)


@pytest.fixture(scope="module")
def small_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five notes added from flags: two actions, a concept, two episodes (links of every kind
    the flags offer, one trigger with probability 0)."""
    store = tmp_path_factory.mktemp("daily") / "store"
    out = ok(
        soulmem("add", store, "--action", "Offer a slice of osmanthus cake", "--name", "proc_offer")
    )
    assert "added proc_offer (action, 0 link(s))" in out
    assert "now holds 1 notes" in out
    ok(soulmem("add", store, "--action", "Say goodbye", "--action-type", "think"))
    added = json.loads(
        ok(
            soulmem(
                "add",
                store,
                "--semantic",
                "osmanthus cake",
                "--alias",
                "桂花糕",
                "--alias",
                "sweet-scented cake",
                "--description",
                "Grandma's recipe",
                "--name",
                "sem_cake",
                "--tag",
                "food",
                "--json",
            )
        )
    )
    assert added["notes"] == 3 and added["skipped"] == [] and added["version"]
    assert added["added"][0]["readable_id"] == "sem_cake"
    assert added["added"][0]["kind"] == "concept"
    ok(
        soulmem(
            "add",
            store,
            "--situation",
            "Grandma bakes osmanthus cake",
            "--location",
            "Grandma's kitchen",
            "--participant",
            "外婆:teacher",
            "--participant",
            "me",
            "--time",
            "2026-07-20T12:00:00Z",
            "--name",
            "sit_bake",
            "--link-to",
            "proc_offer",
            "--trigger",
            "0",
        )
    )
    ok(
        soulmem(
            "add",
            store,
            "--situation",
            "Grandma bakes osmanthus cake in the kitchen",
            "--link-to",
            "sem_cake",
            "--verb",
            "about",
            "--confidence",
            "0.8",
            "--intensity",
            "2",
        )
    )
    return store


def test_add_builds_the_notes_the_flags_describe(small_store: Path) -> None:
    from soulmem_torch.model import (
        ActionType,
        ConceptType,
        ProcMemory,
        SemMemLink,
        SemMemory,
        SpecificSituation,
        TrigToAction,
    )

    mem = load(small_store)
    assert len(mem) == 5
    by_name = {rid: mem.cluster.get(mid).note for mid, rid in mem.readable_ids.items()}
    assert set(by_name) == {"proc_offer", "sem_cake", "sit_bake"}
    cake = by_name["sem_cake"]
    assert isinstance(cake.mem_type, SemMemory)
    assert cake.mem_type.aliases == ["桂花糕", "sweet-scented cake"]
    assert cake.mem_type.description == "Grandma's recipe"
    assert cake.mem_type.concept_type == ConceptType.ENTITY
    assert cake.tags == ["food"]
    assert by_name["proc_offer"].mem_type.action.action_type == ActionType.SPEAK
    bake = by_name["sit_bake"]
    assert isinstance(bake.mem_type, SpecificSituation)
    ctx = bake.mem_type.context
    assert ctx.location.name == "Grandma's kitchen"
    assert [(p.name, p.role) for p in ctx.participants] == [("外婆", "teacher"), ("me", "")]
    assert str(bake.mem_type.time_span).startswith("2026-07-20T12:00:00")
    (trigger,) = bake.mem_links
    assert isinstance(trigger.link_type, TrigToAction) and trigger.link_type.prob == 0.0
    assert trigger.to == by_name["proc_offer"].id
    others = [e.note for e in mem.cluster if e.note.id not in {n.id for n in by_name.values()}]
    think = next(n for n in others if isinstance(n.mem_type, ProcMemory))
    assert think.mem_type.action.action_type == ActionType.THINK
    episode = next(n for n in others if isinstance(n.mem_type, SpecificSituation))
    (link,) = episode.mem_links
    assert isinstance(link.link_type, SemMemLink)
    assert link.link_type.verb == "about" and link.link_type.confidence == pytest.approx(0.8)
    assert link.intensity == 2.0 and link.to == cake.id
    assert all(e.embedding is not None for e in mem.cluster)  # embedded on the way in


def test_link_to_takes_an_id_prefix(small_store: Path, tmp_path: Path) -> None:
    store = tmp_path / "s"
    ok(soulmem("add", store, "--semantic", "rain"))
    (note,) = [e.note for e in load(store).cluster]
    prefix = str(note.id)[:8]
    out = ok(soulmem("add", store, "--semantic", "storm", "--link-to", prefix, "--verb", "is"))
    assert "1 link(s)" in out
    storm = next(e.note for e in load(store).cluster if e.note.id != note.id)
    assert storm.mem_links[0].to == note.id


def test_add_notes_from_stdin_skips_notes_already_there(tmp_path: Path) -> None:
    serde = ok(soulmem("export", sample_memory_path(), "-"))
    store = tmp_path / "from_stdin"
    out = ok(soulmem_stdin(serde, "add", store, "--notes", "-"))
    assert "now holds 77 notes" in out
    assert MemoryStore(store).load().notes[0].to_json() == serde.splitlines()[0]
    version = MemoryStore(store).current_version()
    again = json.loads(ok(soulmem_stdin(serde, "add", store, "--notes", "-", "--json")))
    assert again["added"] == [] and len(again["skipped"]) == 77 and again["version"] is None
    assert MemoryStore(store).current_version() == version  # nothing new: not rewritten
    # a notes file works the same way
    notes_file = tmp_path / "two.jsonl"
    notes_file.write_text("\n".join(serde.splitlines()[:2]) + "\n", encoding="utf-8")
    out = ok(soulmem("add", tmp_path / "two", "--notes", notes_file))
    assert "now holds 2 notes" in out


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        ((), ["--semantic", "--situation", "--action", "--notes"]),
        (("--semantic", "a", "--action", "b"), ["--semantic and --action", "one kind"]),
        (("--semantic", "a", "--location", "x"), ["--location", "--situation"]),
        (("--action", "a", "--alias", "x"), ["--alias", "--semantic"]),
        (("--semantic", "a", "--action-type", "think"), ["--action-type", "--action"]),
        (("--semantic", "a", "--verb", "is"), ["--verb", "--link-to"]),
        (("--semantic", "a", "--link-to", "x"), ["--link-to", "exactly one link kind"]),
        (
            ("--semantic", "a", "--link-to", "x", "--verb", "v", "--trigger", "0.5"),
            ["--verb and --trigger"],
        ),
        (
            ("--semantic", "a", "--link-to", "x", "--trigger", "1", "--confidence", "1"),
            ["--confidence"],
        ),
        (
            ("--semantic", "a", "--link-to", "x", "--verb", "v", "--confidence", "2"),
            ["--confidence", "'2'"],
        ),
        (("--semantic", "a", "--link-to", "x", "--trigger", "-1"), ["--trigger", "'-1'"]),
        (
            ("--semantic", "a", "--link-to", "x", "--verb", "v", "--intensity", "inf"),
            ["--intensity"],
        ),
        (("--semantic", "  "), ["--semantic", "non-empty"]),
        (("--semantic", "a", "--name", "two words"), ["--name", "'two words'"]),
        (("--situation", "a", "--participant", ":cook"), ["--participant", "NAME"]),
        (("--situation", "a", "--time", "yesterday"), ["--time", "RFC 3339"]),
        (("--action", "a", "--action-type", "dance"), ["--action-type", "'dance'"]),
        (("--notes", "-", "--tag", "x"), ["--tag", "--notes"]),
        (
            ("--situation", "a", "--link-to", "x", "--situation-link", "sideways"),
            ["--situation-link"],
        ),
    ],
)
def test_add_usage_errors(tmp_path: Path, args: tuple[str, ...], needles: list[str]) -> None:
    store = tmp_path / "never"
    fails(soulmem("add", store, *args), 2, *needles)
    assert not store.exists()  # nothing was written


def test_add_runtime_errors_leave_the_store_alone(small_store: Path, tmp_path: Path) -> None:
    version = MemoryStore(small_store).current_version()
    fails(
        soulmem("add", small_store, "--semantic", "x", "--link-to", "sem_nope", "--verb", "v"),
        1,
        "--link-to sem_nope",
        "no note",
    )
    fails(
        soulmem("add", small_store, "--semantic", "x", "--name", "sem_cake"),
        1,
        "--name sem_cake",
        "already",
    )
    fails(
        soulmem("add", small_store, "--notes", tmp_path / "missing.jsonl"),
        1,
        "missing.jsonl",
        "no such file",
    )
    fails(soulmem_stdin("", "add", small_store, "--notes", "-"), 1, "stdin", "no notes")
    fails(soulmem_stdin("{not json", "add", small_store, "--notes", "-"), 1, "stdin")
    fails(soulmem_stdin('{"id": 1}\n', "add", small_store, "--notes", "-"), 1, "stdin")
    assert MemoryStore(small_store).current_version() == version
    a_file = tmp_path / "file"
    a_file.write_text("x", encoding="utf-8")
    fails(soulmem("add", a_file, "--semantic", "x"), 1, "not a directory")


def test_query_several_texts_in_one_batch(small_store: Path) -> None:
    texts = ["osmanthus cake", "Grandma's kitchen", "say goodbye"]
    out = ok(soulmem("query", small_store, *texts))
    assert "3 queries against 5 notes" in out
    assert "[1] osmanthus cake" in out and "[3] say goodbye" in out
    answers = json.loads(ok(soulmem("query", small_store, *texts, "--json", "--top", "2")))
    assert [a["query"] for a in answers] == texts
    mem = load(small_store)  # the reference: the Python API, one batch
    for answer, result in zip(answers, mem.ask(texts)):
        expected = [str(mid) for mid, score in result.association if score > 0][:2]
        assert [m["id"] for m in answer["memories"]] == expected
    fails(soulmem("query", small_store, "cake", " "), 2, "TEXT 2", "non-empty")


def test_query_lists_no_zero_score_rows(small_store: Path) -> None:
    text = "Grandma bakes osmanthus cake"
    (result,) = load(small_store).ask([text])
    zero = [mid for mid, score in result.action if score == 0.0]
    assert zero, "the fixture's probability-0 trigger should yield a zero-score action"
    (answer,) = json.loads(ok(soulmem("query", small_store, text, "--json")))
    assert all(row["score"] > 0 for row in answer["memories"] + answer["actions"])
    assert str(zero[0]) not in {row["id"] for row in answer["actions"]}
    out = ok(soulmem("query", small_store, text))
    assert " 0.000 " not in out
