"""A run's steps drawn as a terminal Gantt chart (`runs show RUN --timeline`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from .terminal import shown

__all__ = ["timeline_lines"]

_BAR = {"succeeded": "█", "failed": "▓", "running": "▒", "cancelled": "░"}
"""How a step's bar is drawn, by its status (anything else that ran: █)."""


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
    label_width = min(24, max(len(("  " * depth) + str(step["id"])) for depth, step in rows))
    bar_width = max(10, width - label_width - 40)
    end_label = f"{total:.1f} s"
    lines = [f"{'':<{label_width}}  0 s{' ' * max(1, bar_width - 3 - len(end_label))}{end_label}"]
    for (depth, step), span in zip(rows, spans, strict=True):
        label = (("  " * depth) + shown(step["id"]))[:label_width]
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
            took = f"{span[1] - span[0]:.1f} s"
        where = processes.get(str(step["id"]), "")
        lines.append(f"{label:<{label_width}}  {bar}  {status:<9} {took:>8}  {shown(where)}".rstrip())
    return lines
