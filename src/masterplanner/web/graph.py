"""A plan's dependency graph drawn as SVG: one column per depth, arrows from each step to its dependents."""

from __future__ import annotations

from html import escape
from typing import Any

__all__ = ["plan_svg"]

_WIDTH, _HEIGHT, _GAP_X, _GAP_Y, _PAD = 190, 54, 60, 18, 12


def _depths(steps: list[dict[str, Any]]) -> dict[str, int]:
    """Each step's column: one more than its deepest dependency's (steps come in any order)."""
    ids = {step["id"] for step in steps}
    after = {step["id"]: [dep for dep in step.get("depends_on", []) if dep in ids] for step in steps}
    depth: dict[str, int] = {}

    def of(step_id: str, seen: frozenset[str]) -> int:
        if step_id not in depth:
            deps = [dep for dep in after[step_id] if dep not in seen]  # a cycle is drawn, not followed
            depth[step_id] = 1 + max((of(dep, seen | {step_id}) for dep in deps), default=-1)
        return depth[step_id]

    for step_id in after:
        of(step_id, frozenset())
    return depth


def _cut(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: chars - 1] + "…"


def plan_svg(
    plan: dict[str, Any], *, reused: set[str] | None = None, states: dict[str, str] | None = None
) -> str:
    """The plan (public JSON form) as an SVG document; `reused` steps are marked, `states` colour steps."""
    steps: list[dict[str, Any]] = list(plan.get("steps") or [])
    depth = _depths(steps)
    columns: dict[int, list[str]] = {}
    for step in steps:
        columns.setdefault(depth[step["id"]], []).append(step["id"])
    where = {
        step_id: (_PAD + column * (_WIDTH + _GAP_X), _PAD + row * (_HEIGHT + _GAP_Y))
        for column, ids in columns.items()
        for row, step_id in enumerate(ids)
    }
    width = _PAD * 2 + max(len(columns), 1) * (_WIDTH + _GAP_X) - _GAP_X
    height = _PAD * 2 + max((len(ids) for ids in columns.values()), default=1) * (_HEIGHT + _GAP_Y) - _GAP_Y
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="plan-graph" role="img" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}">',
        f"<title>{escape(_cut(str(plan.get('task', 'plan')), 200))}: {len(steps)} steps</title>",
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z"/></marker></defs>',
    ]
    for step in steps:
        x2, y2 = where[step["id"]]
        for dep in step.get("depends_on", []):
            if dep in where:
                x1, y1 = where[dep]
                parts.append(
                    f'<line class="edge" x1="{x1 + _WIDTH}" y1="{y1 + _HEIGHT // 2}" x2="{x2}" '
                    f'y2="{y2 + _HEIGHT // 2}" marker-end="url(#arrow)"/>'
                )
    for step in steps:
        x, y = where[step["id"]]
        state = (states or {}).get(step["id"], "")
        classes = " ".join(
            [
                "node",
                f"state-{escape(state)}" if state else "",
                "reused" if step["id"] in (reused or set()) else "",
            ]
        ).strip()
        mark = " ♻" if step["id"] in (reused or set()) else ""
        parts.append(
            f'<g class="{classes}"><rect x="{x}" y="{y}" width="{_WIDTH}" height="{_HEIGHT}" rx="6"/>'
            f'<text x="{x + 8}" y="{y + 20}" class="id">{escape(_cut(step["id"], 22))}{mark}</text>'
            f'<text x="{x + 8}" y="{y + 40}">{escape(_cut(str(step.get("title", "")), 26))}</text></g>'
        )
    parts.append("</svg>")
    return "".join(parts)
