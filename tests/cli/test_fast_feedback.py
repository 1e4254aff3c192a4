"""Fast feedback: the ``soulmem`` commands that do not retrieve never import PyTorch Geometric.

``import torch_geometric`` costs ~2 s of CPU on the shared 2-core box (it imports
``torch._dynamo``, every dataset and layer); only retrieval needs it (``MemoryGraph`` is a PyG
``Data``). Every command that reads or writes a store without answering a query runs here in
one fresh interpreter, and ``torch_geometric`` must not be in ``sys.modules`` afterwards; the
retrieving commands are checked to still work (and to import it) in the same way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import REPO

_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from soulmem_torch.cli import main
    runs = json.loads(sys.argv[1])
    codes = [main(argv) for argv in runs]
    print(json.dumps({"codes": codes, "pyg": "torch_geometric" in sys.modules}))
    """
)


def _run(runs: list[list[str]], cwd: Path) -> dict:
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, json.dumps(runs)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_commands_that_do_not_retrieve_never_import_pyg(tmp_path: Path) -> None:
    runs = [
        ["--help"],
        ["query", "--help"],
        ["schema", "note.schema.json"],
        ["-q", "add", "s", "--semantic", "osmanthus cake", "--name", "sem_osmanthus"],
        [
            "-q",
            "add",
            "s",
            "--situation",
            "Baked the cake",
            "--link-to",
            "sem_osmanthus",
            "--verb",
            "about",
        ],
        ["-q", "export", "s", "notes.jsonl"],
        ["-q", "import", "notes.jsonl", "t"],
        ["-q", "add", "t", "--notes", "notes.jsonl"],
        ["versions", "s"],
        ["-q", "forget", "s", "--days", "3", "--mask-only", "--dry-run"],
        ["-q", "forget", "s", "--days", "3", "--fake"],
        ["serve", "--help"],
    ]
    out = _run(runs, tmp_path)
    assert out["codes"] == [0] * len(runs)
    assert out["pyg"] is False, "a command that does not retrieve imported torch_geometric"


def test_a_query_still_works_and_is_what_imports_pyg(tmp_path: Path) -> None:
    out = _run(
        [
            ["-q", "add", "s", "--semantic", "osmanthus cake"],
            ["-q", "query", "s", "osmanthus cake"],
        ],
        tmp_path,
    )
    assert out["codes"] == [0, 0]
    assert out["pyg"] is True
