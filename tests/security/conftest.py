"""Shared by the security tests: the code sandbox must start where CI runs them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from masterplanner.sandbox import sandbox_problems
from masterplanner.tools.workspace import Workspace


@pytest.fixture
def sandbox_available() -> None:
    """Skip a test needing the code sandbox where it cannot start; fail it in CI (it installs bubblewrap)."""
    problems = sandbox_problems()
    if problems:
        message = "the sandbox cannot start: " + "; ".join(problems)
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture
def workspace(tmp_path: Path) -> Workspace:
    """An empty workspace in the test's folder."""
    return Workspace(tmp_path / "ws").create()
