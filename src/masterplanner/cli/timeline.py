"""A run's steps drawn as a terminal Gantt chart (`runs show RUN --timeline`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from .terminal import shown

__all__ = ["timeline_lines"]

_BAR = {
    "succeeded": "█",
    "failed": "▓",
    "running": "▒",
    "cancelled": "░",
    "replaced": "▚",
    "skipped": "·",
    "expanded": "═",
}
"""How a step's bar is drawn, by its status (anything else that ran: █)."""
_LABEL_MOST = 24
"""The widest a step's label is drawn (an id cut to it keeps its start and end)."""
_BAR_LEAST = 10
_FIXED = 22
"""The columns beside the label and the bar: two gaps, the status (9), a space, the duration (8)."""


def _cut(label: str, width: int) -> str:
    """`label` in `width` characters: its start and its end with `…` between (the end tells ids apart)."""
    if len(label) <= width:
        return label
    head = (width - 1) // 2
    return label[:head] + "…" + label[len(label) - (width - 1 - head) :]


def _labels(full: list[str], most: int) -> list[str]:
    """The labels cut to at most `most` characters, wider if two different labels would look the same."""
    width = min(most, max(len(label) for label in full))
    while True:
        cut = [_cut(label, width) for label in full]
        if len(set(cut)) == len(set(full)) or width >= max(len(label) for label in full):
            return cut
        width += 1


def _took(seconds: float) -> str:
    """A duration in at most 8 characters: `12.3 s`, `4m 05s`, `3h 20m`, `5d 02h`.

    Before, `11995.0 s`: wider than its column, so the rows' ends no longer lined up.
    """
    if seconds < 59.95:
        return f"{max(0.0, seconds):.1f} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    minutes = round(seconds / 60)
    if minutes < 100 * 60:
        return f"{minutes // 60}h {minutes % 60:02d}m"
    hours = round(seconds / 3600)
    return f"{hours // 24}d {hours % 24:02d}h"


def _seconds(stamp: str | None) -> float | None:
    if not stamp:
        return None
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _flat(steps: Sequence[Mapping[str, Any]], depth: int = 0) -> list[tuple[int, Mapping[str, Any]]]:
    """Steps with their depth, each sub-step right under its step."""
    rows: list[tuple[int, Mapping[str, Any]]] = []
    for step in steps:
        rows.append((depth, step))
        rows.extend(_flat(step.get("sub_steps", []), depth + 1))
    return rows


def timeline_lines(
    steps: Sequence[Mapping[str, Any]],
    processes: Mapping[str, str],
    *,
    width: int,
    now: float,
) -> list[str]:
    """The chart's lines: a scale, then per step its bar, status, duration and where it ran.

    `steps` are the report's (sub-steps under `sub_steps`); `processes` maps a step id to the
    process that last started it; `now` ends the bars of steps still running.
    """
    rows = _flat(steps)
    if not rows:
        return ["no steps"]
    spans: list[tuple[float, float] | None] = []
    for _depth, step in rows:
        start = _seconds(step.get("started_at"))
        end = _seconds(step.get("finished_at"))
        spans.append(None if start is None else (start, end if end is not None else now))
    started = [span for span in spans if span is not None]
    if not started:
        return ["no step has started"]
    first = min(start for start, _end in started)
    total = max(max(end for _start, end in started) - first, 1e-3)
    wheres = [shown(processes.get(str(step["id"]), "")) for _depth, step in rows]
    where_room = max(len(where) for where in wheres) + 2 if any(wheres) else 0
    # in a narrow terminal the labels give way first, then the bars (to _BAR_LEAST), then the
    # processes go under their steps: before, the lines were as wide as in a wide terminal
    full = [("  " * depth) + shown(step["id"]) for depth, step in rows]
    if width - _FIXED - _BAR_LEAST - where_room < min(8, max(len(label) for label in full)):
        where_room = 0  # under their steps, cut to the width: the bars keep the room they leave
    labels = _labels(full, min(_LABEL_MOST, max(8, width - _FIXED - _BAR_LEAST - where_room)))
    label_width = max(len(label) for label in labels)
    bar_width = max(_BAR_LEAST, width - label_width - _FIXED - where_room)
    inline = bool(where_room) and label_width + bar_width + _FIXED + where_room <= width
    end_label = _took(total)
    lines = [f"{'':<{label_width}}  0 s{' ' * max(1, bar_width - 3 - len(end_label))}{end_label}"]
    for label, where, (_depth, step), span in zip(labels, wheres, rows, spans, strict=True):
        status = str(step["status"])
        if span is None:
            bar = " " * bar_width
            took = ""
        else:
            start_col = min(bar_width - 1, round((span[0] - first) / total * bar_width))
            end_col = max(start_col + 1, min(bar_width, round((span[1] - first) / total * bar_width)))
            bar = (
                " " * start_col + _BAR.get(status, "█") * (end_col - start_col) + " " * (bar_width - end_col)
            )
            took = _took(span[1] - span[0])
        row = f"{label:<{label_width}}  {bar}  {status:<9} {took:>8}"
        if inline or not where:
            lines.append(f"{row}  {where}".rstrip())
        else:
            lines.extend(
                [row.rstrip(), f"{'':<{label_width}}  {_cut(where, max(8, width - label_width - 2))}"]
            )
    return lines
