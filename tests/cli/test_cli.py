"""The ``soulmem`` command line, driven as a user drives it: ``python -m soulmem_torch`` in a
subprocess (cwd = the repository root), with stores under ``tmp_path``.

Checked for every command: the exit status, the key output lines, that ``--json`` parses, and
that every error (bad arguments, missing / corrupt files, a failing or crashing LLM) is one
clear line on stderr with a non-zero status and never a traceback. One sample-memory store is
imported once per module and copied by the tests that change it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from soulmem_torch.data import sample_memory_path, sample_queries_path
from soulmem_torch.store import MemoryStore
from tests.conftest import REPO, fixture_path

SAMPLE_GRAPH = sample_memory_path()
SAMPLE_QUERIES = sample_queries_path()


def soulmem(
    *args: str | os.PathLike[str], pythonpath: Path | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """Runs ``python -m soulmem_torch ARGS`` from the repository root."""
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(pythonpath), env.get("PYTHONPATH", "")) if p
        )
    return subprocess.run(
        [sys.executable, "-m", "soulmem_torch", *map(str, args)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=timeout,
    )


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    """Asserts success; returns stdout."""
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )
    assert "Traceback" not in proc.stderr
    return proc.stdout


def fails(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    """Asserts exit ``code``, exactly one ``error:`` line on stderr naming ``needles``, no
    traceback; returns that line."""
    assert proc.returncode == code, (
        f"expected exit {code}, found {proc.returncode}\nstdout:\n{proc.stdout}\n"
        f"stderr:\n{proc.stderr}"
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, proc.stderr
    line = errors[0]
    assert line.startswith("soulmem"), line
    for needle in needles:
        assert needle in line, f"{needle!r} not in {line!r}"
    return line


def live_notes_bytes(store: Path) -> bytes:
    """The live notes' rows (id, JSON, embedding, checksum), read directly from the database."""
    import sqlite3

    conn = sqlite3.connect(f"file:{store / 'store.sqlite3'}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT id, note, emb, sha FROM notes ORDER BY pos").fetchall()
    finally:
        conn.close()
    return repr(rows).encode()


