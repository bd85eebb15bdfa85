"""The review edit: plan and prompts as YAML, parsed back whole or refused; the editor that edits it."""

from __future__ import annotations

from pathlib import Path

import pytest
from _plans import step

from masterplanner import ConfigError, PlanError, validate_plan
from masterplanner.engine import run_catalog
from masterplanner.review import (
    edit_in_editor,
    editor_command,
    parse_review_yaml,
    render_review_yaml,
    with_errors_on_top,
)

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


def test_a_person_marks_a_step_to_expand_into_a_sub_plan() -> None:
    text = render_review_yaml(PLAN, AGENTS)
    assert "expand: true" not in text.split("\n", 5)[-1]  # only the header mentions it
    marked = text.replace("  title: do b\n", "  title: do b\n  expand: true\n")
    edit = parse_review_yaml(marked, run_catalog(), AGENTS)
    assert [(step.id, step.expand) for step in edit.plan.steps] == [("a", False), ("b", True)]
    assert "  expand: true\n" in render_review_yaml(edit.plan, edit.agents)  # and it stays shown


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
    assert raised.value.problems == [  # both named at once, not one per attempt
        "the run: tool_policies: code_execution must be auto, ask or deny, got 'sometimes'",
        "step b: tool_policies: 'nope' is not a tool of this run",
    ]
    with pytest.raises(PlanError, match="step b: tool_policies: 'nope' is not a tool of this run"):
        parse_review_yaml(text.replace("write_file: ask", "nope: ask"), run_catalog(), AGENTS)


def test_an_edit_without_its_task_keeps_the_run_task_as_the_header_says() -> None:
    text = render_review_yaml(PLAN, AGENTS)
    assert "# The task is the run's and stays as it is." in text
    edit = parse_review_yaml(
        text.replace("task: Do a then b\n", ""), run_catalog(), AGENTS, task="Do a then b"
    )
    assert edit.plan == PLAN


def test_every_problem_of_an_edit_is_named_at_once() -> None:
    text = (
        render_review_yaml(PLAN, AGENTS)
        .replace("- id: a\n", "- id: a\n  agent: mine\n  expand: maybe\n  colour: red\n")
        .replace("- id: b\n", "- id: b\n  tool_policies: {write_file: sometimes}\n")
    )
    with pytest.raises(PlanError) as raised:
        parse_review_yaml(text, run_catalog(), AGENTS, task="Do a then b")
    assert raised.value.problems == [
        "step a: agent must be left as it is or set to 'fresh'",
        "step b: tool_policies: write_file must be auto, ask or deny, got 'sometimes'",
        "step 'a': expand: should be true or false, got 'maybe'",
        "step 'a': colour: unknown field; known: agent_role, depends_on, expand, expected_output, id, "
        "instruction, title, tools",
    ]


# ---- the person's editor


def _editor(tmp_path: Path, body: str) -> str:
    """A fake editor: a shell script; the file to edit is its last argument."""
    script = tmp_path / "fake-editor.sh"
    script.write_text("#!/bin/sh\nfor file; do :; done\n" + body + "\n")
    script.chmod(0o755)
    return str(script)


def test_the_editor_returns_what_was_saved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    editor = _editor(tmp_path, 'printf "\\357\\273\\277task: edited\\r\\nsteps: []\\r\\n" > "$file"')
    monkeypatch.setenv("VISUAL", editor)
    monkeypatch.setenv("EDITOR", str(tmp_path / "never-used"))
    assert editor_command() == editor
    assert edit_in_editor("task: x\n") == "task: edited\nsteps: []\n"  # BOM and CRLF gone


def test_the_edit_file_is_private_and_removed(tmp_path: Path) -> None:
    seen = tmp_path / "seen"
    editor = _editor(tmp_path, f'stat -c %a "$file" "${{file%/*}}" > {seen}; echo "$file" >> {seen}')
    assert edit_in_editor("x", editor=editor) == "x\n"
    mode, folder_mode, path = seen.read_text().split()
    assert (mode, folder_mode) == ("600", "700")
    assert path.endswith("edit.yaml")
    assert not Path(path).exists()
    assert not Path(path).parent.exists()


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("exit 1", "the editor '{editor} --bad' exited with status 1"),
        ("kill -9 $$", "the editor '{editor} --bad' was stopped by SIGKILL"),
        ('rm -- "$file"', "the editor '{editor} --bad' removed the file it was editing"),
        (
            'printf "task: \\377\\376" > "$file"',
            "the editor '{editor} --bad' saved text that is not UTF-8 (byte 0xff at offset 6)",
        ),
        (
            'rm -- "$file"; mkdir -- "$file"',
            "the editor '{editor} --bad' left a file that cannot be read: Is a directory",
        ),
        (
            'head -c 4194305 /dev/zero > "$file"',
            "the editor '{editor} --bad' saved more than 4 MiB",
        ),
    ],
)
def test_an_editor_that_fails_is_one_config_error(tmp_path: Path, body: str, problem: str) -> None:
    editor = _editor(tmp_path, body)
    with pytest.raises(ConfigError) as raised:
        edit_in_editor("task: x\n", editor=f"{editor} --bad")
    assert str(raised.value) == problem.format(editor=editor)


@pytest.mark.parametrize(
    ("command", "problem"),
    [
        (
            "/nonexistent/editor",
            "the editor '/nonexistent/editor' could not be started: No such file or directory",
        ),
        ("{text}", "the editor '{text}' could not be started: Permission denied"),
        ("{script}", "the editor '{script}' could not be started: Exec format error"),
        ("vi 'unclosed", 'the editor "vi \'unclosed" is not a command line: No closing quotation'),
    ],
)
def test_an_editor_that_cannot_start_is_one_config_error(tmp_path: Path, command: str, problem: str) -> None:
    text, script = tmp_path / "text", tmp_path / "script"  # not executable; executable, not a program
    text.write_text("hello")
    script.write_text("hello")
    script.chmod(0o755)
    with pytest.raises(ConfigError) as raised:
        edit_in_editor("x", editor=command.format(text=text, script=script))
    assert str(raised.value) == problem.format(text=text, script=script)


def test_an_empty_editor_setting_falls_back_and_blank_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VISUAL", "   ")
    monkeypatch.setenv("EDITOR", "")
    assert editor_command() in ("sensible-editor", "vim", "nano", "vi")
    with pytest.raises(ConfigError, match=r"^the editor setting \(\$VISUAL or \$EDITOR\) is empty$"):
        edit_in_editor("x", editor="  ")
