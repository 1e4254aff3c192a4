"""``soulmem forget`` with a hostile LLM: a blocking plain callable is cut off by ``--timeout``;
``SystemExit`` / ``CancelledError`` from the LLM give one line (no traceback) and leave the
store as it was. Before issue 11 the first hung forever and the others printed tracebacks."""

from __future__ import annotations

import hashlib
import textwrap
from pathlib import Path

import pytest

from soulmem_torch.data import sample_memory_path
from tests.cli.test_cli import soulmem

LLMS = textwrap.dedent(
    """
    import asyncio, sys, threading

    def blocking(system, user):
        threading.Event().wait()

    def exits(system, user):
        sys.exit(3)

    async def cancels(system, user):
        raise asyncio.CancelledError
    """
)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("forget_bounds")
    path = root / "store"
    proc = soulmem("import", sample_memory_path(), path)
    assert proc.returncode == 0, proc.stderr
    (root / "hostile_llms.py").write_text(LLMS, encoding="utf-8")
    return path


def digest(store: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in store.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(store)).encode() + f.read_bytes())
    return h.hexdigest()


def forget(store: Path, llm: str, *extra: str):
    return soulmem(
        "forget", store, "--days", "30", "--llm", f"{store.parent / 'hostile_llms.py'}:{llm}",
        "--quiet", *extra, timeout=240,
    )  # fmt: skip


def test_blocking_callable_is_cut_off_by_the_timeout(store: Path) -> None:
    before = digest(store)
    proc = forget(store, "blocking", "--timeout", "2", "--concurrency", "16")
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "LLM call(s) failed" in line and "timeout of 2 s" in line
    assert digest(store) == before


@pytest.mark.parametrize(
    "llm, code, needle",
    [("exits", 130, "interrupted (SystemExit: 3)"), ("cancels", 1, "CancelledError")],
)
def test_llm_raising_exit_or_cancel_is_one_line(
    store: Path, llm: str, code: int, needle: str
) -> None:
    before = digest(store)
    proc = forget(store, llm)
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert digest(store) == before