@pytest.fixture(scope="module")
def sample_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled sample graph imported into a store (read-only for the tests: copy it)."""
    store = tmp_path_factory.mktemp("cli") / "sample_store"
    out = ok(soulmem("import", SAMPLE_GRAPH, store))
    assert "imported 77 notes (212 links, graph format)" in out
    assert "77 new, 0 already present" in out
    return store


@pytest.fixture
def store_copy(sample_store: Path, tmp_path: Path) -> Path:
    target = tmp_path / "store"
    shutil.copytree(sample_store, target)
    return target


def write_module(directory: Path, name: str, source: str) -> Path:
    path = directory / f"{name}.py"
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return path


# ---- demo ---------------------------------------------------------------------------------
def test_demo_runs_end_to_end() -> None:
    out = ok(soulmem("demo", "--device", "cpu"))
    assert "77 notes (25 concepts, 19 abstract situations, 16 episodes, 17 actions)" in out
    assert "the 24 structured queries of sample_queries.json" in out
    assert "answered in one batch by the default pipeline" in out
    assert "[ 1/18] self_identity — expected sem_self at rank 1" in out
    assert "18/18 cases have an expected memory in their top 5" in out
    assert "→ action proc_" in out  # recommended actions
    # the short-term window: a small capacity, so messages were evicted and summarized
    assert "short-term window (4 messages):" in out
    assert re.search(r"summary of earlier messages: \S", out)
    assert "summary of earlier messages: (none yet)" not in out
    # forgetting with the FakeLLM: a table of what was masked / reconstructed
    assert "FORGETTING — 1 simulated day(s)" in out
    assert re.search(r"77 notes \(41 eligible\): 41 revised", out)
    assert re.search(r"note\s+kind\s+md\s+action\s+before → after", out)
    assert re.search(r"sit_\w+\s+episode\s+0\.\d\d\s+Revised\s+.+ → .+", out)
    assert "demo finished in" in out


# ---- usage errors (exit 2, before anything heavy is imported) -----------------------------
@pytest.mark.parametrize(
    ("args", "needles"),
    [
        ((), ["required: COMMAND"]),
        (("frobnicate",), ["invalid choice: 'frobnicate'"]),
        (("query",), ["STORE"]),
        (("query", "s", "hi", "--device", "tpu"), ["--device", "'tpu'"]),
        (("demo", "--device", "gpu"), ["--device", "'gpu'"]),
        (("demo", "--days", "soon"), ["--days", "'soon'"]),
        (("import",), ["FILE"]),
        (("export", "s"), ["FILE"]),
        (("export", "s", "f", "--format", "yaml"), ["--format", "'yaml'"]),
        (("eval",), ["FILE"]),
        (("forget", "s", "--days", "1"), ["--llm --fake --mask-only"]),
        (("forget", "s", "--fake"), ["--now --days"]),
        (("forget", "s", "--days", "-1", "--fake"), ["--days", "'-1'"]),
        (("forget", "s", "--now", "yesterday", "--fake"), ["--now", "RFC 3339"]),
        (("forget", "s", "--days", "1", "--llm", "no_colon"), ["--llm", "MODULE:FUNCTION"]),
        (("forget", "s", "--days", "1", "--fake", "--concurrency", "0"), ["--concurrency"]),
        (("forget", "s", "--days", "1", "--fake", "--timeout", "-3"), ["--timeout"]),
    ],
)
def test_bad_arguments_are_usage_errors(args: tuple[str, ...], needles: list[str]) -> None:
    fails(soulmem(*args), 2, *needles)


def test_help_and_version() -> None:
    out = ok(soulmem("--help"))
    for command in ("demo", "query", "import", "export", "eval", "forget"):
        assert command in out
    assert "exit status" in out
    assert ok(soulmem("import", "--help")).count("--store") >= 1
    assert re.match(r"soulmem \d+\.\d+", ok(soulmem("--version")))


# ---- import / export ----------------------------------------------------------------------
def test_import_export_rust_notes_byte_identical(tmp_path: Path) -> None:
    rust = fixture_path("rust", "notes_written_by_rust.jsonl")
    store = tmp_path / "rust_store"
    out = ok(soulmem("import", rust, "--store", store))  # the `import FILE --store S` form
    assert "imported 4 notes" in out and "serde format" in out
    exported = tmp_path / "back.jsonl"
    proc = soulmem("export", store, exported)
    ok(proc)
    assert "exported 4 notes (serde format)" in proc.stderr
    assert exported.read_bytes() == rust.read_bytes()
    # export to stdout, same bytes; and the graph format as JSON
    stdout = subprocess.run(
        [sys.executable, "-m", "soulmem_torch", "export", str(store), "-"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    assert stdout == rust.read_bytes()


def test_import_merges_and_export_graph_keeps_readable_ids(
    sample_store: Path, store_copy: Path, tmp_path: Path
) -> None:
    # importing the same serde notes again adds nothing
    serde = tmp_path / "notes.jsonl"
    ok(soulmem("export", sample_store, serde))
    out = ok(soulmem("import", serde, store_copy, "--format", "serde"))
    assert "0 new, 77 already present" in out
    assert "the store now holds 77 notes" in out
    # the graph export keeps the readable ids of the graph import
    graph_file = tmp_path / "graph.json"
    ok(soulmem("export", store_copy, graph_file, "--format", "graph"))
    graph = json.loads(graph_file.read_text(encoding="utf-8"))
    original = json.loads(SAMPLE_GRAPH.read_text(encoding="utf-8"))
    assert [node["id"] for node in graph] == [node["id"] for node in original]
    assert sum(len(node["mem_links"]) for node in graph) == 212


def test_import_errors(tmp_path: Path) -> None:
    fails(soulmem("import", tmp_path / "nope.jsonl", tmp_path / "s"), 1, "nope.jsonl", "no such")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "not a note"}\n', encoding="utf-8")
    fails(soulmem("import", bad, tmp_path / "s"), 1, "bad.jsonl", "line 1")
    assert not (tmp_path / "s").exists()  # nothing was written


def test_import_rejects_a_broken_graph_naming_every_bad_node(tmp_path: Path) -> None:
    negative = fixture_path("soul_tune", "negative", "fuhua_raw_failed_nodes.json")
    line = fails(soulmem("import", negative, tmp_path / "s"), 1, "11 of 65 node(s) are invalid")
    assert "sit_taixu_incident" in line and "proc_assess_enemy" in line
    assert not (tmp_path / "s").exists()


# ---- query --------------------------------------------------------------------------------
def test_query_text(sample_store: Path) -> None:
    out = ok(soulmem("query", sample_store, "谁教我做桂花糕？", "--top", "5"))
    assert "1 query against 77 notes" in out
    assert "[1] 谁教我做桂花糕？" in out
    assert re.search(r"#\s+memory\s+kind\s+score\s+label", out)
    assert "sit_grandma_recipe" in out or "sem_grandma" in out
    assert "recommended actions:" in out
    rows = [ln for ln in out.splitlines() if re.match(r"\s+\d+\s+(sem|sit)_", ln)]
    assert len(rows) == 5


def test_query_suite_file_json(sample_store: Path) -> None:
    proc = soulmem("query", sample_store, "--file", SAMPLE_QUERIES, "--json", "--top", "3")
    answers = json.loads(ok(proc))
    assert len(answers) == 24  # every sub-query of every case, in one batch
    first = answers[0]
    assert first["priority"] == 9 and "Semantic" in first["query"]["variant"]
    assert first["memories"][0]["readable_id"] == "sem_self"
    assert first["memories"][0]["kind"] == "concept"
    assert all(len(a["memories"]) <= 3 for a in answers)
    assert any(a["actions"] for a in answers)


def test_query_lines_file_and_config(sample_store: Path, tmp_path: Path) -> None:
    lines = tmp_path / "questions.txt"
    lines.write_text("# one question per line\nthe café cat\n\n谁是房东？\n", encoding="utf-8")
    config = tmp_path / "pipeline.json"
    config.write_text(json.dumps({"merge_top_k": 4}), encoding="utf-8")
    mixed = tmp_path / "mixed.json"
    mixed.write_text(
        json.dumps(
            [
                "who taught me the osmanthus cake?",
                {"tag": [], "variant": {"Situation": [{"narrative": "雷雨停电的夜晚"}]}},
                {
                    "priority": 3,
                    "query": {"tag": [], "variant": {"Semantic": [{"concept_identifier": "麻薯"}]}},
                },
            ],
            ensure_ascii=False,
        ),
        encoding="utf-8",
    )
    out = ok(soulmem("query", sample_store, "a rainy night", "--file", lines, "--config", config))
    assert "3 queries against 77 notes" in out
    assert "[2] the café cat" in out and "[3] 谁是房东？" in out
    for block in out.split("\n[")[1:]:
        ranks = [ln for ln in block.splitlines() if re.match(r"  \d+  ", ln)]
        assert 1 <= len(ranks) <= 4  # merge_top_k from --config
    answers = json.loads(ok(soulmem("query", sample_store, "--file", mixed, "--json")))
    assert [a["priority"] for a in answers] == [0, 0, 3]
    assert answers[0]["query"] == "who taught me the osmanthus cake?"
    assert answers[2]["memories"][0]["readable_id"] == "sem_mochi"


def test_query_errors(sample_store: Path, tmp_path: Path) -> None:
    fails(soulmem("query", tmp_path / "nowhere", "hi"), 1, "nowhere", "no such directory")
    fails(soulmem("query", sample_store), 2, "TEXT", "--file")
    fails(soulmem("query", sample_store, "--file", tmp_path / "q.txt"), 1, "q.txt", "no such")
    malformed = tmp_path / "bad_config.json"
    malformed.write_text('{"merge_top_k": 0,', encoding="utf-8")
    fails(soulmem("query", sample_store, "hi", "--config", malformed), 1, "--config", "bad_config")
    wrong = tmp_path / "wrong_config.json"
    wrong.write_text('{"merge_top_k": 0}', encoding="utf-8")
    fails(soulmem("query", sample_store, "hi", "--config", wrong), 1, "merge_top_k")
    bad_queries = tmp_path / "bad_queries.json"
    bad_queries.write_text('[{"tag": [], "variant": {"Nope": []}}]', encoding="utf-8")
    fails(soulmem("query", sample_store, "--file", bad_queries), 1, "item 0")


def test_query_cuda_unavailable(sample_store: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    fails(soulmem("query", sample_store, "hi", "--device", "cuda"), 1, "CUDA is not available")


def test_corrupt_store(store_copy: Path) -> None:
    db = store_copy / "store.sqlite3"  # one flipped bit inside a stored note, on disk
    data = bytearray(db.read_bytes())
    at = data.index(b'"create_time":"2') + len(b'"create_time":"')
    data[at] ^= 0x01
    db.write_bytes(bytes(data))
    fails(soulmem("query", store_copy, "hi"), 1, "checksum mismatch", "note")
    fails(soulmem("export", store_copy, store_copy.parent / "x.jsonl"), 1, "checksum mismatch")


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    proc = soulmem("query", tmp_path / "nowhere", "hi", "--debug")
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr


# ---- eval ---------------------------------------------------------------------------------
def test_eval_congyu() -> None:
    suite = fixture_path("soul_tune", "congyu", "question.json")
    out = ok(soulmem("eval", suite, "--cases"))
    assert "cases: 31  pass rate: 1.000" in out
    row = next(ln for ln in out.splitlines() if ln.startswith("per sub-query"))
    assert float(row.split()[2]) == pytest.approx(
        0.890, abs=0.001
    )  # per-sub-query MRR (rank fusion)
    assert re.search(r"MRR\s+Hit\s+R@1\s+P@1\s+nDCG@1", out)
    assert out.count("[PASS]") == 31


def test_eval_json_on_the_sample_suite(tmp_path: Path) -> None:
    report = json.loads(ok(soulmem("eval", SAMPLE_QUERIES, "--json", "--graph", SAMPLE_GRAPH)))
    assert report["cases"] == 18
    assert report["summary"]["pass_rate"] == 1.0
    assert 0.9 <= report["summary"]["q_mrr"] <= 1.0
    assert len(report["per_case"]) == 18
    fails(soulmem("eval", tmp_path / "missing.json"), 1, "missing.json", "no such file")
    fails(soulmem("eval", SAMPLE_GRAPH), 1, "sample_memory.graph.json")


# ---- forget -------------------------------------------------------------------------------
def test_forget_fake_dry_run_then_save(store_copy: Path) -> None:
    before = live_notes_bytes(store_copy)
    version = MemoryStore(store_copy).current_version()
    out = ok(soulmem("forget", store_copy, "--days", "1", "--fake", "--dry-run", "--show", "3"))
    assert "77 notes (41 eligible): 41 revised" in out
    assert re.search(r"note\s+kind\s+md\s+action\s+before → after", out)
    assert re.search(r"… and \d+ more changed notes", out)
    assert "dry run: the store was not changed" in out
    assert MemoryStore(store_copy).current_version() == version
    assert live_notes_bytes(store_copy) == before

    # --fake alone is a dry run too: the placeholder text reaches the store only with --write
    out = ok(soulmem("forget", store_copy, "--days", "1", "--fake"))
    assert "dry run (--fake implies it; --fake --write saves)" in out
    assert MemoryStore(store_copy).current_version() == version
    assert live_notes_bytes(store_copy) == before
    fails(soulmem("forget", store_copy, "--days", "1", "--fake", "--write", "--dry-run"), 2)
    fails(soulmem("forget", store_copy, "--days", "1", "--mask-only", "--write"), 2, "--write")

    report = json.loads(
        ok(soulmem("forget", store_copy, "--days", "1", "--fake", "--write", "--json"))
    )
    assert report["saved"] is True
    assert report["counts"] == {"NoAction": 36, "MaskOnly": 0, "Revised": 41}
    assert report["reembedded"] == 41 and len(report["changed"]) == 41
    assert MemoryStore(store_copy).current_version() != version
    loaded = MemoryStore(store_copy).load()
    texts = {str(n.id): n.mem_type for n in loaded.notes}
    for item in report["changed"]:
        mt = texts[item["id"]]
        assert item["after"] == getattr(mt, "narrative", getattr(mt, "content", None))
    assert all(e is not None for e in loaded.embeddings)


def test_forget_with_a_user_llm(store_copy: Path, tmp_path: Path) -> None:
    write_module(
        tmp_path,
        "my_llm",
        """
        calls = 0

        async def complete(system, user):
            return "RECONSTRUCTED: " + user.removeprefix("Masked text: ").replace("[masked]", "~")
        """,
    )
    out = ok(
        soulmem(
            "forget",
            store_copy,
            "--now",
            "2099-01-01T00:00:00Z",
            "--llm",
            "my_llm:complete",
            "--concurrency",
            "4",
            "--timeout",
            "30",
            "--show",
            "50",
            pythonpath=tmp_path,
        )
    )
    assert "41 revised" in out and "saved" in out
    assert out.count("RECONSTRUCTED:") == 41
    narratives = [
        n.mem_type.narrative
        for n in MemoryStore(store_copy).load().notes
        if hasattr(n.mem_type, "narrative")
    ]
    assert narratives and all(t.startswith("RECONSTRUCTED: ") for t in narratives)


def test_forget_llm_errors(store_copy: Path, tmp_path: Path) -> None:
    before = live_notes_bytes(store_copy)
    write_module(
        tmp_path,
        "bad_llm",
        """
        not_callable = 42

        def wrong_arity(prompt):
            return prompt

        async def broken(system, user):
            raise RuntimeError("the API key was rejected")
        """,
    )
    common = ("forget", store_copy, "--days", "1")
    fails(soulmem(*common, "--llm", "no_such_module:f"), 1, "no_such_module", "cannot import")
    fails(soulmem(*common, "--llm", "bad_llm:missing", pythonpath=tmp_path), 1, "no attribute")
    fails(
        soulmem(*common, "--llm", "bad_llm:not_callable", pythonpath=tmp_path), 1, "not a callable"
    )
    fails(soulmem(*common, "--llm", f"{tmp_path / 'bad_llm.py'}:wrong_arity"), 1, "(system, user)")
    fails(
        soulmem(*common, "--llm", "bad_llm:broken", pythonpath=tmp_path),
        1,
        "LLM call(s) failed",
        "the API key was rejected",
        "not changed",
    )
    assert live_notes_bytes(store_copy) == before
    fails(soulmem("forget", tmp_path / "none", "--days", "1", "--fake"), 1, "no such directory")


def test_forget_killed_by_its_llm_leaves_the_store_intact(store_copy: Path, tmp_path: Path) -> None:
    before = live_notes_bytes(store_copy)
    version = MemoryStore(store_copy).current_version()
    write_module(
        tmp_path,
        "dying_llm",
        """
        import os

        async def complete(system, user):
            os._exit(3)  # the process dies in the middle of the forgetting run
        """,
    )
    proc = soulmem(
        "forget", store_copy, "--days", "1", "--llm", "dying_llm:complete", pythonpath=tmp_path
    )
    assert proc.returncode == 3
    assert MemoryStore(store_copy).current_version() == version
    assert live_notes_bytes(store_copy) == before


def test_forget_killed_mid_save_leaves_the_previous_version(
    store_copy: Path, tmp_path: Path
) -> None:
    before = live_notes_bytes(store_copy)
    version = MemoryStore(store_copy).current_version()
    llm_file = write_module(
        tmp_path,
        "crash_on_save",
        """
        import os

        from soulmem_torch.store import db as store_db

        _digest = store_db.NoteRow.digest
        calls = []

        def _half_then_die(self, agent):
            calls.append(1)  # the process dies half-way through inserting the new rows
            if len(calls) == 20:
                os._exit(3)
            return _digest(self, agent)

        store_db.NoteRow.digest = _half_then_die

        async def complete(system, user):
            return user.removeprefix("Masked text: ").replace("[masked]", "?")
        """,
    )
    proc = soulmem("forget", store_copy, "--days", "1", "--llm", f"{llm_file}:complete")
    assert proc.returncode == 3, proc.stderr
    store = MemoryStore(store_copy)
    assert store.current_version() == version
    assert live_notes_bytes(store_copy) == before  # the open transaction left nothing
    contents = store.load()
    assert len(contents.readable_ids) == 77
    # the next save is not blocked and succeeds
    store.save(contents.notes, contents.embeddings, readable_ids=contents.readable_ids)
    assert MemoryStore(store_copy).load().notes[0].to_json() == contents.notes[0].to_json()


def test_schema(tmp_path: Path) -> None:
    schema = json.loads(ok(soulmem("schema")))
    assert schema["$schema"].endswith("2020-12/schema")
    assert "SpecificSituation" in json.dumps(schema)
    out = tmp_path / "note.schema.json"
    ok(soulmem("schema", out))
    assert json.loads(out.read_text(encoding="utf-8")) == schema
