"""The CLI's terminal output helpers (rich underneath): aligned tables with CJK widths, clipping,
and progress bars that leave their final line behind."""

from __future__ import annotations

import contextlib
import io

from rich.cells import cell_len

from soulmem_torch.cli._output import _clip, _table, progress_bar


def test_table_aligns_columns_by_display_width() -> None:
    rows = [["1", "sem_a", "桂花糕的做法", "0.500"], ["10", "sit_bb", "rain", "0.25"]]
    lines = _table(["#", "memory", "label", "score"], rows, right=(0, 3))
    assert lines[0] == "   #  memory  label         score"
    assert lines[1] == "   1  sem_a   桂花糕的做法  0.500"
    assert lines[2] == "  10  sit_bb  rain           0.25"
    assert all(line == line.rstrip() for line in lines)


def test_table_never_wraps_long_cells() -> None:
    label = "a very long label " * 40
    lines = _table(["#", "label"], [["1", label.strip()]], indent="")
    assert len(lines) == 2 and lines[1].endswith("long label")


def test_clip_counts_display_columns_and_marks_the_cut() -> None:
    assert _clip("谁教我做桂花糕？ long", 10) == "谁教我做…"
    assert cell_len(_clip("谁教我做桂花糕？ long", 10)) <= 10
    assert _clip("a  b\n c", 10) == "a b c"
    assert _clip("abcdef", 4) == "abc…"
    assert _clip("short", 10) == "short"


def test_progress_bar_stays_on_screen_when_done() -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), progress_bar(300, "embed", "notes", enabled=True) as bar:
        for _ in range(3):
            bar.update(100)
    assert "embed" in err.getvalue() and "300/300 notes" in err.getvalue()
    quiet = io.StringIO()
    with contextlib.redirect_stderr(quiet), progress_bar(5, "x", "y", enabled=False) as bar:
        bar.update(5)
    assert quiet.getvalue() == ""
