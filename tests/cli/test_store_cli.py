"""``soulmem versions`` / ``restore``, a damaged store refused by ``import``, duplicate ids and
out-of-range integers in an import file, and ``--embedder``: driven as a user drives them
(subprocess) where it matters, in process (``main([...])``) for the rest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from soulmem_torch.cli import main
from soulmem_torch.store import DirectoryStore, MemoryStore
from tests.conftest import REPO
from tests.store._helpers import note, notes


def soulmem(*args: str | os.PathLike[str], timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    return subprocess.run(
        [sys.executable, "-m", "soulmem_torch", *map(str, args)],
        cwd=REPO, env=env, capture_output=True, text=True, encoding="utf-8", timeout=timeout,
    )  # fmt: skip


def one_error(stderr: str, *needles: str) -> str:
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, stderr
    for needle in needles:
        assert needle in errors[0], f"{needle!r} not in {errors[0]!r}"
    return errors[0]


def run(capsys: pytest.CaptureFixture[str], *args: str | os.PathLike[str]) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def _jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _line(i: int, **changes: object) -> str:
    data = json.loads(note(i).to_json())
    data.update(changes)
    return json.dumps(data, ensure_ascii=False)


# ---- subprocess: the recovery path end to end ----------------------------------------------
def test_damaged_store_versions_restore(tmp_path: Path) -> None:
    """A legacy directory store whose CURRENT pointer is damaged (the SQLite store's damage
    cases are in test_sqlite_store_cli)."""
    store = tmp_path / "s"
    DirectoryStore(store).save(notes(0, 2))
    DirectoryStore(store).save(notes(0, 3))
    names = [v.name for v in MemoryStore(store).versions()]
    (store / "CURRENT").write_text(names[1][:-1] + "0\n" if names[1][-1] != "0" else "g9\n")
    extra = _jsonl(tmp_path / "more.jsonl", [_line(7)])

    proc = soulmem("import", extra, store)  # the defect: this used to start a fresh store
    assert proc.returncode == 1
    one_error(proc.stderr, "CURRENT", "soulmem versions", "soulmem restore")
    assert [v.name for v in MemoryStore(store).versions()] == names  # nothing written or pruned

    proc = soulmem("versions", store)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("2 version(s) of")
    assert names[1] in lines[2] and " 3 " in lines[2] and lines[2].rstrip().endswith("ok")
    assert names[0] in lines[3] and " 2 " in lines[3]
    assert "CURRENT is unreadable" in proc.stdout and f"soulmem restore {store} {names[1]}" in (
        proc.stdout
    )

    proc = soulmem("restore", store, "2")
    assert proc.returncode == 0, proc.stderr
    assert f"restored {store} to version {names[1]} (3 notes" in proc.stdout
    assert len(MemoryStore(store).load().notes) == 3


def test_versions_and_restore_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    proc = soulmem("restore", tmp_path / "nowhere", "1")
    assert proc.returncode == 1
    one_error(proc.stderr, "soulmem restore: error: store", "no such directory")
    proc = soulmem("versions")
    assert proc.returncode == 2
    one_error(proc.stderr, "the following arguments are required: STORE")

    code, _, err = run(capsys, "versions", tmp_path)
    assert code == 1
    one_error(err, "not a memory store (no versions in it)")
    store = tmp_path / "s"
    MemoryStore(store).save(notes(0, 2))
    code, _, err = run(capsys, "restore", store, "g000042")
    assert code == 1
    one_error(err, "version 'g000042' matches no kept version; versions kept: g000001")
    import sqlite3

    with sqlite3.connect(store / "store.sqlite3") as conn:  # a flipped byte in a stored note
        conn.execute("UPDATE notes SET note = replace(note, 'concept', 'c0ncept')")
    code, _, err = run(capsys, "restore", store, "1")
    assert code == 1
    one_error(err, "cannot restore g000001", "checksum mismatch")
    code, out, _ = run(capsys, "versions", store, "--json")
    assert code == 0
    data = json.loads(out)
    assert data["current"] == data["versions"][0]["name"]
    assert data["versions"][0]["valid"] is False and data["versions"][0]["notes"] == 2


# ---- import files --------------------------------------------------------------------------
def test_import_rejects_duplicate_ids_naming_both_lines(tmp_path: Path) -> None:
    src = _jsonl(tmp_path / "dup.jsonl", [_line(1), _line(2), _line(1, tags=["again"])])
    proc = soulmem("import", src, tmp_path / "s")
    assert proc.returncode == 1
    one_error(proc.stderr, "line 3 repeats note id", "of line 1", "--on-duplicate")
    assert not (tmp_path / "s" / "CURRENT").exists()


def test_import_duplicate_policies(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = _jsonl(tmp_path / "dup.jsonl", [_line(1, tags=["a"]), _line(1, tags=["b"])])
    code, out, _ = run(capsys, "import", src, tmp_path / "s", "--on-duplicate", "last")
    assert code == 0 and "1 new" in out
    assert MemoryStore(tmp_path / "s").load().notes[0].tags == ["b"]
    code, _, err = run(capsys, "import", src, tmp_path / "s", "--on-duplicate", "both")
    assert code == 2
    one_error(err, "--on-duplicate: invalid choice: 'both'")


@pytest.mark.parametrize("value", [-1, 2**64])
def test_import_rejects_integers_outside_the_rust_types(
    tmp_path: Path, capsys: pytest.CaptureFixture, value: int
) -> None:
    src = _jsonl(tmp_path / "big.jsonl", [_line(1), _line(2, retrieval_count=value)])
    code, _, err = run(capsys, "import", src, tmp_path / "s")
    assert code == 1
    one_error(err, "line 2: retrieval_count")
    assert not MemoryStore(tmp_path / "s").exists()


# ---- --embedder ----------------------------------------------------------------------------
EMBEDDERS = textwrap.dedent(
    """
    import torch
    from soulmem_torch.embedding import HashingEmbedder

    class Shuffled:
        def __init__(self):
            self.inner = HashingEmbedder()
            self.dim = self.inner.dim
            self.perm = torch.randperm(self.dim, generator=torch.Generator().manual_seed(3))

        def __call__(self, texts):
            return self.inner(texts)[:, self.perm]

    def shuffled():
        return Shuffled()

    def broken():
        raise RuntimeError("model weights missing")
    """
)


def test_embedder_option_bad_specs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = _jsonl(tmp_path / "n.jsonl", [_line(1)])
    proc = soulmem("import", src, tmp_path / "s", "--embedder", "nonsense")
    assert proc.returncode == 2
    one_error(proc.stderr, "--embedder: expected hashing", "st:MODEL_NAME", "'nonsense'")
    code, _, err = run(capsys, "import", src, tmp_path / "s", "--embedder", "st:")
    assert code == 2
    one_error(err, "st: needs a model name")
    (tmp_path / "emb.py").write_text(EMBEDDERS, encoding="utf-8")
    code, _, err = run(
        capsys, "import", src, tmp_path / "s", "--embedder", f"{tmp_path}/emb.py:broken"
    )
    assert code == 1
    one_error(err, "calling it raised RuntimeError: model weights missing")
    assert not MemoryStore(tmp_path / "s").exists()


def test_embedder_is_recorded_reused_and_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "emb.py").write_text(EMBEDDERS, encoding="utf-8")
    spec = f"{tmp_path}/emb.py:shuffled"
    store = tmp_path / "s"
    src = _jsonl(tmp_path / "n.jsonl", [_line(i) for i in range(4)])
    code, _, err = run(capsys, "import", src, store, "--embedder", spec)
    assert code == 0, err
    identity = MemoryStore(store).load().embedder_identity
    assert identity is not None and identity.spec == spec and identity.name == spec

    # a recorded MODULE:FUNCTION is never imported on the store's word
    code, _, err = run(capsys, "query", store, "concept 2 概念2")
    assert code == 1
    one_error(err, f"was embedded with --embedder {spec}; pass --embedder {spec}")
    # named again: reused, no re-embedding
    code, out, err = run(capsys, "query", store, "concept 2 概念2", "--embedder", spec, "--json")
    assert code == 0 and "re-embedded" not in err
    # another embedder of the same width: refused on request, naming both ...
    code, _, err = run(
        capsys, "query", store, "concept 2", "--embedder", "hashing",
        "--on-embedder-mismatch", "refuse",
    )  # fmt: skip
    assert code == 1
    one_error(err, f"come from {spec} (dim 1024", "the embedder given is hashing (dim 1024")
    # ... or re-embedded (the default), said on stderr, and queries find the note
    code, out, err = run(
        capsys, "query", store, "concept 2 概念2", "--embedder", "hashing", "--json"
    )
    assert code == 0 and "re-embedded all 4 notes" in err
    assert "00000000-0000-4000-8000-000000000002" in out

    # an import with another embedder re-embeds the whole store and records the new one
    more = _jsonl(tmp_path / "m.jsonl", [_line(9)])
    code, out, err = run(capsys, "import", more, store, "--embedder", "hashing")
    assert code == 0 and "re-embedded all 4 notes" in err
    contents = MemoryStore(store).load()
    assert contents.embedder_identity.spec == "hashing" and len(contents.notes) == 5
    code, out, err = run(capsys, "query", store, "concept 9", "--json")  # hashing reused
    assert code == 0 and "re-embedded" not in err


def test_forget_uses_the_stores_embedder(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "emb.py").write_text(EMBEDDERS, encoding="utf-8")
    spec = f"{tmp_path}/emb.py:shuffled"
    store = tmp_path / "s"
    src = _jsonl(tmp_path / "n.jsonl", [_line(i) for i in range(4)])
    assert run(capsys, "import", src, store, "--embedder", spec)[0] == 0
    code, _, err = run(capsys, "forget", store, "--days", "30", "--mask-only", "--embedder", spec)
    assert code == 0, err
    assert "re-embedded" not in err
    contents = MemoryStore(store).load()
    assert contents.embedder_identity.spec == spec  # still the store's embedder


RACING_LLM = textwrap.dedent(
    """
    import os
    from soulmem_torch.store import DirectoryStore, MemoryStore
    done = []

    async def complete(system, user):
        if not done:  # another writer commits while forgetting runs
            done.append(1)
            store = MemoryStore(os.environ["RACE_STORE"])
            contents = store.load()
            store.save(contents.notes[:1], contents.embeddings[:1])
        return "reconstructed"
    """
)


def test_forget_racing_another_writer_fails_clearly(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "s"
    src = _jsonl(tmp_path / "n.jsonl", [_line(i) for i in range(4)])
    assert run(capsys, "import", src, store)[0] == 0
    (tmp_path / "racing_llm.py").write_text(RACING_LLM, encoding="utf-8")
    monkeypatch.setenv("RACE_STORE", str(store))
    code, _, err = run(
        capsys, "forget", store, "--days", "400", "--llm", f"{tmp_path}/racing_llm.py:complete"
    )
    assert code == 1
    one_error(err, "another writer saved version", "nothing was saved")
    assert len(MemoryStore(store).load().notes) == 1  # the other writer's version stands
