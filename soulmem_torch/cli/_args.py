"""Argument types (a bad value is a usage error, exit 2) and the shared parent parsers."""

from __future__ import annotations

import argparse
import re
from typing import Any

from soulmem_torch.cli._errors import _Parser

_DEVICE = re.compile(r"^(cpu|cuda|auto|cuda:\d+)$")


def _device_arg(text: str) -> str:
    if not _DEVICE.match(text):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda, cuda:N or auto, found {text!r}")
    return text


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, found {text!r}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value >= 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, found {text!r}")
    return value


def _positive_float(text: str) -> float:
    value = _non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, found {text!r}")
    return value


def _rfc3339_arg(text: str) -> Any:
    """An RFC 3339 time (``2026-07-20T12:00:00Z``; an offset is converted to UTC) or ``now``."""
    from soulmem_torch.model.timestamp import Timestamp

    if text.strip().lower() == "now":
        return Timestamp.now()
    try:
        return Timestamp.parse(text.strip())
    except (ValueError, TypeError):
        raise argparse.ArgumentTypeError(
            f"expected an RFC 3339 time such as 2026-07-20T12:00:00Z (or 'now'), found {text!r}"
        ) from None


def _llm_spec_arg(text: str) -> str:
    module, sep, attr = text.rpartition(":")
    if not sep or not module or not attr:
        raise argparse.ArgumentTypeError(
            f"expected MODULE:FUNCTION (e.g. my_llm:complete or ./my_llm.py:complete), "
            f"found {text!r}"
        )
    return text


def common_parent() -> argparse.ArgumentParser:
    """``--debug`` / ``-q``: every command takes them (after the command name too)."""
    common = _Parser(add_help=False)
    common.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="re-raise errors with their traceback",
    )
    common.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=argparse.SUPPRESS,
        help="no progress bars or status lines on stderr",
    )
    return common


def device_parent() -> argparse.ArgumentParser:
    """``--device``, for the commands that run retrieval."""
    device = _Parser(add_help=False)
    device.add_argument(
        "--device",
        type=_device_arg,
        default="cpu",
        metavar="{cpu,cuda,auto}",
        help="where retrieval runs: cpu (default), cuda, cuda:N, or auto (cuda when available)",
    )
    return device


def config_parent() -> argparse.ArgumentParser:
    """``--config FILE``: a JSON ``DefaultPipelineConfig``."""
    config = _Parser(add_help=False)
    config.add_argument(
        "--config",
        metavar="FILE",
        help="a JSON DefaultPipelineConfig, e.g. "
        '{"similarity": {"similarity_threshold": 0.4}, "merge_top_k": 10}',
    )
    return config
