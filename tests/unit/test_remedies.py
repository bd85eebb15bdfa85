"""What to do, said by each front end: the API's words name routes the API has."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import pytest

from masterplanner import Remedy, RunService, Settings
from masterplanner.remedies import RemedyAction
from masterplanner.web import create_app


@pytest.mark.parametrize("action", get_args(RemedyAction))
def test_each_remedy_the_api_names_is_a_route_of_the_api(action: str, isolated: Path) -> None:
    """The remember question's said `POST /api/v1/requests/ID`, which answers 405 (found by review)."""
    service = RunService(Settings.load())
    try:
        app = create_app(service)
        routes = [  # as the API's document lists them
            (method.upper(), re.sub(r"\{[^}]+\}", "[^/]+", path))
            for path, operations in app.openapi()["paths"].items()
            for method in operations
        ]
        app.state.registry.close()
    finally:
        service.close()
    said = Remedy(action, "20261129-120000-abcdef", "0a1b2c3d").said("api")  # type: ignore[arg-type]
    named = re.findall(r"\b(GET|POST|PUT|DELETE) (/api/v1/\S*?)(?=[ ,)]|$)", said)
    assert named, said
    for method, path in named:
        assert any(method == known and re.fullmatch(pattern, path) for known, pattern in routes), said


def test_a_front_end_that_resumes_nothing_names_the_terminal_s_resume() -> None:
    run = "20261129-120000-abcdef"
    shown = [
        Remedy(action, run).said(front_end, resumes=resumes)  # type: ignore[arg-type]
        for action in ("resume", "resume_or_cancel", "cancel_again")
        for front_end, resumes in (("web", True), ("web", False), ("api", False))
    ]
    command = f"`masterplanner runs resume {run}`"
    assert shown == [
        ": continue it with its Resume run button",
        f": continue it with {command}",
        f": continue it with {command}",
        " (a worker, its Resume run button, or its Cancel run button again)",
        f" (a worker, {command}, or its Cancel run button again)",
        f" (a worker, {command}, or POST /api/v1/runs/{run}/cancel again)",
        " (a worker, or its Cancel run button again)",  # a run queued for workers: no server resumes it
        " (a worker, or its Cancel run button again)",
        f" (a worker, or POST /api/v1/runs/{run}/cancel again)",
    ]
