"""The Master Planner on the embedded model: the real offline path."""

import json
import subprocess
import sys

import pytest

from masterplanner import validate_plan
from masterplanner.tools import builtin_catalog

pytestmark = pytest.mark.local_model

TASK = "Read sales.csv, compute monthly totals, plot them to chart.png and write a summary to report.md"


def test_cli_plan_local_json_is_a_valid_multi_step_plan() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "masterplanner", "plan", TASK, "--model", "local", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    raw = json.loads(result.stdout)
    plan = validate_plan(raw, builtin_catalog())
    assert plan.task == TASK
    assert len(plan.steps) >= 2
