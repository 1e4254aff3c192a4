"""Shared test fixtures: a device fixture (CPU always, CUDA when present) and fixture paths."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("SOULMEM_SHARED", REPO.parent / "shared"))
FIXTURES = SHARED / "fixtures"

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> torch.device:
    """Runs the test on the CPU and, where present, on ``cuda:0``."""
    return torch.device(request.param)


def fixture_path(*parts: str) -> Path:
    """Path of a file under ``../shared/fixtures``; skips the test (with the reason) if absent."""
    path = FIXTURES.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"fixture {path} is absent (the original's data lives in ../shared/fixtures)")
    return path
