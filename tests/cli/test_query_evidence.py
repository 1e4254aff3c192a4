"""``soulmem query``: a question is answered with the memories that match it (``--all``: every
fused result), and ``forget --fake`` never writes unless ``--write`` (run in process)."""

from __future__ import annotations

from pathlib import Path

import pytest

from soulmem_torch.cli import main
from soulmem_torch.data import sample_memory_path
from soulmem_torch.store import MemoryStore


@pytest.fixture
def store(tmp_path: Path) -> Path:
    path = tmp_path / "s"
    assert main(["-q", "add", str(path), "--semantic", "osmanthus cake", "--name", "sem_cake"]) == 0
    assert main(["-q", "add", str(path), "--situation", "Baked it with Grandma",
                 "--link-to", "sem_cake", "--verb", "about"]) == 0  # fmt: skip
    assert main(["-q", "add", str(path), "--semantic", "green tea", "--name", "sem_tea"]) == 0
    return path


def test_query_lists_what_matches_and_all_lists_everything(store: Path, capsys) -> None:
    capsys.readouterr()
    assert main(["-q", "query", str(store), "osmanthus cake"]) == 0
    out = capsys.readouterr().out
    assert "sem_cake" in out and "Baked it with Grandma" in out  # a match, and a linked note
    assert "sem_tea" not in out
    sample = str(sample_memory_path())  # 77 notes: the offline embedder's floor scores them all
    assert main(["-q", "query", sample, "quantum chromodynamics"]) == 0
    assert "no memory found that matches the question (--all" in capsys.readouterr().out
    assert main(["-q", "query", sample, "quantum chromodynamics", "--all", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "no memory found" not in out and "  3  " in out


def test_forget_fake_does_not_write_unless_asked(store: Path, capsys) -> None:
    version = MemoryStore(store).current_version()
    assert main(["-q", "forget", str(store), "--days", "30", "--fake"]) == 0
    assert "dry run (--fake implies it" in capsys.readouterr().out
    assert MemoryStore(store).current_version() == version
    assert main(["-q", "forget", str(store), "--days", "30", "--fake", "--write"]) == 0
    assert MemoryStore(store).current_version() != version


def test_names_survive_export_and_import(store: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "notes.jsonl"
    assert main(["-q", "export", str(store), str(out)]) == 0
    sidecar = Path(str(out) + ".names.json")
    assert sidecar.exists() and "sem_cake" in sidecar.read_text(encoding="utf-8")
    copy = tmp_path / "copy"
    assert main(["-q", "import", str(out), str(copy)]) == 0
    assert set(MemoryStore(copy).load().readable_ids.values()) == {"sem_cake", "sem_tea"}
    # --link-to a readable name works after export → import
    assert main(["-q", "add", str(copy), "--situation", "Ate it", "--link-to", "sem_cake",
                 "--verb", "about"]) == 0  # fmt: skip
    # explicit --names for stdin-less files elsewhere, and a missing one is an error
    moved = tmp_path / "names.json"
    sidecar.rename(moved)
    other = tmp_path / "other"
    assert main(["-q", "add", str(other), "--notes", str(out), "--names", str(moved)]) == 0
    assert "sem_tea" in MemoryStore(other).load().readable_ids.values()
    assert main(["-q", "import", str(out), str(tmp_path / "x"), "--names", "nope.json"]) == 1
    assert "--names nope.json: no such file" in capsys.readouterr().err
