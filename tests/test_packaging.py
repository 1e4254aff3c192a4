"""What the package index page and a fresh machine see: the licence, the project URLs, README
links that work outside the repository, and an install that takes the CPU build of torch."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python >= 3.11")
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def test_license_file_matches_the_metadata() -> None:
    project = _pyproject()["project"]
    assert project["license"] == "MIT"
    assert "LICENSE" in project["license-files"]
    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License") and "WITHOUT WARRANTY OF ANY KIND" in text


def test_project_urls_are_absolute() -> None:
    urls = _pyproject()["project"]["urls"]
    assert urls and all(u.startswith("https://") for u in urls.values())


def test_readme_links_work_on_the_package_index_page() -> None:
    """The index renders README.md away from the repository: a relative link (a file, or a
    heading anchor, which the index does not generate) would point nowhere."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r"^\[[^\]]+\]:\s*(\S+)", text, re.M)
    relative = [t for t in targets if not re.match(r"https?://", t)]
    assert not relative, relative


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_install_takes_the_cpu_build_of_torch(tmp_path: Path) -> None:
    """The local wheel without an index first (offline, as on CI), else PyTorch's CPU index —
    never the default index, whose torch is the CUDA build with its nvidia wheels."""
    venv = tmp_path / "venv"
    plan = subprocess.run(
        ["make", "-n", "install", f"VENV={venv}"],
        cwd=REPO, capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    local = plan.index('--no-index --no-deps "torch==2.13.0"')
    index = plan.index('"torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu')
    assert local < index < plan.index("-e '.[dev,serve]'")
    assert "torch.version.cuda" in plan  # the torch it got is checked to be a CPU build
    cuda = subprocess.run(
        ["make", "-n", "install", f"VENV={venv}", "TORCH_SPEC=torch --index-url https://x/cu128"],
        cwd=REPO, capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    assert "pip install -q torch --index-url https://x/cu128" in cuda
