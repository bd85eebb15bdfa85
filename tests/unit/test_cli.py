"""The CLI as a person runs it: a real process, its exit code, stdout and stderr."""

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from masterplanner import MODEL_FORMS, __version__
from masterplanner.redaction import REMOVED


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "masterplanner", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        timeout=120,
    )


def test_arguments_that_are_not_utf8_are_one_line_of_error() -> None:
    for args, number in [(("runs", "show", "\udcff"), 3), (("run", "Write \udcff poem"), 2)]:
        result = subprocess.run(
            [
                sys.executable.encode(),
                b"-m",
                b"masterplanner",
                *(arg.encode("utf-8", "surrogateescape") for arg in args),
            ],
            capture_output=True,
            timeout=120,
        )
        assert result.returncode == 2
        raw = args[-1].encode("utf-8", "surrogateescape")
        assert (
            result.stderr.decode()
            == f"error: argument {number} ({raw!r}) is not UTF-8 text; give it in UTF-8\n"
        )


def test_option_values_that_are_not_numbers_are_refused_in_our_words() -> None:
    for args, wanted in [
        (
            ("runs", "list", "--limit", "abc"),
            "error: --limit must be a whole number, not 'abc'",
        ),
        (
            ("memory", "search", "x", "--limit", "0"),
            "error: --limit must be from 1 to 100, not 0",
        ),
        (
            ("runs", "cancel", "r", "--wait", "soon"),
            "error: --wait must be a number, not 'soon'",
        ),
        (
            ("run", "x", "--max-parallel", "abc"),
            "error: --max-parallel must be a whole number, not 'abc'",
        ),
    ]:
        result = run(*args)
        assert result.returncode == 2
        assert result.stderr == wanted + "\n"
        assert "Input should" not in result.stderr


def test_usage_errors_are_one_line_in_our_words() -> None:
    # click's were three lines in its words: the usage, "Try 'masterplanner run --help' for
    # help." and "Error: No such option: --nosuch"
    for args, wanted in [
        (
            ("run", "--nosuch"),
            "`masterplanner run` has no option --nosuch (`masterplanner run --help` lists its options)",
        ),
        (
            ("run", "x", "--max-paralel", "2"),
            "`masterplanner run` has no option --max-paralel; the closest: --max-parallel, --max-calls, "
            "--max-replans (`masterplanner run --help` lists its options)",
        ),
        (
            ("run",),
            "`masterplanner run` needs the argument TASK (`masterplanner run --help` says what it takes)",
        ),
        (
            ("nosuch",),
            "`masterplanner` has no command 'nosuch' (`masterplanner --help` lists its commands)",
        ),
        (
            ("runs", "shwo", "r"),
            "`masterplanner runs` has no command 'shwo'; the closest: show "
            "(`masterplanner runs --help` lists its commands)",
        ),
        (
            ("runs", "show", "a", "b"),
            "`masterplanner runs show` takes no more arguments, got: b (text with spaces goes in quotes)",
        ),
        (  # 'b c' was quoted, and was said as 'b', 'c'
            ("runs", "show", "a", "b c"),
            "`masterplanner runs show` takes no more arguments, got: b c (text with spaces goes in quotes)",
        ),
        (  # --debug printed a traceback of an error never raised above the line
            ("--debug", "runs", "shwo", "r"),
            "`masterplanner runs` has no command 'shwo'; the closest: show "
            "(`masterplanner runs --help` lists its commands)",
        ),
        (("runs", "list", "--limit"), "--limit needs a value"),
        (("runs", "list", "--json=yes"), "--json takes no value"),
    ]:
        result = run(*args)
        assert (result.returncode, result.stdout) == (2, "")
        assert result.stderr == f"error: {wanted}\n"


def test_version() -> None:
    result = run("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"masterplanner {__version__}"


def test_help_lists_commands() -> None:
    result = run("--help")
    assert result.returncode == 0
    assert "doctor" in result.stdout
    assert "chat" in result.stdout


def test_empty_lists_say_so_on_stderr_and_print_nothing(isolated: Path) -> None:
    """`runs list` and `agents list` drew an empty table, `cohorts list` and `memory list` nothing at all."""
    said = {
        ("runs", "list"): "no runs yet",
        ("agents", "list"): "no agents yet (a run that succeeds stores its team's)",
        ("cohorts", "list"): "no cohorts yet (a run that succeeds stores its team)",
        ("memory", "list"): "no memories",
        ("memory", "search", "anything"): "no memories match",
    }
    for args, line in said.items():
        result = run(*args, env={"MASTERPLANNER_EMBEDDER": "none"})
        assert (result.returncode, result.stdout, result.stderr) == (0, "", line + "\n"), args
        assert run(*args, "--json", env={"MASTERPLANNER_EMBEDDER": "none"}).stdout == "[]\n", args


def test_help_in_a_narrow_terminal_cuts_no_command_short_and_says_serve_serves_the_web_app() -> None:
    """`memory` read "…and the..." in 80 columns, and `serve` said it served the API alone."""
    result = run("--help", env={"COLUMNS": "80"})
    commands = result.stdout.split("Commands:")[1]
    assert "..." not in commands
    assert "serve     Serve the web app and its REST API over HTTP." in commands
    assert "memory    List, search and remove agents' memories." in commands


def test_unknown_model_form_exits_2_with_one_line() -> None:
    result = run("chat", "hi", "--model", "nope:x")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: setting 'model' (given as a flag or argument): unknown model 'nope:x'")
    for form in MODEL_FORMS:
        assert form in lines[0]
    assert result.stdout == ""


def test_missing_api_key_names_the_variable() -> None:
    result = run("chat", "hi", "--model", "anthropic:claude-sonnet-4-5")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: model 'anthropic:claude-sonnet-4-5' needs the environment variable ANTHROPIC_API_KEY, "
        "which is not set"
    )


