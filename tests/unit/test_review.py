"""The review edit: plan and prompts as YAML, parsed back whole or refused with the reasons."""

from __future__ import annotations

import pytest
from _plans import step

from masterplanner import PlanError, validate_plan
from masterplanner.engine import run_catalog
from masterplanner.review import parse_review_yaml, render_review_yaml, with_errors_on_top

PLAN = validate_plan({"task": "Do a then b", "steps": [step("a"), step("b", "a", tools=["write_file"])]})
AGENTS = {"a": {"prompt": "You are a worker.\nDo a.", "draft": "d"}, "b": {"prompt": "Do b."}}


def test_unchanged_edit_round_trips() -> None:
    text = render_review_yaml(PLAN, AGENTS)
    assert "prompt: |-" in text or "prompt: |" in text
    edit = parse_review_yaml(text, run_catalog(), AGENTS)
    assert edit.plan == PLAN
    assert edit.agents == AGENTS
    assert edit.tool_policies == {}


def test_edited_prompt_and_step_are_applied() -> None:
    text = (
        render_review_yaml(PLAN, AGENTS)
        .replace("Do b.", "Write b.md carefully.")
        .replace("title: do a", "title: A!")
    )
    edit = parse_review_yaml(text, run_catalog(), AGENTS)
    plan, agents = edit.plan, edit.agents
    assert plan.step("a").title == "A!"
    assert agents["b"] == {"prompt": "Write b.md carefully.", "edited": True}
    assert agents["a"] == AGENTS["a"]


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (("depends_on: []", "depends_on: [b]"), "steps form a cycle: a -> b -> a"),
        (("- write_file", "- launch_rockets"), "launch_rockets"),
        (("task: Do a then b", "task: [unclosed"), "not valid YAML at line"),
    ],
)
def test_invalid_edits_name_the_problem(change: tuple[str, str], problem: str) -> None:
    text = render_review_yaml(PLAN, AGENTS).replace(*change)
    with pytest.raises(PlanError) as raised:
        parse_review_yaml(text, run_catalog(), AGENTS)
    assert problem in str(raised.value)
    reopened = with_errors_on_top(text, raised.value)
    assert reopened.startswith("# ERROR: ")
    assert with_errors_on_top(reopened, raised.value).count("# ERROR: ") == len(raised.value.problems)


def test_tool_policies_for_the_run_and_for_one_agent() -> None:
    text = render_review_yaml(PLAN, AGENTS).replace(
        "tool_policies: {}", "tool_policies: {code_execution: deny}"
    )
    text = text.replace("- id: b\n", "- id: b\n  tool_policies: {write_file: ask}\n")
    edit = parse_review_yaml(text, run_catalog(), AGENTS)
    assert edit.tool_policies == {"code_execution": "deny"}
    assert edit.agents["b"] == {"prompt": "Do b.", "tool_policies": {"write_file": "ask"}}
    assert render_review_yaml(edit.plan, edit.agents, edit.tool_policies).count("tool_policies") == 3
    bad = text.replace("code_execution: deny", "code_execution: sometimes").replace(
        "write_file: ask", "nope: ask"
    )
    with pytest.raises(PlanError) as raised:
        parse_review_yaml(bad, run_catalog(), AGENTS)
    assert raised.value.problems == [
        "the run: tool_policies: code_execution must be auto, ask or deny, got 'sometimes'"
    ]
    with pytest.raises(PlanError, match="step b: tool_policies: 'nope' is not a tool of this run"):
        parse_review_yaml(text.replace("write_file: ask", "nope: ask"), run_catalog(), AGENTS)
