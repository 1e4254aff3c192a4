"""Terminal output through rich: clipping and aligned tables (CJK = 2 columns), progress bars,
status lines, files.

Plain lines go through ``print`` (so piped output is plain text); tables are rendered by
:class:`rich.table.Table` without borders or colour, one line per row, never wrapped, so
``grep`` / ``awk`` keep working on them. Progress bars (:func:`progress_bar`) are rich bars on
stderr that stay on screen when done.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

_RENDER_WIDTH = 10_000  # tables are never wrapped: one row is one line


def _width(text: str) -> int:
    """Display columns of ``text`` (CJK = 2)."""
    from rich.cells import cell_len

    return cell_len(text)


def _clip(text: str, width: int) -> str:
    """One line of at most ``width`` display columns (whitespace collapsed, ``…`` when cut)."""
    from rich.text import Text

    line = Text(" ".join(str(text).split()))
    line.truncate(width, overflow="ellipsis")
    out = line.plain  # rich pads a cut double-width character with a space: drop it
    return out[:-1].rstrip() + "…" if out.endswith("…") and line.plain != str(text) else out


def _table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    right: Sequence[int] = (),
    indent: str = "  ",
) -> list[str]:
    """Aligned plain-text rows (a borderless :class:`rich.table.Table`); columns in ``right``
    are right-aligned; two spaces between columns; no trailing blanks."""
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, show_edge=False, pad_edge=False, padding=(0, 2, 0, 0))
    for i, header in enumerate(headers):
        table.add_column(header, justify="right" if i in right else "left", no_wrap=True)
    for row in rows:
        table.add_row(*(str(c) for c in row))
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=_RENDER_WIDTH,
        color_system=None,
        markup=False,
        highlight=False,
        emoji=False,
        force_terminal=False,
        legacy_windows=False,
    )
    console.print(table)
    return [(indent + line).rstrip() for line in buffer.getvalue().splitlines()]


def _emit(lines: str | Sequence[str] = "") -> None:
    if isinstance(lines, str):
        lines = [lines]
    for line in lines:
        print(line)


class _NoBar:
    def update(self, n: int) -> None:
        pass


@contextlib.contextmanager
def progress_bar(total: int, description: str, unit: str, *, enabled: bool) -> Iterator[Any]:
    """A rich progress bar on stderr (``bar.update(n)``) that stays on screen when done, so
    long work leaves its count and time behind; a no-op when ``enabled`` is false."""
    if not enabled:
        yield _NoBar()
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(unit),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=False) as progress:
        task = progress.add_task(description, total=total)

        class _Bar:
            def update(self, n: int) -> None:
                progress.advance(task, n)

        yield _Bar()


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
