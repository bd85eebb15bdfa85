"""`eval tasks`: the everyday-task suite, its checks and its report, with the scripted model."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from masterplanner import ConfigError, Settings
from masterplanner.engine import RunOptions
from masterplanner.evaluation.checks import Check, check_file, parse_check, plan_checks
from masterplanner.evaluation.results import package_code_fingerprint
from masterplanner.evaluation.tasks import CATEGORIES, EverydayTask, evaluate_tasks, load_suite
from masterplanner.tools.workspace import Workspace

FAST = RunOptions(auto_approve=True, prompt_rounds=0, retry_backoff_s=0.01)
DRAFTS = {"purpose": "prompt_creator", "output": "You are a worker. Do the step.", "repeat": True}


def sandbox_ready() -> bool:
    from masterplanner.sandbox import sandbox_problems

    return not sandbox_problems()


def plan_step(step_id: str, *deps: str, title: str = "", role: str = "writer") -> dict[str, Any]:
    return {
        "id": step_id,
        "title": title or f"Do {step_id}",
        "instruction": f"Do {step_id}.",
        "agent_role": role,
        "tools": ["write_file"],
        "depends_on": list(deps),
        "expected_output": "",
    }


def writes(step_id: str, path: str, content: str) -> list[dict[str, Any]]:
    """Script entries: step `step_id` writes `path`, then answers."""
    return [
        {
            "purpose": f"step:{step_id}",
            "tool_calls": [{"name": "write_file", "args": {"path": path, "content": content}}],
        },
        {"purpose": f"step:{step_id}", "output": f"wrote {path}"},
    ]


SUITE = {
    "tasks": [
        {
            "id": "poem",
            "category": "write",
            "task": "Write a short poem about the sea to poem.txt.",
            "checks": [
                {"exists": "poem.txt"},
                {"lines": {"path": "poem.txt", "min": 2, "max": 10}},
                {"mentions": {"path": "poem.txt", "any": ["sea", "ocean"]}},
            ],
        },
        {
            "id": "total-report",
            "category": "two-part",
            "task": "Compute the total of data.csv, then write a sentence about it to report.md.",
            "files": {"data.csv": "amount\n1.5\n2\n"},
            "checks": [{"equals_number": {"path": "report.md", "value": 3.5, "tol": 0.01}}],
        },
        {
            "id": "count",
            "category": "csv",
            "task": "Count the rows of data.csv and write the count to count.txt.",
            "files": {"data.csv": "amount\n1.5\n2\n"},
            "checks": [
                {"equals_number": {"path": "count.txt", "value": 2}},
                {"max_chars": {"path": "count.txt", "max": 20}},
            ],
        },
    ]
}
SCRIPTS: dict[str, list[dict[str, Any]]] = {
    # passes everything
    "poem": [
        {"purpose": "planner", "output": {"steps": [plan_step("write", role="poet")]}},
        *writes("write", "poem.txt", "The Sea is wide,\nthe sea is deep.\n"),
        DRAFTS,
    ],
    # right number, but the second step does not depend on the first: fails `plan dependencies`
    "total-report": [
        {"purpose": "planner", "output": {"steps": [plan_step("total"), plan_step("report")]}},
        *writes("total", "total.txt", "3.5"),
        *writes("report", "report.md", "The total is 3.50."),
        {"purpose": "aggregator", "output": "The total is 3.5."},
        DRAFTS,
    ],
    # a wrong count: fails `equals_number`
    "count": [
        {"purpose": "planner", "output": {"steps": [plan_step("count", title="Count rows")]}},
        *writes("count", "count.txt", "3"),
        DRAFTS,
    ],
}


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    path = tmp_path / "suite.json"
    path.write_text(json.dumps(SUITE))
    return path


@pytest.fixture
def scripted(write_script: Callable[..., Path]) -> Callable[[EverydayTask], str]:
    paths = {task_id: write_script(calls) for task_id, calls in SCRIPTS.items()}
    return lambda task: f"scripted:{paths[task.id]}"


async def test_the_report_of_a_small_suite(suite: Path, scripted: Callable[[EverydayTask], str]) -> None:
    seen: list[tuple[int, int, int, str | None]] = []
    report = await evaluate_tasks(
        Settings.load(),
        model_spec="scripted",
        suite=suite,
        options=FAST,
        model_for=scripted,
        progress=lambda *args: seen.append(args),
    )
    payload = report.to_json_dict()
    assert (payload["tasks"], payload["passed"], payload["pass_rate"]) == (3, 1, 0.3333)
    assert payload["by_category"] == {
        "write": {"tasks": 1, "passed": 1, "pass_rate": 1.0},
        "csv": {"tasks": 1, "passed": 0, "pass_rate": 0.0},
        "two-part": {"tasks": 1, "passed": 0, "pass_rate": 0.0},
    }
    assert payload["failed_checks"] == {"equals_number": 1, "plan_dependencies": 1}
    assert payload["failures"] == [
        {
            "id": "total-report",
            "category": "two-part",
            "failed": [{"check": "plan dependencies", "detail": "no step depends on another"}],
        },
        {
            "id": "count",
            "category": "csv",
            "failed": [{"check": "equals_number count.txt", "detail": "count.txt holds 3; wanted 2 (± 0)"}],
        },
    ]
    assert seen == [(0, 3, 0, "poem"), (1, 3, 1, "total-report"), (2, 3, 1, "count"), (3, 3, 1, None)]
    assert payload["usage"]["by_purpose"]["planner"]["calls"] == 3
    assert payload["usage"]["by_purpose"]["step"]["calls"] == 8  # step:<id> purposes counted as one
    poem = report.records[0]
    assert [check["check"] for check in poem["checks"]] == [
        "run succeeded",
        "plan valid",
        "plan roles",
        "plan titles",
        "plan instructions",
        "plan size",
        "exists poem.txt",
        "lines poem.txt",
        "mentions poem.txt",
    ]
    assert poem["status"] == "succeeded" and poem["steps"] == 1 and poem["files"] == ["poem.txt"]
    assert report.records[1]["files"] == ["data.csv", "report.md", "total.txt"]  # seeded, then written


async def test_category_and_limit_choose_tasks(suite: Path, scripted: Callable[[EverydayTask], str]) -> None:
    report = await evaluate_tasks(
        Settings.load(), model_spec="scripted", suite=suite, options=FAST, model_for=scripted, category="csv"
    )
    assert [record["id"] for record in report.records] == ["count"]
    report = await evaluate_tasks(
        Settings.load(), model_spec="scripted", suite=suite, options=FAST, model_for=scripted, limit=1
    )
    assert [record["id"] for record in report.records] == ["poem"]
    with pytest.raises(ConfigError, match="unknown category 'poems'; known: write, summarize"):
        await evaluate_tasks(Settings.load(), model_spec="scripted", suite=suite, category="poems")


async def test_a_stopped_evaluation_continues_from_its_results_file(
    suite: Path, scripted: Callable[[EverydayTask], str], tmp_path: Path, write_script: Callable[..., Path]
) -> None:
    results = tmp_path / "evals" / "tasks.jsonl"
    settings = Settings.load()
    first = await evaluate_tasks(
        settings,
        model_spec="scripted",
        suite=suite,
        options=FAST,
        model_for=scripted,
        limit=2,
        results=results,
    )
    assert first.passed == 1
    header = json.loads(results.read_text().splitlines()[0])
    assert header["model"] == "scripted" and header["code"] == package_code_fingerprint()
    assert len(results.read_text().splitlines()) == 3

    # An empty script: any task run again would fail, so the first two must come from the file.
    empty = f"scripted:{write_script([])}"
    scripts = {"count": scripted(load_suite(suite)[2])}
    report = await evaluate_tasks(
        settings,
        model_spec="scripted",
        suite=suite,
        options=FAST,
        model_for=lambda task: scripts.get(task.id, empty),
        results=results,
    )
    assert [(record["id"], record["passed"]) for record in report.records] == [
        ("poem", True),
        ("total-report", False),
        ("count", False),
    ]
    assert report.failed_checks() == {"equals_number": 1, "plan_dependencies": 1}
    with pytest.raises(ConfigError, match="measured with model='scripted', not 'other'"):
        await evaluate_tasks(settings, model_spec="other", suite=suite, options=FAST, results=results)
    await asyncio.to_thread(suite.write_text, json.dumps(SUITE | {"description": "changed"}))
    with pytest.raises(ConfigError, match="measured with suite="):
        await evaluate_tasks(settings, model_spec="scripted", suite=suite, options=FAST, results=results)


async def test_a_run_that_fails_fails_its_task(suite: Path, write_script: Callable[..., Path]) -> None:
    broken = f"scripted:{write_script([{'purpose': 'planner', 'output': {'steps': []}, 'repeat': True}])}"
    report = await evaluate_tasks(Settings.load(), model_spec=broken, suite=suite, options=FAST, limit=1)
    (failure,) = report.failures()
    assert [check["check"] for check in failure["failed"]] == [
        "run succeeded",
        "plan valid",
        "exists poem.txt",
        "lines poem.txt",
        "mentions poem.txt",
    ]
    assert failure["failed"][1]["detail"] == "the run has no plan"
    assert report.records[0]["status"] == "failed"


# ---- file checks, one kind at a time


@pytest.fixture
def workspace(tmp_path: Path) -> Workspace:
    space = Workspace(tmp_path / "space").create()
    space.write_file("poem.txt", "The SEA is wide\n\n  the seaside is near\n")
    space.write_file("blank.txt", "  \n\n")
    space.write_file("total.txt", "Total: 1,234.50 (from file2.txt)\n")
    space.write_file("copy.txt", "the sea is   WIDE\nthe seaside is near")
    return space


async def judge(workspace: Workspace, raw: dict[str, Any]) -> tuple[bool, str]:
    result = await check_file(parse_check(raw, "test"), workspace)
    return result.ok, result.detail


async def test_check_exists(workspace: Workspace) -> None:
    assert await judge(workspace, {"exists": "poem.txt"}) == (True, "")
    assert await judge(workspace, {"exists": "blank.txt"}) == (False, "blank.txt is empty")
    assert await judge(workspace, {"exists": "none.txt"}) == (
        False,
        "file 'none.txt' does not exist in the workspace",
    )


async def test_check_lines(workspace: Workspace) -> None:
    assert await judge(workspace, {"lines": {"path": "poem.txt", "min": 2, "max": 2}}) == (True, "")
    assert await judge(workspace, {"lines": {"path": "poem.txt", "min": 3}}) == (
        False,
        "poem.txt has 2 non-blank lines; wanted at least 3",
    )
    assert await judge(workspace, {"lines": {"path": "poem.txt", "min": 0, "max": 1}}) == (
        False,
        "poem.txt has 2 non-blank lines; wanted 0 to 1",
    )


async def test_check_max_chars(workspace: Workspace) -> None:
    assert await judge(workspace, {"max_chars": {"path": "total.txt", "max": 32}}) == (True, "")
    assert await judge(workspace, {"max_chars": {"path": "total.txt", "max": 10}}) == (
        False,
        "total.txt has 32 characters; at most 10 wanted",
    )


async def test_check_mentions_whole_words_in_any_case(workspace: Workspace) -> None:
    assert await judge(workspace, {"mentions": {"path": "poem.txt", "any": ["ocean", "sea"]}}) == (True, "")
    assert await judge(workspace, {"mentions": {"path": "poem.txt", "any": ["sea side", "seas"]}}) == (
        False,
        "poem.txt mentions none of: sea side, seas",
    )
    assert await judge(workspace, {"mentions": {"path": "total.txt", "any": ["file2.txt"]}}) == (True, "")


async def test_check_not_mentions(workspace: Workspace) -> None:
    assert await judge(workspace, {"not_mentions": {"path": "poem.txt", "any": ["ocean", "seas"]}}) == (
        True,
        "",
    )
    assert await judge(workspace, {"not_mentions": {"path": "poem.txt", "any": ["Wide", "near", "x"]}}) == (
        False,
        "poem.txt mentions Wide, near",
    )


async def test_check_equals_number(workspace: Workspace) -> None:
    assert await judge(workspace, {"equals_number": {"path": "total.txt", "value": 1234.5}}) == (True, "")
    assert await judge(workspace, {"equals_number": {"path": "total.txt", "value": 1234, "tol": 0.5}}) == (
        True,
        "",
    )
    # `2` of file2.txt is no number of the text
    assert await judge(workspace, {"equals_number": {"path": "total.txt", "value": 2, "tol": 0.1}}) == (
        False,
        "total.txt holds 1234.5; wanted 2 (± 0.1)",
    )
    assert await judge(workspace, {"equals_number": {"path": "poem.txt", "value": 2}}) == (
        False,
        "poem.txt holds no number; wanted 2 (± 0)",
    )


async def test_check_differs(workspace: Workspace) -> None:
    assert await judge(workspace, {"differs": {"path": "poem.txt", "from": "total.txt"}}) == (True, "")
    assert await judge(workspace, {"differs": {"path": "copy.txt", "from": "poem.txt"}}) == (
        False,
        "copy.txt is the same text as poem.txt",
    )
    ok, detail = await judge(workspace, {"differs": {"path": "copy.txt", "from": "gone.txt"}})
    assert not ok and detail.startswith("cannot read gone.txt: file 'gone.txt' does not exist")


async def test_check_runs(workspace: Workspace) -> None:
    assert await judge(workspace, {"runs": "missing.py"}) == (False, "missing.py does not exist")
    workspace.write_file("notes.rb", "puts 1")
    assert await judge(workspace, {"runs": "notes.rb"}) == (False, "notes.rb: no interpreter for .rb")
    if not sandbox_ready():
        pytest.skip("the sandbox cannot start here")
    workspace.write_file("good.py", "open('out.txt', 'w').write('made')\nprint('hi')\n")
    workspace.write_file("bad.sh", "echo oops >&2\nexit 3\n")
    assert await judge(workspace, {"runs": "good.py"}) == (True, "")
    assert await judge(workspace, {"mentions": {"path": "out.txt", "any": ["made"]}}) == (True, "")
    assert await judge(workspace, {"runs": "bad.sh"}) == (False, "bad.sh: exit code 3: oops")


def test_bad_checks_are_refused_with_their_place() -> None:
    with pytest.raises(ConfigError, match=r"here: unknown check 'contains'; known: exists, lines"):
        parse_check({"contains": "x"}, "here")
    with pytest.raises(ConfigError, match="here: a check is an object with one key"):
        parse_check({"exists": "a", "runs": "b"}, "here")
    with pytest.raises(ConfigError, match="here: exists takes a file path"):
        parse_check({"exists": ""}, "here")
    with pytest.raises(ConfigError, match=r"here: equals_number: value: is missing"):
        parse_check({"equals_number": {"path": "a"}}, "here")
    with pytest.raises(ConfigError, match=r"here: mentions: any: must not be empty"):
        parse_check({"mentions": {"path": "a", "any": []}}, "here")
    assert parse_check({"differs": {"path": "a", "from": "b"}}, "here") == Check(
        "differs", "a", {"source": "b"}
    )


# ---- plan checks


def good_plan(*steps: dict[str, Any]) -> dict[str, Any]:
    return {"task": "t", "steps": list(steps)}


def failed(task: str, plan: dict[str, Any] | None, *, needs_dependency: bool = False) -> dict[str, str]:
    return {
        result.kind: result.detail
        for result in plan_checks(task, plan, needs_dependency=needs_dependency)
        if not result.ok
    }


def test_plan_checks_pass_a_plan_that_makes_sense() -> None:
    plan = good_plan(
        plan_step("total", title="Compute the total"), plan_step("report", "total", role="report writer")
    )
    results = plan_checks("Compute the total, then write a report.", plan, needs_dependency=True)
    assert [(result.kind, result.ok) for result in results] == [
        ("plan_valid", True),
        ("plan_roles", True),
        ("plan_titles", True),
        ("plan_instructions", True),
        ("plan_size", True),
        ("plan_dependencies", True),
    ]


def test_plan_checks_find_debris() -> None:
    debris = [
        plan_step("a", role="You are a helpful assistant"),
        plan_step("b", role="data-analyst"),
        plan_step("c", role="writer 2", title="x" * 61),
        {**plan_step("d", title="Do A"), "instruction": "do a"},
    ]
    assert failed("Write a poem.", good_plan(*debris), needs_dependency=True) == {
        "plan_roles": "step a: role 'You are a helpful assistant'; step c: role 'writer 2'",
        "plan_titles": "step c: title of 61 characters; steps a and d: the same title",
        "plan_instructions": "steps a and d share an instruction",
        "plan_size": "4 steps for 1 action",
        "plan_dependencies": "no step depends on another",
    }


def test_plan_checks_of_a_missing_or_invalid_plan() -> None:
    assert failed("x", None) == {"plan_valid": "the run has no plan"}
    cyclic = good_plan(plan_step("a", "b"), plan_step("b", "a"))
    assert failed("x", cyclic) == {
        "plan_valid": "invalid plan: steps form a cycle: a -> b -> a (each depends on the next)"
    }


# ---- the shipped suite

# What a run that did each task well would leave (seed files come from the suite).
REFERENCE: dict[str, dict[str, str]] = {
    "write-poem": {"poem.txt": "Grey waves roll in,\nthe sea keeps time.\n"},
    "write-note": {"note.txt": "Call the dentist on Monday."},
    "write-fruit-list": {"fruits.txt": "apple\nbanana\npear\nplum\nmango\n"},
    "write-todo": {"todo.md": "- pack boxes\n- change address\n- book a van\n"},
    "write-invite": {"invite.txt": "Hi Sam, would you like lunch on Friday? Let me know!"},
    "summarize-article": {"summary.txt": "Honeybees pollinate many crops but colonies are dying."},
    "summarize-meeting": {"decisions.md": "- budget approved\n- launch in June\n- hire a designer\n"},
    "summarize-complaint": {"complaint.txt": "Dana's grinder came late and broken; she wants a refund."},
    "summarize-recipe": {"steps.md": "1. Mix flour, eggs, milk\n2. Rest\n3. Cook in a pan and flip\n"},
    "translate-french": {"hello_fr.txt": "Bonjour. Merci beaucoup. À demain."},
    "translate-spanish": {"greeting_es.txt": "Hola, amigo. ¿Cómo estás? Hoy hace buen tiempo."},
    "translate-german": {"sign_de.txt": "Bitte schließen Sie die Tür. Rauchen verboten."},
    "translate-colors": {"colors_fr.txt": "rouge\nvert\nbleu\n"},
    "csv-total": {"total.txt": "246.75"},
    "csv-count": {"paris.txt": "4"},
    "csv-average": {"average.txt": "78.0"},
    "csv-priciest": {"priciest.txt": "laptop"},
    "files-list": {"files.txt": "budget.csv\nletter.txt\nideas.md\n"},
    "files-describe": {"index.md": "- trip.csv: a trip plan\n- poem.txt: a poem\n- todo.md: a to-do list\n"},
    "files-count": {"count.txt": "4"},
    "files-largest": {"largest.txt": "big.txt"},
    "script-hello": {"hello.py": "print('Hello, world')\n"},
    "script-primes": {
        "primes.py": "p = [n for n in range(2, 30) if all(n % d for d in range(2, n))]\n"
        "open('primes.txt', 'w').write('\\n'.join(map(str, p)))\n"
    },
    "script-line-count": {"count.sh": "wc -l < notes.txt\n"},
    "script-fizzbuzz": {
        "fizzbuzz.py": "out = []\nfor n in range(1, 16):\n"
        "    out.append('FizzBuzz' if n % 15 == 0 else 'Fizz' if n % 3 == 0 "
        "else 'Buzz' if n % 5 == 0 else str(n))\n"
        "open('fizzbuzz.txt', 'w').write('\\n'.join(out) + '\\n')\n"
    },
    "two-part-total-report": {"report.md": "The expenses add up to 246.75 euros."},
    "two-part-summary-french": {"resume.txt": "Les abeilles pollinisent les cultures mais meurent."},
    "two-part-count-poem": {"poem.txt": "One\nTwo\nThree\nFour\n"},
    "two-part-average-verdict": {"verdict.txt": "Yes: the average, 78, is above 75."},
    "two-part-csv-list": {"csv_notes.md": "sales.csv holds monthly sales.\nstock.csv holds stock counts.\n"},
}


def test_the_shipped_suite() -> None:
    tasks = load_suite()
    assert len(tasks) >= 25
    assert {task.category for task in tasks} == set(CATEGORIES)
    assert all(task.needs_dependency == (task.category == "two-part") for task in tasks)
    assert set(REFERENCE) == {task.id for task in tasks}


@pytest.mark.parametrize("task", load_suite(), ids=lambda task: task.id)
async def test_each_shipped_task_passes_a_good_outcome_and_fails_no_outcome(
    task: EverydayTask, tmp_path: Path
) -> None:
    empty = Workspace(tmp_path / "empty").create()
    for path, content in task.files.items():
        empty.write_file(path, content)
    assert not all([(await check_file(check, empty)).ok for check in task.checks])
    done = Workspace(tmp_path / "done").create()
    for path, content in (task.files | REFERENCE[task.id]).items():
        done.write_file(path, content)
    checks = [check for check in task.checks if check.kind != "runs" or sandbox_ready()]
    results = [await check_file(check, done) for check in checks]
    assert [result.detail for result in results if not result.ok] == []


async def test_a_copied_listing_does_not_pass_for_the_count(tmp_path: Path) -> None:
    """A listing holds numbers (sizes) too: "write the number" asks for one line, the number."""
    task = next(task for task in load_suite() if task.id == "files-count")
    copied = Workspace(tmp_path).create()
    for path, content in task.files.items():
        copied.write_file(path, content)
    copied.write_file("count.txt", "a.txt\tfile\t6\nb.txt\tfile\t5\nc.csv\tfile\t4\nd.md\tfile\t8\n")
    results = [await check_file(check, copied) for check in task.checks]
    assert [result.detail for result in results if not result.ok] == [
        "count.txt has 4 non-blank lines; wanted 1 to 1"
    ]


def test_cli_prints_the_figures(suite: Path, write_script: Callable[..., Path], tmp_path: Path) -> None:
    # the CLI runs with `masterplanner run --yes` defaults: one critique round per prompt
    script = write_script([*SCRIPTS["poem"], {"purpose": "critic", "repeat": True}])
    command = [sys.executable, "-m", "masterplanner", "eval", "tasks", "--suite", str(suite)]
    command += ["--model", f"scripted:{script}", "--category", "write", "--json"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env={**os.environ})
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert (payload["tasks"], payload["passed"], payload["by_category"]) == (
        1,
        1,
        {"write": {"tasks": 1, "passed": 1, "pass_rate": 1.0}},
    )
    table = subprocess.run(
        [*command[:-1], "--limit", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert table.returncode == 0, table.stderr
    assert "│ all      │     1 │      1 │      100% │" in table.stdout


def test_per_task_without_json_is_refused_before_any_task_runs(tmp_path: Path) -> None:
    """`--per-task` shapes the JSON only: without `--json` it was taken and silently did nothing."""
    command = [sys.executable, "-m", "masterplanner", "eval", "tasks", "--per-task", "--limit", "1"]
    env = {**os.environ, "MASTERPLANNER_HOME": str(tmp_path / "home")}
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert (result.returncode, result.stdout, result.stderr) == (
        2,
        "",
        "error: --per-task has no use without --json: it adds every task's checks, plan and usage "
        "to the JSON report\n",
    )


def test_an_unknown_category_or_a_missing_suite_is_refused_before_any_progress_shows(tmp_path: Path) -> None:
    """The progress bar was drawn before the refusal, as if the evaluation had started."""
    command = [sys.executable, "-m", "masterplanner", "eval", "tasks"]
    env = {**os.environ, "MASTERPLANNER_HOME": str(tmp_path / "home")}
    said = []
    for flags in (["--category", "nope"], ["--suite", str(tmp_path / "nope.json")]):
        result = subprocess.run([*command, *flags], capture_output=True, text=True, timeout=120, env=env)
        said.append((result.returncode, result.stdout, result.stderr))
    assert said == [
        (
            2,
            "",
            "error: unknown category 'nope'; known: write, summarize, translate, csv, files, script, "
            "two-part\n",
        ),
        (2, "", f"error: task suite {tmp_path / 'nope.json'} does not exist\n"),
    ]