def test_corrupt_gguf_names_the_path(tmp_path: Path) -> None:
    corrupt = tmp_path / "bad.gguf"
    corrupt.write_text("garbage")
    result = run("chat", "hi", "--model", f"local:{corrupt}")
    assert result.returncode == 2
    assert str(corrupt) in result.stderr
    assert "Traceback" not in result.stderr


def test_debug_adds_the_traceback() -> None:
    result = run("--debug", "chat", "hi", "--model", "nope:x")
    assert result.returncode == 2
    assert "Traceback" in result.stderr
    assert "error: setting 'model' (given as a flag or argument): unknown model 'nope:x'" in result.stderr


def test_invalid_setting_exits_2(monkeypatch: pytest.MonkeyPatch) -> None:
    result = run("chat", "hi", env={"MASTERPLANNER_LOCAL_CONTEXT_TOKENS": "tiny"})
    assert result.returncode == 2
    assert "MASTERPLANNER_LOCAL_CONTEXT_TOKENS" in result.stderr


def test_chat_scripted_json(write_script: Callable[..., Path]) -> None:
    script = write_script([{"purpose": "chat", "output": "red green blue"}])
    result = run("chat", "Name three colors", "--model", f"scripted:{script}", "--json")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["output"] == "red green blue"
    assert payload["model"] == f"scripted:{script}"
    assert payload["usage"]["llm_calls"] == 1
    assert payload["usage"]["by_purpose"]["chat"]["calls"] == 1
    assert payload["usage"]["by_purpose"]["chat"]["input_tokens"] == 3
    assert payload["usage"]["by_purpose"]["chat"]["output_tokens"] == 3
    assert set(payload["usage"]["by_purpose"]["chat"]) == {
        "calls",
        "input_tokens",
        "output_tokens",
        "seconds",
        "cost_usd",
        "unpriced_calls",
        "failed_calls",
    }


def test_chat_scripted_text(write_script: Callable[..., Path]) -> None:
    script = write_script([{"purpose": "chat", "output": "hello there"}])
    result = run("chat", "hi", "--model", f"scripted:{script}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "hello there"
    assert "1 call ·" in result.stderr
    assert "2 out tokens" in result.stderr


def test_exhausted_script_is_a_failure_exit_1(write_script: Callable[..., Path]) -> None:
    script = write_script([{"purpose": "planner", "output": "x"}])
    result = run("chat", "hi", "--model", f"scripted:{script}")
    assert result.returncode == 1
    assert "no entry left for purpose 'chat'" in result.stderr


def test_empty_prompt_is_a_usage_error() -> None:
    result = run("chat", "  ")
    assert result.returncode == 2
    assert result.stderr.strip() == "error: the prompt is empty"


def _step(step_id: str, *deps: str) -> dict[str, object]:
    return {
        "id": step_id,
        "title": step_id,
        "instruction": f"Do {step_id}.",
        "agent_role": "worker",
        "tools": ["read_file"],
        "depends_on": list(deps),
        "expected_output": "",
    }


def test_plan_json_with_scripted_planner(write_script: Callable[..., Path]) -> None:
    cyclic = {"steps": [_step("a", "b"), _step("b", "a")]}
    valid = {"steps": [_step("a"), _step("b", "a")]}
    script = write_script([{"purpose": "planner", "output": cyclic}, {"purpose": "planner", "output": valid}])
    result = run("plan", "Do a then b", "--model", f"scripted:{script}", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"task": "Do a then b", **valid}


def test_plan_that_stays_cyclic_exits_2_naming_the_cycle(write_script: Callable[..., Path]) -> None:
    cyclic = {"steps": [_step("a", "b"), _step("b", "a")]}
    script = write_script([{"purpose": "planner", "output": cyclic, "repeat": True}])
    result = run("plan", "Do a then b", "--model", f"scripted:{script}")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: no valid plan after 2 repairs: steps form a cycle: a -> b -> a (each depends on the next)"
    )


def test_plan_tree_output(write_script: Callable[..., Path]) -> None:
    valid = {"steps": [_step("load"), _step("left", "load"), _step("right", "load")]}
    script = write_script([{"purpose": "planner", "output": valid}])
    result = run("plan", "Fan out", "--model", f"scripted:{script}")
    assert result.returncode == 0, result.stderr
    assert "load load (starts at once)" in result.stdout
    assert "left left after load" in result.stdout
    assert "1 planner call ·" in result.stderr


def test_plan_counts_its_calls_in_words(write_script: Callable[..., Path]) -> None:
    """`1 planner call(s)` before, whatever the count: now `1 planner call`, `2 planner calls`."""
    cyclic = {"steps": [_step("a", "b"), _step("b", "a")]}
    valid = {"steps": [_step("a"), _step("b", "a")]}
    once = run(
        "plan",
        "Do a then b",
        "--model",
        f"scripted:{write_script([{'purpose': 'planner', 'output': valid}])}",
    )
    assert once.returncode == 0, once.stderr
    assert once.stderr.startswith("1 planner call · "), once.stderr
    script = write_script([{"purpose": "planner", "output": cyclic}, {"purpose": "planner", "output": valid}])
    twice = run("plan", "Do a then b", "--model", f"scripted:{script}")
    assert twice.returncode == 0, twice.stderr
    assert twice.stderr.startswith("2 planner calls · "), twice.stderr


def test_plan_with_prompts_json(write_script: Callable[..., Path]) -> None:
    valid = {"steps": [_step("a"), _step("b", "a")]}
    critique = {"clarity": 4, "completeness": 4, "tool_fit": 5, "output_format": 3, "defects": []}
    script = write_script(
        [
            {"purpose": "planner", "output": valid},
            {"purpose": "prompt_creator", "output": "You are a worker.", "repeat": True},
            {"purpose": "critic", "output": critique, "repeat": True},
        ]
    )
    result = run("plan", "Do a then b", "--model", f"scripted:{script}", "--prompts", "--json")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["steps"] == valid["steps"]
    assert set(payload["agents"]) == {"a", "b"}
    assert payload["agents"]["a"]["prompt"] == "You are a worker."
    assert payload["agents"]["a"]["critique"] == critique


