"""Benchmark fixtures: devices and CUDA synchronization."""

from __future__ import annotations

import pytest
import torch

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def sync(device: torch.device | str) -> None:
    """Waits for queued CUDA work so the timed call measures it."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


@pytest.fixture(params=DEVICES)
def bench_device(request: pytest.FixtureRequest) -> torch.device:
    return torch.device(request.param)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """Prints the time / error / floor tables the benchmarks recorded (``benchmarks/_harness.py``;
    ``SOULMEM_BENCH_ROWS=path.jsonl`` also keeps them as JSON lines)."""
    from benchmarks import _harness

    if _harness.ROWS:
        terminalreporter.write_sep("=", "soulmem_torch benchmark tables (time, error, floor)")
        terminalreporter.write(_harness.markdown(_harness.ROWS))
