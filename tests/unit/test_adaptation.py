"""Adapting a stored plan to a new task: parameters swapped as whole tokens only."""

from collections.abc import Callable
from pathlib import Path

from masterplanner import resolve_model
from masterplanner.plan import Plan


async def test_a_swapped_word_is_not_swapped_inside_a_file_name_or_a_number(
    write_script: Callable[..., Path],
) -> None:
    # the review of the swap found `"report"` → `"summary"` renaming report.md, and 5 → 12 in 5.5
    from masterplanner.adaptation import adapt_plan
    from masterplanner.tools import builtin_catalog

    step = {
        "id": "save",
        "title": "Save the report",
        "instruction": "Save the report text to report.md, at most 5.5 pages, top 5 items.",
        "agent_role": "writer",
        "tools": ["write_file"],
        "depends_on": [],
        "expected_output": "report.md with the report",
    }
    plan = Plan.model_validate({"task": 'Save a "report" of the top 5 to report.md', "steps": [step]})
    model = resolve_model(f"scripted:{write_script([])}")  # no call may be made
    adapted, _, how = await adapt_plan(
        plan, {}, plan.task, 'Save a "summary" of the top 12 to report.md', builtin_catalog(), model=model
    )
    assert (how, adapted.steps[0].instruction, adapted.steps[0].expected_output) == (
        "parameters",
        "Save the summary text to report.md, at most 5.5 pages, top 12 items.",
        "report.md with the summary",
    )