def test_plan_with_prompts_says_the_critic_scored_the_version_before_the_revision(
    write_script: Callable[..., Path],
) -> None:
    """The prompt shown is the last revision; the critique is of the text that revision replaced."""
    valid = {"steps": [_step("a")]}
    critique = {"clarity": 2, "completeness": 1, "tool_fit": 5, "output_format": 3, "defects": ["vague"]}
    script = write_script(
        [
            {"purpose": "planner", "output": valid},
            {"purpose": "prompt_creator", "output": "You are a draft."},
            {"purpose": "critic", "output": critique},
            {"purpose": "prompt_creator", "output": "You are the revision."},
        ]
    )
    result = run("plan", "Do a", "--model", f"scripted:{script}", "--prompts")
    assert result.returncode == 0, result.stderr
    lines = [line.strip(" │├└─") for line in result.stdout.splitlines()]
    at = lines.index(
        "prompt (the critic scored the version before this revision: clarity 2, completeness 1, "
        "tool fit 5, output 3)"
    )
    assert lines[at + 1].strip(" │├└─") == "You are the revision."
    assert "critic: clarity" not in result.stdout


def test_plan_plans_with_the_tools_a_run_could_use_here(write_script: Callable[..., Path]) -> None:
    """`plan` offered every shipped tool: it showed plans with tools `run` would refuse here."""
    searching = {"steps": [{**_step("look"), "tools": ["web_search"]}]}
    script = write_script([{"purpose": "planner", "output": searching, "repeat": True}])
    result = run("plan", "Look it up", "--model", f"scripted:{script}", "--json")
    assert result.returncode == 2
    assert result.stderr.startswith("error: no valid plan after 2 repairs: step 'look': tool 'web_search'")
    assert "set web_search_backend to local" in result.stderr

    result = run("plan", "Look it up", "--model", f"scripted:{script}", "--tools", "read_file,web_search")
    assert result.returncode == 2
    assert result.stderr.startswith("error: --tools: 'web_search' is not available here: set web_search_")

    for typo in ("nope", "read_fil"):  # an underscore once made a misspelling an MCP server's tool
        result = run("plan", "Look it up", "--model", f"scripted:{script}", "--tools", f"read_file,{typo}")
        assert result.returncode == 2
        assert result.stderr.startswith(f"error: --tools: unknown tools: {typo}; available: ")
        assert "web_search" not in result.stderr
        assert "MCP" not in result.stderr


def test_plan_rounds_out_of_range_is_a_usage_error(write_script: Callable[..., Path]) -> None:
    script = write_script([])
    result = run("plan", "x", "--model", f"scripted:{script}", "--prompts", "--rounds", "9")
    assert result.returncode == 2
    assert result.stderr.strip() == "error: --rounds must be between 0 and 5, got 9"


def test_markup_and_escapes_in_an_error_are_one_literal_line() -> None:
    # `[/]` once made rich raise MarkupError (a traceback); ESC reached the terminal
    result = run("chat", "hi", "--model", "nope:[/]\x1b]0;pwned\x07")
    assert result.returncode == 2
    assert result.stderr.startswith(
        "error: setting 'model' (given as a flag or argument): unknown model 'nope:[/]\\x1b]0;pwned\\x07'"
    )
    assert len(result.stderr.splitlines()) == 1
    assert "\x1b" not in result.stderr and "\x07" not in result.stderr


def _fake_editor(tmp_path: Path, body: str) -> str:
    script = tmp_path / "fake-editor.sh"
    script.write_text("#!/bin/sh\nfor file; do :; done\n" + body + "\n")  # the file is the last argument
    script.chmod(0o755)
    return script.as_posix()


def test_agents_edit_with_a_failing_or_bad_editor_changes_nothing(tmp_path: Path) -> None:
    from masterplanner import Settings
    from masterplanner.registry import AgentSpec, open_registry

    settings = Settings.load()
    settings.ensure_home()
    open_registry(settings).put_agent(
        AgentSpec(id="poet", name="poet", role="poet", system_prompt="You write.")
    )
    failing = _fake_editor(tmp_path, "exit 3")
    result = run("agents", "edit", "poet", env={"VISUAL": failing})
    assert result.returncode == 2
    assert result.stderr == f"error: the editor '{failing}' exited with status 3; agent poet is unchanged\n"

    bad = _fake_editor(tmp_path, 'printf \'{"name": ""}\' > "$file"')
    result = run("agents", "edit", "poet", env={"VISUAL": bad})
    assert result.returncode == 2
    assert result.stderr == (
        "error: the edit is not a valid agent, nothing changed: "
        "name: must not be empty; role: is missing; system_prompt: is missing\n"
    )

    blank = _fake_editor(
        tmp_path,
        'printf \'{"name": "poet", "role": "poet", "system_prompt": "You write.", "lessons": ["a", " "]}\' '
        '> "$file"',
    )
    result = run("agents", "edit", "poet", env={"VISUAL": blank})
    assert result.returncode == 2
    assert (
        result.stderr
        == "error: the edit is not a valid agent, nothing changed: lessons.1: must not be blank\n"
    )

    unchanged = _fake_editor(tmp_path, "true")
    assert run("agents", "edit", "poet", env={"VISUAL": unchanged}).stderr == "no change\n"

    renamed = _fake_editor(tmp_path, 'sed -i "s/\\"name\\": \\"poet\\"/\\"name\\": \\"bard\\"/" "$file"')
    result = run("agents", "edit", "poet", env={"VISUAL": renamed})
    assert result.returncode == 0, result.stderr
    assert result.stderr == "agent poet is now version 2\n"
    assert json.loads(run("agents", "show", "poet", "--json").stdout)["name"] == "bard"


