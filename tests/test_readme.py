"""The README's Python quick start runs as written (in a temporary directory)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_quick_start_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    blocks = _python_blocks()
    assert blocks, "README has no python block"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(blocks[0], "README quick start", "exec"), namespace)
    assert (tmp_path / "my_store").is_dir()
    out = capsys.readouterr().out
    assert "sem_" in out or "sit_" in out


def test_config_snippet_runs() -> None:
    block = next(b for b in _python_blocks() if "parse_request_config" in b)
    namespace: dict = {}
    exec(compile(block, "README config", "exec"), namespace)
    assert namespace["cfg"].top_k == 5
