"""Every ```python block of README.md runs as written, on its own, in a fresh interpreter.

Each block is written to a script in an empty temporary directory and run there with the
interpreter running the tests (``python block.py``), the checkout on ``PYTHONPATH`` and no
access to the original's data (``SOULMEM_SHARED`` points nowhere), as a reader with a CPU-only
machine would run it. A block that needs something another block defined fails here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"


def python_blocks() -> list[tuple[int, str]]:
    """``(line number, code)`` of every ```python block."""
    text = README.read_text(encoding="utf-8")
    return [
        (text.count("\n", 0, m.start()) + 1, m.group(1))
        for m in re.finditer(r"^```python[ \t]*\n(.*?)^```", text, flags=re.S | re.M)
    ]


def run_block(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    script = cwd / "readme_block.py"
    script.write_text(code, encoding="utf-8")
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
        PYTHONIOENCODING="utf-8",
        SOULMEM_SHARED=str(cwd / "no_shared_data_here"),
        CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", ""),  # CPU-only, as documented
    )
    return subprocess.run(
        [sys.executable, script.name],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=300,
    )


BLOCKS = python_blocks()


def test_the_readme_has_python_blocks() -> None:
    assert len(BLOCKS) >= 4, "README.md lost its python examples (or this test's pattern)"


@pytest.mark.parametrize(("line", "code"), BLOCKS, ids=[f"README.md:{line}" for line, _ in BLOCKS])
def test_block_runs_on_its_own(line: int, code: str, tmp_path: Path) -> None:
    proc = run_block(code, tmp_path)
    assert proc.returncode == 0, (
        f"README.md python block at line {line} failed (exit {proc.returncode}):\n"
        f"{proc.stderr[-3000:]}"
    )
    assert "Traceback" not in proc.stderr
    # what some blocks promise, checked on their output
    if "SoulMem.from_graph_file" in code and 'mem.save("sample_store")' in code:  # quick start
        assert (tmp_path / "sample_store").is_dir()
        assert "sem_" in proc.stdout or "sit_" in proc.stdout
    if "parse_request_config(" in code:
        assert "top_k=5" in proc.stdout
    if "mem.remember(" in code:  # "Your own memories"
        assert (tmp_path / "my_memories").is_dir() and "act_offer" in proc.stdout
    if "retrieve_batch(" in code:
        assert "sem_grandma" in proc.stdout and "sem_mochi" in proc.stdout
