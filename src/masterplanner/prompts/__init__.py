"""Prompt templates are data: Jinja files in this folder.

They are rendered with StrictUndefined, so a missing variable is an error, never an empty hole in
a prompt.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

__all__ = ["load_examples", "render"]

_FOLDER = Path(__file__).parent


@cache
def _environment() -> Any:
    import jinja2

    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_FOLDER),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=False,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters["json"] = lambda value: json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return environment


def render(name: str, **variables: Any) -> str:
    """Render the template `name` (e.g. `planner_system.j2`) with `variables`."""
    return str(_environment().get_template(name).render(**variables)).strip()


@cache
def load_examples(name: str) -> list[dict[str, Any]]:
    """A JSON list of examples shipped beside the templates."""
    data = json.loads((_FOLDER / name).read_text(encoding="utf-8"))
    assert isinstance(data, list)
    return data