NUL_LESSON_EDITOR = """
import json, pathlib, sys
path = pathlib.Path(sys.argv[-1])
path.write_text(json.dumps(json.loads(path.read_text()) | {"lessons": ["a" + chr(0) + "b"]}))
"""


def test_an_agent_s_text_holding_a_nul_is_refused_naming_it(database_url: str, tmp_path: Path) -> None:
    """On SQLite the agent was stored with it; on Postgres refused in the database's words."""
    from masterplanner import Settings
    from masterplanner.registry import AgentSpec, open_registry

    open_registry(Settings.load()).put_agent(
        AgentSpec(id="poet", name="poet", role="poet", system_prompt="You write.")
    )
    backup = tmp_path / "agents.jsonl"
    assert run("agents", "export", str(backup)).returncode == 0
    line = json.loads(backup.read_text())
    backup.write_text(json.dumps(line | {"keywords": ["verse", "a\x00b"]}) + "\n")
    refused = run("agents", "import", str(backup))
    assert (refused.returncode, refused.stderr) == (
        2,
        f"error: {backup}: line 1: keywords.1: must not hold a NUL character; nothing was imported\n",
    )
    editor = tmp_path / "editor.py"
    editor.write_text(NUL_LESSON_EDITOR)
    edited = run("agents", "edit", "poet", env={"VISUAL": f"{sys.executable} {editor}"})
    assert (edited.returncode, edited.stderr) == (
        2,
        "error: the edit is not a valid agent, nothing changed: lessons.0: must not hold a NUL character\n",
    )
    shown = json.loads(run("agents", "show", "poet", "--json").stdout)
    assert (shown["versions"], shown["keywords"], shown["lessons"]) == ([1], [], [])
    # a lesson past its limit: before, `agents edit` stored any length (and every later run of the
    # agent failed on its token budget)
    editor.write_text(NUL_LESSON_EDITOR.replace('"a" + chr(0) + "b"', '"a" * 80000'))
    too_long = run("agents", "edit", "poet", env={"VISUAL": f"{sys.executable} {editor}"})
    assert (too_long.returncode, too_long.stderr) == (
        2,
        "error: the edit is not a valid agent, nothing changed: lessons.0: is 80,000 characters; "
        "the limit for a lesson is 600\n",
    )
    assert json.loads(run("agents", "show", "poet", "--json").stdout)["versions"] == [1]


def test_agents_import_adds_versions_and_refuses_what_an_edit_would(tmp_path: Path) -> None:
    from masterplanner import Settings
    from masterplanner.registry import AgentSpec, open_registry

    settings = Settings.load()
    settings.ensure_home()
    open_registry(settings).put_agent(
        AgentSpec(id="poet", name="poet", role="poet", system_prompt="You write.")
    )
    backup = tmp_path / "agents.jsonl"
    assert run("agents", "export", str(backup)).returncode == 0
    edited = _fake_editor(tmp_path, 'sed -i "s/You write./You write well./" "$file"')
    assert run("agents", "edit", "poet", env={"VISUAL": edited}).returncode == 0
    restored = run("agents", "import", str(backup))
    assert (restored.returncode, restored.stderr) == (
        0,
        f"imported {backup}: 0 new, 1 updated (a new version), 0 unchanged\n",
    )
    shown = json.loads(run("agents", "show", "poet", "--json").stdout)
    assert (shown["version"], shown["system_prompt"], shown["versions"]) == (3, "You write.", [1, 2, 3])

    line = json.loads(backup.read_text())
    for change, problem in [
        ({"tools": ["nonexistent"]}, "tools names 'nonexistent', which is not a tool"),
        ({"role": "wri\nter"}, "role: must be one line of text without control characters"),
        ({"model": "bogus"}, "model: 'bogus' is not a model spec"),
        # a track record no agent can have, which would rank it above every other (a prior near 50)
        (
            {"stats": {"uses": 0, "successes": 100, "failures": 0, "ratings": 1, "rating_sum": 1000}},
            "stats.successes: successes (100) and failures (0) add up to more than uses (0); "
            "stats.rating_sum: must be from 1 to 5 (ratings is 1, each from 1 to 5), got 1000",
        ),
        (
            {"stats": {"uses": 2, "successes": 1, "failures": 1, "ratings": 0, "rating_sum": 3}},
            "stats.rating_sum: must be from 0 to 0 (ratings is 0, each from 1 to 5), got 3",
        ),
        ({"stats": {"uses": -1}}, "stats.uses: must be at least 0, got -1"),
        ({"lessons": ["", "   "]}, "lessons.0: must not be blank; lessons.1: must not be blank"),
        # lessons and keywords had a count and no length; a keyword's secret was taken
        (
            {"lessons": ["Cite it.", "a" * 80_000]},
            "lessons.1: is 80,000 characters; the limit for a lesson is 600",
        ),
        ({"keywords": ["k" * 101]}, "keywords.0: is 101 characters; the limit for a keyword is 100"),
        (
            {"keywords": ["verse", "sk-proj-Abc123def456ghi789jkl"]},
            "keywords.1: it holds what looks like a secret (an API key, a token or a password, such as "
            "`OPENAI_API_KEY=…`): put secrets in the environment or the settings file, not in an agent",
        ),
    ]:
        backup.write_text(json.dumps(line | {"id": "other"}) + "\n" + json.dumps(line | change) + "\n")
        refused = run("agents", "import", str(backup))
        assert refused.returncode == 2
        assert refused.stderr.startswith(f"error: {backup}: line 2: {problem}"), refused.stderr
        assert refused.stderr.endswith("; nothing was imported\n")
    # a line that is no JSON object was "line 2: line: invalid JSON: expected ident at line 1 column 2"
    for text, problem in [
        ("nope", "line 2 is not valid JSON (at column 2: a value was expected)"),
        ('{"id": "x",}', "line 2 is not valid JSON (at column 12: a comma is followed by no value)"),
        ("[1]", "line 2 should be a JSON object, got a list"),
    ]:
        backup.write_text(json.dumps(line | {"id": "other"}) + "\n" + text + "\n")
        refused = run("agents", "import", str(backup))
        assert (refused.returncode, refused.stderr) == (
            2,
            f"error: {backup}: {problem}; nothing was imported\n",
        )
    assert [agent["id"] for agent in json.loads(run("agents", "list", "--json").stdout)] == ["poet"]


