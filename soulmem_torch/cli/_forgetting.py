"""Shared forgetting output (``demo`` and ``forget``): changed notes, tables, JSON."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from soulmem_torch.cli._memory import _kind, _short_id
from soulmem_torch.cli._output import _clip, _emit, _table, _width


def _newest_create_time(notes: Sequence[Any]) -> Any:
    from soulmem_torch.model.timestamp import Timestamp

    if not notes:
        return Timestamp.now()
    return max(n.create_time for n in notes)


def _days_after(start: Any, days: float) -> Any:
    """``start + days`` as a ``Timestamp`` (printed as RFC 3339)."""
    from soulmem_torch.model.timestamp import Timestamp

    return Timestamp.from_datetime(start + timedelta(days=days))


def _clip_pair(before: str, after: str, width: int) -> tuple[str, str]:
    """Both texts clipped to ``width`` columns, starting near their first difference (so a
    change late in a long narrative stays visible), with ``…`` where text was cut."""
    before, after = " ".join(before.split()), " ".join(after.split())
    same = 0
    for a, b in zip(before, after):
        if a != b:
            break
        same += 1
    start = max(0, same - 4) if _width(before[:same]) > width // 2 else 0
    if start:
        return _clip("…" + before[start:], width), _clip("…" + after[start:], width)
    return _clip(before, width), _clip(after, width)


def _changed_notes(mem: Any, report: Any) -> list[tuple[Any, Any, str]]:
    """``(note, action, text now)`` of every note whose text forgetting changed, in note order
    (a ``MaskOnly`` that masked no token changed nothing and is left out)."""
    from soulmem_torch.forget import MaskOnly, Revised

    out = []
    for entry in mem.cluster:
        action = report.actions.get(entry.note.id)
        if isinstance(action, Revised):
            after = action.new_summary
        elif isinstance(action, MaskOnly):
            after = action.masked_text
        else:
            continue
        if after != action.old_summary:
            out.append((entry.note, action, after))
    return out


def _forget_rows(
    mem: Any,
    report: Any,
    *,
    limit: int | None,
    width: int,
    order: Callable[[Any], Any] | None = None,
) -> tuple[list[list[str]], int]:
    """Rows ``note, kind, md, action, before → after`` of every changed note (note order, or
    sorted by ``order(note)``); ``MaskOnly!`` marks a note the LLM failed to reconstruct."""
    from soulmem_torch.forget import MaskOnly, Revised

    changed = _changed_notes(mem, report)
    if order is not None:
        changed.sort(key=lambda item: order(item[0]))
    rows = []
    for note, action, after in changed[: limit if limit is not None else len(changed)]:
        name = "Revised" if isinstance(action, Revised) else "MaskOnly"
        if isinstance(action, MaskOnly) and action.llm_error is not None:
            name = "MaskOnly!"
        shown_before, shown_after = _clip_pair(action.old_summary, after, width)
        rows.append(
            [
                _short_id(mem, note.id),
                _kind(note),
                f"{action.missing_degree:.2f}",
                name,
                f"{shown_before} → {shown_after}",
            ]
        )
    return rows, len(changed)


def _emit_forget_table(report: Any, rows: list[list[str]], n_changed: int) -> None:
    if rows:
        _emit(_table(["note", "kind", "md", "action", "before → after"], rows, right=(2,)))
    if n_changed > len(rows):
        _emit(f"  … and {n_changed - len(rows)} more changed notes (--show N to see more)")
    kept = report.mask_only + report.revised - n_changed
    if kept > 0:
        _emit(f"  ({kept} more note(s) were processed but kept their exact text)")


def _forget_json(mem: Any, report: Any, *, now: Any, saved: bool) -> dict[str, Any]:
    from soulmem_torch.forget import Revised

    changed = [
        {
            "id": str(note.id),
            "readable_id": mem.readable_ids.get(note.id),
            "kind": _kind(note),
            "action": type(action).__name__,
            "missing_degree": action.missing_degree,
            "masked_count": action.masked_count,
            "before": action.old_summary,
            "masked": action.masked_text,
            "after": after,
            "llm_error": None if isinstance(action, Revised) else action.llm_error,
        }
        for note, action, after in _changed_notes(mem, report)
    ]
    return {
        "now": str(now),
        "summary": report.summary(),
        "total": report.total,
        "eligible": report.eligible,
        "counts": report.counts,
        "reembedded": len(report.reembedded),
        "failures": [
            {
                "id": None if f.note_id is None else str(f.note_id),
                "stage": f.stage,
                "error": f.error,
            }
            for f in report.failures
        ],
        "changed": changed,
        "saved": saved,
    }
