"""README.md followed top to bottom, in one folder, as a newcomer with a fresh clone would.

The checkout's tracked files are copied into a temporary folder (the "fresh clone", without
``../shared`` and without any store); then every ```bash and ```python block of the README runs
there **in order**, each command as written — bash blocks with ``bash -euo pipefail`` (a failing
command fails the walk), python blocks with the interpreter running the tests — except the
blocks marked by an HTML comment ``<!-- readme-walk: skip (reason) -->`` on the line before
(installing from the registries, ``make test`` itself, a cluster, your own LLM module), each
with its reason. The one change made to a block: the serving example's port 8000 becomes a free
port, so that parallel runs on one machine do not collide. Background jobs a block starts (the
server) are stopped when the block ends.

Then nothing may have been lost: every store the README builds holds the notes the README put
there (the Python quick start's sample store, "Your own memories", the command-line store and
its copy with its readable names, the served bank).

``test_readme.py`` checks the other property: each python block also runs on its own.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
SKIP = re.compile(r"<!--\s*readme-walk:\s*skip\s*\((?P<reason>[^)]+)\)\s*-->")
FENCE = re.compile(r"^```(?P<lang>[A-Za-z]*)[ \t]*\n(?P<code>.*?)^```[ \t]*$", re.S | re.M)


def readme_blocks() -> list[tuple[int, str, str, str | None]]:
    """``(line, language, code, skip reason)`` of every fenced block, in order."""
    text = README.read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = SKIP.search(before)
        line = text.count("\n", 0, m.start()) + 1
        out.append((line, m.group("lang"), m.group("code"), skip.group("reason") if skip else None))
    return out


def _fresh_clone(dest: Path) -> None:
    """The tracked files of the checkout (``git ls-files``; a plain copy without git)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60
        ).stdout.decode("utf-8")
        files = [f for f in listed.split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        files = []
    if not files:  # no git: everything but the usual untracked folders
        shutil.copytree(
            REPO, dest, dirs_exist_ok=True,
            ignore=shutil.ignore_patterns(".venv", ".git", "*.egg-info", "__pycache__", ".*cache"),
        )  # fmt: skip
        return
    for f in files:
        src = REPO / f
        if src.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(clone: Path) -> dict[str, str]:
    bindir = str(Path(sys.executable).parent)  # `soulmem` and `python` of this environment
    return dict(
        os.environ,
        PATH=os.pathsep.join([bindir, os.environ.get("PATH", "")]),
        PYTHONPATH=str(clone),
        PYTHONIOENCODING="utf-8",
        SOULMEM_SHARED=str(clone / "no_shared_data_here"),
        CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
    )


def test_the_readme_marks_what_it_does_not_walk() -> None:
    blocks = readme_blocks()
    walked = [b for b in blocks if b[1] in ("bash", "python") and b[3] is None]
    skipped = [b for b in blocks if b[3] is not None]
    assert len(walked) >= 12, "the README lost its examples (or this test's pattern)"
    assert all(b[1] in ("bash", "python") for b in skipped), "a skip mark on a non-code block"
    assert len(skipped) <= 8, [(line, reason) for line, _, _, reason in skipped]


def test_following_the_readme_top_to_bottom_loses_nothing(tmp_path: Path) -> None:
    clone = tmp_path / "soulmem_torch"
    clone.mkdir()
    _fresh_clone(clone)
    env = _env(clone)
    port = str(_free_port())
    ran = 0
    for line, lang, code, skip in readme_blocks():
        if skip is not None or lang not in ("bash", "python"):
            continue
        if lang == "python":
            script = clone / "readme_walk_block.py"
            script.write_text(code, encoding="utf-8")
            argv = [sys.executable, script.name]
        else:
            if "soulmem serve" in code:
                code = code.replace("8000", port)
            body = "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + code
            argv = ["bash", "-c", body]
        t0 = time.perf_counter()
        proc = subprocess.run(
            argv, cwd=clone, env=env, capture_output=True, text=True, encoding="utf-8",
            timeout=600,
        )  # fmt: skip
        print(f"README.md:{line} ({lang}): {time.perf_counter() - t0:.1f} s")
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (
            f"README.md:{line} ({lang}) failed with exit {proc.returncode}:\n"
            f"stdout:\n{proc.stdout[-2000:]}\nstderr:\n{proc.stderr[-3000:]}"
        )
        if "soulmem serve" in code:  # every curl answered JSON, none an error
            answers = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            assert answers and not [a for a in answers if '"error"' in a], proc.stdout
        ran += 1
    assert ran >= 12

    # nothing lost: every store holds what the README put in it
    from soulmem_torch.bank import MemoryBank
    from soulmem_torch.store import MemoryStore

    def names(store: str) -> set[str]:
        return set((MemoryStore(clone / store).load().readable_ids or {}).values())

    def count(store: str) -> int:
        return len(MemoryStore(clone / store).load().notes)

    assert count("sample_store") == 77  # the Python quick start
    assert count("my_memories") == 8 and {"sem_osmanthus", "act_offer", "per_mei"} <= names(
        "my_memories"
    )  # "Your own memories"
    assert count("my_store") == 3 and names("my_store") == {"sem_osmanthus"}  # the CLI's notes
    assert count("my_copy") == 4 and "sem_osmanthus" in names("my_copy")  # names survived
    bank = MemoryBank.load(clone / "my_bank")  # the served bank, persisted
    assert bank.agents() == ["npc-17"] and len(bank.agent("npc-17")) == 1


@pytest.mark.parametrize("marker", ["<!-- readme-walk: skip (why) -->"])
def test_skip_marks_parse(marker: str) -> None:
    assert SKIP.search(marker).group("reason") == "why"