def test_an_older_export_imported_again_keeps_the_lessons_and_track_record_learned_since(
    tmp_path: Path,
) -> None:
    """Before, the file's lessons took the place of the stored ones: each lesson learned since was dropped."""
    from masterplanner import Settings
    from masterplanner.registry import AgentSpec, open_registry

    settings = Settings.load()
    settings.ensure_home()
    registry = open_registry(settings)
    poet = registry.put_agent(
        AgentSpec(id="poet", name="poet", role="poet", system_prompt="You write.", lessons=["Rhyme."])
    )
    backup = tmp_path / "agents.jsonl"
    assert run("agents", "export", str(backup)).returncode == 0
    # learned since the export: a lesson (a new version, as a rating writes it) and a track record
    registry.put_agent(poet.model_copy(update={"lessons": ["Rhyme.", "Count the syllables."]}))
    registry.record_outcome("poet", succeeded=True, rating=5)
    again = run("agents", "import", str(backup))
    said = f"imported {backup}: 0 new, 0 updated (a new version), 1 unchanged\n"
    assert (again.returncode, again.stderr) == (0, said)
    shown = json.loads(run("agents", "show", "poet", "--json").stdout)
    assert (shown["version"], shown["lessons"]) == (2, ["Rhyme.", "Count the syllables."])
    assert (shown["stats"]["uses"], shown["stats"]["ratings"]) == (1, 1)
    # a file with a lesson the agent lacks (and another prompt): the file's agent, with every lesson
    line = json.loads(backup.read_text())
    other = line | {"system_prompt": "You write odes.", "lessons": ["Be brief."]}
    backup.write_text(json.dumps(other) + "\n")
    merged = run("agents", "import", str(backup))
    said = f"imported {backup}: 0 new, 1 updated (a new version), 0 unchanged\n"
    assert (merged.returncode, merged.stderr) == (0, said)
    shown = json.loads(run("agents", "show", "poet", "--json").stdout)
    assert (shown["version"], shown["system_prompt"]) == (3, "You write odes.")
    assert shown["lessons"] == ["Be brief.", "Rhyme.", "Count the syllables."]
    assert (shown["stats"]["uses"], shown["stats"]["ratings"]) == (1, 1)


DROP_LESSON_EDITOR = """
import json, pathlib, sys
path = pathlib.Path(sys.argv[-1])
agent = json.loads(path.read_text())
path.write_text(json.dumps(agent | {"lessons": [text for text in agent["lessons"] if text != "Lesson 1."]}))
"""


def test_an_older_export_imported_again_does_not_bring_back_a_lesson_removed_since(tmp_path: Path) -> None:
    """Before, a lesson removed since the export, by an edit or let go as the agent learned, came back."""
    from masterplanner import Settings
    from masterplanner.registry import AgentSpec, open_registry

    settings = Settings.load()
    settings.ensure_home()
    registry = open_registry(settings)
    lessons = [f"Lesson {n}." for n in range(50)]  # the most an agent keeps
    registry.put_agent(
        AgentSpec(id="poet", name="poet", role="poet", system_prompt="You write.", lessons=lessons)
    )
    backup = tmp_path / "agents.jsonl"
    assert run("agents", "export", str(backup)).returncode == 0
    # since the export: a rating's lesson lets "Lesson 0." go, and an edit removes "Lesson 1."
    learned = registry.apply_rating("r1", 2, by="me", agent_ids=["poet"], lessons={"poet": ["Rhyme."]})
    assert learned.lessons == {"poet": ["Rhyme."]}
    editor = tmp_path / "editor.py"
    editor.write_text(DROP_LESSON_EDITOR)
    assert run("agents", "edit", "poet", env={"VISUAL": f"{sys.executable} {editor}"}).returncode == 0
    kept = [*lessons[2:], "Rhyme."]
    assert json.loads(run("agents", "show", "poet", "--json").stdout)["lessons"] == kept
    again = run("agents", "import", str(backup))
    said = f"imported {backup}: 0 new, 0 updated (a new version), 1 unchanged\n"
    assert (again.returncode, again.stderr) == (0, said)
    shown = json.loads(run("agents", "show", "poet", "--json").stdout)
    assert (shown["version"], shown["lessons"]) == (3, kept)
    # a lesson new to the agent's history still comes with the file; the removed ones still do not
    line = json.loads(backup.read_text())
    backup.write_text(json.dumps(line | {"lessons": ["Lesson 0.", "Be brief.", "Lesson 1."]}) + "\n")
    merged = run("agents", "import", str(backup))
    said = f"imported {backup}: 0 new, 1 updated (a new version), 0 unchanged\n"
    assert (merged.returncode, merged.stderr) == (0, said)
    shown = json.loads(run("agents", "show", "poet", "--json").stdout)
    assert (shown["version"], shown["lessons"]) == (4, ["Be brief.", *kept])


