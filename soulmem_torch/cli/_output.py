"""Terminal output: width-aware (CJK = 2 columns) clipping, aligned tables, status lines, files."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import unicodedata
from collections.abc import Sequence
from pathlib import Path


def _char_width(ch: str) -> int:
    if unicodedata.combining(ch):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def _width(text: str) -> int:
    return sum(_char_width(ch) for ch in text)


def _clip(text: str, width: int) -> str:
    """One line of at most ``width`` display columns (whitespace collapsed, ``…`` when cut)."""
    text = " ".join(str(text).split())
    if _width(text) <= width:
        return text
    out, used = [], 0
    for ch in text:
        w = _char_width(ch)
        if used + w > width - 1:
            break
        out.append(ch)
        used += w
    return "".join(out) + "…"


def _pad(text: str, width: int, *, right: bool = False) -> str:
    gap = " " * max(0, width - _width(text))
    return gap + text if right else text + gap


def _table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    right: Sequence[int] = (),
    indent: str = "  ",
) -> list[str]:
    """Aligned plain-text rows; columns in ``right`` are right-aligned; no trailing blanks."""
    widths = [max(_width(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    lines = []
    for row in [headers, *rows]:
        cells = [_pad(str(c), w, right=i in right) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append((indent + "  ".join(cells)).rstrip())
    return lines


def _emit(lines: str | Sequence[str] = "") -> None:
    if isinstance(lines, str):
        lines = [lines]
    for line in lines:
        print(line)


def _show_progress(args: argparse.Namespace) -> bool:
    """Progress bars only on an interactive stderr and without ``--quiet``."""
    return not getattr(args, "quiet", False) and sys.stderr.isatty()


def _info(args: argparse.Namespace, message: str) -> None:
    """A status line on stderr (kept off stdout so ``--json`` output stays clean)."""
    if not getattr(args, "quiet", False):
        print(message, file=sys.stderr)


def _quiet_libraries(args: argparse.Namespace) -> None:
    """jieba logs its dictionary loading at DEBUG level on stderr; keep that for ``--debug``."""
    if getattr(args, "debug", False):
        return
    with contextlib.suppress(Exception):
        import jieba

        jieba.setLogLevel(logging.WARNING)


def _atomic_write(path: str, data: bytes) -> None:
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _write_output(args: argparse.Namespace, data: bytes, what: str) -> None:
    """Writes ``data`` to stdout (``args.file == "-"``) or atomically to ``args.file``."""
    if args.file == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    else:
        _atomic_write(args.file, data)
        _info(args, f"{what} to {args.file}")