def test_a_config_error_inside_an_exception_group_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from masterplanner import ConfigError
    from masterplanner.cli import app as app_module
    from masterplanner.cli import main

    def task_group_failure(**_: object) -> None:  # as anyio raises what failed in a task group
        raise ExceptionGroup("unhandled errors", [ConfigError("bad [/] setting\x1b]0;pwned\x07\nx")])

    monkeypatch.setattr(app_module, "app", task_group_failure)
    with pytest.raises(SystemExit) as exited:
        main(["chat", "hi"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == "error: bad [/] setting\\x1b]0;pwned\\x07\\nx\n"


def test_a_worker_for_an_unknown_provider_is_refused_in_our_words() -> None:
    result = run("worker", "--queues", "scripted,opneai")
    assert (result.returncode, result.stderr.strip()) == (
        2,
        "error: no provider 'opneai' to take steps for; "
        "providers are anthropic, local, ollama, openai, scripted",
    )


def test_a_worker_for_a_provider_whose_key_is_not_set_is_refused_in_our_words() -> None:
    result = run("worker", "--queues", "scripted,openai", env={"OPENAI_API_KEY": "", "OPENAI_BASE_URL": ""})
    assert (result.returncode, result.stderr.strip()) == (
        2,
        "error: this worker cannot take openai runs or steps: neither OPENAI_API_KEY nor "
        "OPENAI_BASE_URL is set here; set one (OPENAI_BASE_URL alone for a compatible server that "
        "needs no key), or leave openai out of the worker's queues",
    )


def test_a_worker_for_anthropic_without_its_key_is_refused_naming_the_key() -> None:
    result = run("worker", "--queues", "anthropic", env={"ANTHROPIC_API_KEY": ""})
    assert (result.returncode, result.stderr.strip()) == (
        2,
        "error: this worker cannot take anthropic runs or steps: ANTHROPIC_API_KEY is not set here; "
        "set it, or leave anthropic out of the worker's queues",
    )


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_seconds_to_wait_that_are_not_a_number_of_seconds_are_refused(value: str) -> None:
    """`worker --grace inf` started, then crashed on SIGTERM (int(inf)); `runs cancel --wait -5` was taken."""
    worker = run("worker", "--grace", value)
    assert (worker.returncode, worker.stderr.strip()) == (
        2,
        f"error: --grace must be from 0 to 3,600 seconds, got {float(value):g}",
    )
    cancel = run("runs", "cancel", "nosuchrun", "--wait", value)
    assert (cancel.returncode, cancel.stderr.strip()) == (
        2,
        f"error: --wait must be from 0 to 3,600 seconds, got {float(value):g}",
    )


def test_chat_warns_that_a_settings_file_in_a_recorded_workspace_is_not_read(isolated: Path) -> None:
    from masterplanner import Settings

    Settings.load().record_workspace(Path.cwd())
    (Path.cwd() / "masterplanner.toml").write_text('model = "openai:planted"\n')
    result = run("chat", "hi", "--model", "nope:x")
    assert result.returncode == 2
    warning, error = result.stderr.strip().splitlines()
    assert warning.startswith(
        f"warning: {Path.cwd() / 'masterplanner.toml'} is not read: {Path.cwd()} is the workspace of an "
        "earlier run"
    )
    assert error.startswith("error: setting 'model' (given as a flag or argument): unknown model 'nope:x'")


@pytest.mark.parametrize("command", [("plan", "Summarise the files"), ("chat", "Say hi")])
def test_a_model_server_refusing_the_key_and_echoing_it_is_said_without_it(command: tuple[str, ...]) -> None:
    """`plan` and `chat` print a provider's 401 without the key it echoes (a key of no known shape)."""
    from _model_server import Rule, model_server

    key = "zq7Hkd92LmPq0xWv3nRt"
    with model_server([Rule(match=[""], always="401")]) as server:
        env = {"OPENAI_API_KEY": key, "OPENAI_BASE_URL": server.base_url, "MASTERPLANNER_MODEL_ATTEMPTS": "1"}
        done = run(*command, "--model", "openai:gpt-4o", env=env)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "error: the model provider rejected the credentials: status_code: 401, model_name: gpt-4o, "
        "body: {'message': 'Incorrect API key provided: [secret removed]', 'type': 'invalid_request_error'}\n"
    )


def test_debug_s_traceback_shows_no_key_that_a_library_s_error_quotes() -> None:
    """Before, `--debug` printed the chained exceptions as raised: the client's own error, with
    the key the server echoed, stood whole above the redacted line."""
    from _model_server import Rule, model_server

    key = "zq7Hkd92LmPq0xWv3nRt"
    with model_server([Rule(match=[""], always="401")]) as server:
        env = {"OPENAI_API_KEY": key, "OPENAI_BASE_URL": server.base_url, "MASTERPLANNER_MODEL_ATTEMPTS": "1"}
        done = run("--debug", "chat", "Say hi", "--model", "openai:gpt-4o", env=env)
    assert (done.returncode, done.stdout) == (2, "")
    assert key not in done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    echoed = "openai.AuthenticationError: Error code: 401 - Incorrect API key provided: [secret removed]"
    assert echoed in lines
    assert lines[-1] == (
        "error: the model provider rejected the credentials: status_code: 401, model_name: gpt-4o, "
        "body: {'message': 'Incorrect API key provided: [secret removed]', 'type': 'invalid_request_error'}"
    )


def test_the_traceback_of_an_error_that_is_not_ours_is_redacted() -> None:
    """Before, a bug's traceback was Python's, printed as raised: a library error quoting a URL's
    password or a key showed it whole (a command that raises one stands in for the bug)."""
    program = (
        "from masterplanner.cli import main\n"
        "from masterplanner.cli.common import app\n"
        "@app.command('crash')\n"
        "def crash() -> None:\n"
        "    raise RuntimeError('cannot reach https://alice:Pw9sEcret@api.example/v1?api_key=Kq81secret')\n"
        "main(['crash'])\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "Pw9sEcret" not in done.stderr and "Kq81secret" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[-1] == (
        "RuntimeError: cannot reach https://alice:[secret removed]@api.example/v1?api_key=[secret removed]"
    )


def test_a_log_record_s_traceback_and_fields_are_redacted_in_json_lines_and_text() -> None:
    """Before, a JSON line's `error` (its traceback's last line) and fields were written as given:
    an error uvicorn or the web app logs with its exception may quote a key or a URL's password.
    The traceback is kept whole, redacted: text printed the message alone, JSON its last line."""
    program = (
        "import logging, sys\n"
        "from masterplanner.logs import configure_logging, log\n"
        "configure_logging(sys.argv[1])\n"
        "try:\n"
        "    raise RuntimeError('cannot reach https://alice:Pw9sEcret@api.example/v1?api_key=Kq81secret')\n"
        "except RuntimeError:\n"
        "    logging.getLogger('uvicorn.error').exception('Exception in ASGI application')\n"
        "log('serve', 'reached https://bob:Pw9sEcret@api.example', url='https://bob:Pw9sEcret@api.example')\n"
    )
    for log_format in ("text", "json"):
        done = subprocess.run(
            [sys.executable, "-c", program, log_format], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert "Pw9sEcret" not in done.stderr and "Kq81secret" not in done.stderr, done.stderr
        lines = done.stderr.splitlines()
        raised = (
            "RuntimeError: cannot reach https://alice:[secret removed]@api.example/v1?api_key="
            "[secret removed]"
        )
        traceback = [
            "Traceback (most recent call last):",
            '  File "<string>", line 5, in <module>',
            raised,
        ]
        if log_format == "text":
            assert lines == [
                "Exception in ASGI application",
                *traceback,
                "reached https://bob:[secret removed]@api.example",
            ]
            continue
        error, reached = (json.loads(line) for line in lines)
        assert (error["logger"], error["message"], error["error"], error["traceback"]) == (
            "uvicorn.error",
            "Exception in ASGI application",
            raised,
            "\n".join(traceback),
        )
        assert (reached["message"], reached["url"]) == (
            "reached https://bob:[secret removed]@api.example",
            "https://bob:[secret removed]@api.example",
        )


_CODE_THAT_READS_A_KEY = """\
import logging, os, sys
from masterplanner.cli import main
from masterplanner.cli.common import app
from masterplanner.errors import ConfigError
from masterplanner.logs import configure_logging


class Settings:
    @property
    def api_key(self) -> str:
        raise RuntimeError(f"the provider refused the key {os.environ['OPENAI_API_KEY']}")


settings = Settings()


@app.command("crash")
def crash() -> None:
    try:
        api_key = settings.api_key
    except RuntimeError as error:
        raise ConfigError("the provider refused the key") from error
    print(api_key)


if sys.argv[1] == "log":
    configure_logging("text")
    try:
        crash()
    except ConfigError:
        logging.getLogger("masterplanner.web").exception("unexpected error")
else:
    main(["--debug", "crash"])
"""


@pytest.mark.parametrize("shown_by", ["debug", "log"])
def test_debug_and_log_tracebacks_keep_their_code_lines_and_take_out_the_key(
    shown_by: str, tmp_path: Path
) -> None:
    """Before, the frame's line `api_key = settings.api_key` was taken out whole, as if it were a
    key given to a name: a traceback lost the code that raised. The key the error quotes still goes."""
    source = tmp_path / "reads_a_key.py"
    source.write_text(_CODE_THAT_READS_A_KEY)
    key = "zq7Hkd92LmPq0xWv3nRt"
    done = subprocess.run(
        [sys.executable, str(source), shown_by],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "OPENAI_API_KEY": key, "COLUMNS": "200"},
    )
    assert key not in done.stderr
    lines = done.stderr.splitlines()
    frames = [  # the library's error the command's chains, and where it was raised
        f'  File "{source}", line 20, in crash',
        "    api_key = settings.api_key",
        "              ^^^^^^^^^^^^^^^^",
        f'  File "{source}", line 11, in api_key',
        """    raise RuntimeError(f"the provider refused the key {os.environ['OPENAI_API_KEY']}")""",
        f"RuntimeError: the provider refused the key {REMOVED}",
    ]
    start = lines.index(frames[0])
    assert lines[start : start + len(frames)] == frames
    last = "masterplanner.errors.ConfigError: the provider refused the key"
    if shown_by == "log":
        assert (done.returncode, lines[:2], lines[-1]) == (
            0,
            ["unexpected error", "Traceback (most recent call last):"],
            last,
        )
    else:
        assert (done.returncode, lines[0], lines[-2:]) == (
            2,
            "Traceback (most recent call last):",
            [last, "error: the provider refused the key"],
        )


def test_records_of_loggers_not_named_and_nested_fields_are_redacted_too() -> None:
    """Before, only the masterplanner, dbos, opentelemetry and uvicorn loggers had the redacting
    handler: asyncio's "Task exception was never retrieved" or an httpx warning went to Python's
    last-resort handler with a URL's password whole (and not as JSON); a field holding a list of
    URLs was written as given."""
    program = (
        "import logging, sys\n"
        "from masterplanner.logs import configure_logging, log\n"
        "configure_logging('json')\n"
        "try:\n"
        "    raise RuntimeError('cannot reach https://alice:Pw9sEcret@api.example/v1?api_key=Kq81secret')\n"
        "except RuntimeError:\n"
        "    logging.getLogger('asyncio').error('Task exception was never retrieved', exc_info=True)\n"
        "logging.getLogger('httpx').warning('retrying https://bob:Pw9sEcret@api.example')\n"
        "log('serve', 'tried', urls=['https://bob:Pw9sEcret@api.example'],\n"
        "    seen={'at': 'x?token=Kq81secret'})\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Pw9sEcret" not in done.stderr and "Kq81secret" not in done.stderr, done.stderr
    task, retrying, tried = (json.loads(line) for line in done.stderr.splitlines())
    assert (task["logger"], task["error"]) == (
        "asyncio",
        "RuntimeError: cannot reach https://alice:[secret removed]@api.example/v1?api_key=[secret removed]",
    )
    assert (retrying["logger"], retrying["message"]) == (
        "httpx",
        "retrying https://bob:[secret removed]@api.example",
    )
    assert (tried["urls"], tried["seen"]) == (
        ["https://bob:[secret removed]@api.example"],
        {"at": "x?token=[secret removed]"},
    )


@pytest.mark.parametrize(
    ("variable", "value", "error"),
    [
        (
            "MASTERPLANNER_OTEL_ENDPOINT",
            "alice:s3cretpass@collector:4318",
            "setting 'otel_endpoint' (from MASTERPLANNER_OTEL_ENDPOINT): expected an http:// or https:// "
            "URL such as http://127.0.0.1:4318, got 'alice:[secret removed]@collector:4318'",
        ),
        (
            "MASTERPLANNER_OTEL_ENDPOINT",
            "https://alice:s3cretpass@collector:x/?token=s3cretpass",
            "setting 'otel_endpoint' (from MASTERPLANNER_OTEL_ENDPOINT): expected an http:// or https:// "
            "URL such as http://127.0.0.1:4318, got "
            "'https://alice:[secret removed]@collector:x/?token=[secret removed]'",
        ),
        (
            "MASTERPLANNER_HTTP_ALLOWED_DOMAINS",
            '["https://alice:s3cretpass@api.example"]',
            "setting 'http_allowed_domains' (from MASTERPLANNER_HTTP_ALLOWED_DOMAINS): "
            "'https://alice:[secret removed]@api.example' is not a host name; give host names such as "
            "example.com (a subdomain of one is allowed too), not URLs, ports or paths, or '*' for any host",
        ),
    ],
)
def test_a_url_setting_that_is_refused_is_echoed_without_its_password(
    variable: str, value: str, error: str
) -> None:
    """Before, the error quoted the URL as given, password and all, when it had no `scheme://`."""
    done = run("runs", "list", env={variable: value})
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"error: invalid settings: {error}\n")


def test_a_database_url_without_its_scheme_is_refused_without_its_password() -> None:
    done = run("runs", "list", env={"MASTERPLANNER_DATABASE_URL": "alice:s3cretpass@db.example/runs"})
    assert (done.returncode, done.stdout, done.stderr) == (
        2,
        "",
        "error: database URL 'alice:[secret removed]@db.example/runs' is not usable: masterplanner stores "
        "runs in SQLite (sqlite:///PATH) or PostgreSQL (postgresql://USER@HOST:PORT/DATABASE)\n",
    )


@pytest.mark.postgres
def test_dbos_s_debug_log_names_the_database_without_its_password(
    postgres_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--debug` lets DBOS log the URL it was given; SQLAlchemy's hiding left `?password=` whole.

    (The local server trusts its clients: the password is in the URL only to be hidden.)
    """
    import signal
    import threading

    url = f"{postgres_database}?password=secret123"
    monkeypatch.setenv("MASTERPLANNER_DATABASE_URL", url)
    worker = subprocess.Popen(
        [sys.executable, "-m", "masterplanner", "--debug", "worker"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    watchdog = threading.Timer(90, worker.kill)  # a worker that never logs the line ends all the same
    watchdog.start()
    logged = []
    try:
        assert worker.stderr is not None
        for line in worker.stderr:
            logged.append(line)
            if "Initializing DBOS system database" in line:
                break
    finally:
        worker.send_signal(signal.SIGINT)
        logged.append(worker.communicate(timeout=60)[1])
        watchdog.cancel()
    shown = url.replace("postgresql://", "postgresql+psycopg://").replace("secret123", "[secret removed]")
    assert f"Initializing DBOS system database with URL: {shown} (schema: dbos)\n" in logged
    assert "secret123" not in "".join(logged)


_ERROR_QUOTING_SECRETS = """\
import os, sys
from masterplanner import Settings
from masterplanner.cli import main
from masterplanner.cli.common import app
from masterplanner.errors import ConfigError


@app.command("crash")
def crash() -> None:
    settings = Settings(home=sys.argv[1], database_url="postgresql://planner:dbpass9word@db.example/runs")
    key = os.environ["OPENAI_API_KEY"]
    raise ConfigError(f"{settings.model}: signed in with {key}, then dbpass9word was refused")


main([*sys.argv[2:], "crash"])
"""


@pytest.mark.parametrize("debug", [True, False])
def test_the_error_line_shows_no_secret_the_error_quotes(debug: bool, tmp_path: Path) -> None:
    """Before, `error:` printed the message as it was: with `--debug`, the traceback's last line
    above it had the key and the database's password taken out, and the line below showed them."""
    source = tmp_path / "quotes_secrets.py"
    source.write_text(_ERROR_QUOTING_SECRETS)
    key = "zq7Hkd92LmPq0xWv3nRt"
    done = subprocess.run(
        [sys.executable, str(source), str(tmp_path / "home"), *(["--debug"] if debug else [])],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "OPENAI_API_KEY": key, "COLUMNS": "200"},
    )
    assert done.returncode == 2
    assert key not in done.stderr and "dbpass9word" not in done.stderr, done.stderr
    said = f"local: signed in with {REMOVED}, then {REMOVED} was refused"
    lines = done.stderr.splitlines()
    assert lines[-1] == f"error: {said}"
    if debug:
        assert lines[-2] == f"masterplanner.errors.ConfigError: {said}"
    else:
        assert len(lines) == 1
