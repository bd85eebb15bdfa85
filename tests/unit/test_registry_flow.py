"""A solved task's team is remembered, and a paraphrase of the task reuses it without planning."""

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
from _answers import execute_answering
from _plans import step

from masterplanner import Settings
from masterplanner.engine import Engine, RunOptions, RunRecord
from masterplanner.engine.records import briefs_json
from masterplanner.errors import ConfigError, RequestError, RunError
from masterplanner.registry import RegistryStore
from masterplanner.service import FeedbackSummary, RunService

T1 = "Read sales.csv and write the monthly totals to report.md"
T2 = "Write the monthly totals of sales.csv to report.md"


def _team_script(write_script: Callable[..., Path], *extra: dict[str, Any]) -> Path:
    plan = {"steps": [step("load", tools=[]), step("report", "load", tools=[])]}
    return write_script(
        [
            {"purpose": "planner", "output": plan, "repeat": True},
            *extra,
            {"purpose": "prompt_creator", "output": "You are careful. Do your step.", "repeat": True},
            {"purpose": "step:load", "output": "totals", "repeat": True},
            {"purpose": "step:report", "output": "report written", "repeat": True},
            {"purpose": "*", "repeat": True},
        ]
    )


async def _approve(run: Any, _catalog: Any) -> dict[str, Any]:
    return {"action": "approve"}


async def _after(engine: Engine, script: Path, earlier: str, task: str) -> tuple[str, RunRecord]:
    """Run `earlier` to success, then `task` (which may reuse its team): the first's id, the second's end."""
    first = engine.create_run(earlier, model=f"scripted:{script}", options=RunOptions(prompt_rounds=0))
    assert (await execute_answering(engine, first.id, review=_approve)).status == "succeeded"
    second = engine.create_run(task, model=f"scripted:{script}", options=RunOptions(prompt_rounds=0))
    final = await execute_answering(engine, second.id, review=_approve)
    assert final.status == "succeeded", final.error
    return first.id, final


def _ready(engine: Engine, run_id: str) -> dict[str, Any]:
    return next(e.data for e in engine.store.events(run_id) if e.kind == "plan_ready")


async def test_a_paraphrase_reuses_the_stored_team(isolated: Path, write_script: Callable[..., Path]) -> None:
    adapted = {
        "steps": [
            {"title": "load sales", "instruction": "Read sales.csv.", "expected_output": "monthly totals"},
            {
                "title": "report",
                "instruction": "Write the totals to report.md.",
                "expected_output": "report.md",
            },
        ]
    }
    script = _team_script(write_script, {"purpose": "adapter", "output": adapted})
    settings = Settings.load()
    engine = Engine(settings)
    reviewed: list[Any] = []

    async def review(run: Any, _catalog: Any) -> dict[str, Any]:
        reviewed.append(run)
        return {"action": "approve"}

    try:
        first = engine.create_run(T1, model=f"scripted:{script}", options=RunOptions(prompt_rounds=0))
        assert (await execute_answering(engine, first.id, review=review)).status == "succeeded"
        registry = RegistryStore(settings.database_url)
        assert [c.id for c in registry.list_cohorts()] == [first.id]
        assert sorted(a.id for a in registry.list_agents()) == [f"{first.id}.load", f"{first.id}.report"]
        assert registry.get_agent(f"{first.id}.load").stats.successes == 1

        second = engine.create_run(T2, model=f"scripted:{script}", options=RunOptions(prompt_rounds=0))
        final = await execute_answering(engine, second.id, review=review)
        assert final.status == "succeeded", final.error
        usage = engine.report(second.id)["usage"]["by_purpose"]
        # one call adapts the stored plan's wording to the new task; no planning, no prompt writing
        assert set(usage) == {"adapter", "step:load", "step:report"}
        assert usage["adapter"]["calls"] == 1
        ready = _ready(engine, second.id)
        assert ready["reused_cohort"] == first.id and ready["similarity"] >= 0.6
        assert ready["adaptation"] == "model"
        assert [s.instruction for s in final.plan.steps] == [
            "Read sales.csv.",
            "Write the totals to report.md.",
        ]
        assert [s.depends_on for s in final.plan.steps] == [[], ["load"]]
        assert final.plan.task == T2
        assert reviewed[1].agents["load"].reused_from == first.id  # the review sees what was reused
        assert registry.get_agent(f"{first.id}.load").stats.uses == 2
        assert len(registry.list_cohorts()) == 2
    finally:
        engine.close()


async def test_a_repeat_with_other_parameters_needs_no_adaptation_call(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    script = write_script(
        [
            {
                "purpose": "planner",
                "output": {
                    "steps": [
                        {**step("load", tools=[]), "instruction": "Read sales.csv and total it by month."},
                        {**step("report", "load", tools=[]), "instruction": "Write the totals to report.md."},
                    ]
                },
            },
            {"purpose": "prompt_creator", "output": "You read sales.csv carefully.", "repeat": True},
            {"purpose": "*", "output": "done", "repeat": True},
        ]
    )
    engine = Engine(Settings.load())
    try:
        first = engine.create_run(T1, model=f"scripted:{script}", options=RunOptions(prompt_rounds=0))
        assert (await execute_answering(engine, first.id, review=_approve)).status == "succeeded"
        task = "Read orders.csv and write the monthly totals to summary.md"
        second = engine.create_run(task, model=f"scripted:{script}", options=RunOptions(prompt_rounds=0))
        final = await execute_answering(engine, second.id, review=_approve)
        assert final.status == "succeeded", final.error
        assert set(engine.report(second.id)["usage"]["by_purpose"]) == {"step:load", "step:report"}
        assert _ready(engine, second.id)["adaptation"] == "parameters"
        assert [s.instruction for s in final.plan.steps] == [
            "Read orders.csv and total it by month.",
            "Write the totals to summary.md.",
        ]
        assert final.agents["load"].prompt == "You read orders.csv carefully."
    finally:
        engine.close()


async def test_quoted_text_the_plan_wrote_without_its_quotes_is_swapped_too(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    write = {
        **step("write", tools=["write_file"]),
        "instruction": "Write the text hello world to greeting.txt.",
        "expected_output": "greeting.txt containing hello world",
    }
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [write]}},
            {"purpose": "prompt_creator", "output": "You write the words hello world exactly."},
            {"purpose": "*", "output": "done", "repeat": True},
        ]
    )
    engine = Engine(Settings.load())
    try:
        _, final = await _after(
            engine, script, 'Write "hello world" to greeting.txt', 'Write "goodbye moon" to greeting.txt'
        )
        assert _ready(engine, final.id)["adaptation"] == "parameters"
        assert set(engine.report(final.id)["usage"]["by_purpose"]) == {"step:write"}
        [written] = final.plan.steps
        assert (written.instruction, written.expected_output) == (
            "Write the text goodbye moon to greeting.txt.",
            "greeting.txt containing goodbye moon",
        )
        assert final.agents["write"].prompt == "You write the words goodbye moon exactly."
    finally:
        engine.close()


async def test_a_number_the_plan_wrote_in_words_is_adapted_by_the_model(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    top = {
        **step("top"),
        "instruction": "Read products.csv and list the top five products by revenue.",
        "expected_output": "a list of 5 products",
    }
    adapted = {
        "title": "Pick the top products",
        "instruction": "Read products.csv and list the top 12 products by revenue.",
        "expected_output": "a list of 12 products",
    }
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [top]}},
            {"purpose": "prompt_creator", "output": "You list exactly 5 products."},
            {"purpose": "adapter", "output": {"steps": [adapted]}},
            {"purpose": "*", "output": "done", "repeat": True},
        ]
    )
    engine = Engine(Settings.load())
    try:
        first, final = await _after(
            engine,
            script,
            "List the top 5 products in products.csv",
            "List the top 12 products in products.csv",
        )
        # 5 is in the expected output and the prompt, but the instruction says "five": swapping
        # the 5s alone would run the old task, so the adapter rewrites the step
        ready = _ready(engine, final.id)
        assert (ready["reused_cohort"], ready["adaptation"]) == (first, "model")
        usage = engine.report(final.id)["usage"]["by_purpose"]
        assert set(usage) == {"adapter", "step:top"} and usage["adapter"]["calls"] == 1
        assert [s.instruction for s in final.plan.steps] == [adapted["instruction"]]
    finally:
        engine.close()


async def test_an_unusable_adaptation_plans_afresh_with_the_team_as_an_example(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    wrong = {"steps": [{"title": "one", "instruction": "Only one step.", "expected_output": "x"}]}
    script = _team_script(write_script, {"purpose": "adapter", "output": wrong, "repeat": True})
    engine = Engine(Settings.load())
    try:
        first = engine.create_run(T1, model=f"scripted:{script}", options=RunOptions(prompt_rounds=0))
        assert (await execute_answering(engine, first.id, review=_approve)).status == "succeeded"
        second = engine.create_run(T2, model=f"scripted:{script}", options=RunOptions(prompt_rounds=0))
        done = await execute_answering(engine, second.id, review=_approve)
        assert done.status == "succeeded", (done.error, engine.report(second.id)["steps"])
        ready = _ready(engine, second.id)
        assert ready["reuse_failed"].startswith(f"cohort {first.id} could not be adapted")
        assert "planner" in engine.report(second.id)["usage"]["by_purpose"]
        assert ready["hints"] == [T1]
    finally:
        engine.close()


async def test_a_team_stored_after_its_copies_broke_is_reused(
    isolated: Path, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MASTERPLANNER_EMBEDDER", "none")
    script = _team_script(write_script)
    settings = Settings.load()
    engine = Engine(settings)
    registry = RegistryStore(settings.database_url)

    async def run_once() -> tuple[str, dict[str, Any], set[str]]:
        run = engine.create_run(T1, model=f"scripted:{script}", options=RunOptions(prompt_rounds=0))
        done = await execute_answering(engine, run.id, review=_approve)
        assert done.status == "succeeded", done.error
        return run.id, _ready(engine, run.id), set(engine.report(run.id)["usage"]["by_purpose"])

    try:
        first, _, _ = await run_once()
        newest = first
        for _ in range(2):  # each reuse stores the team again: three cohorts of one team
            run_id, ready, _ = await run_once()
            assert ready["reused_cohort"] == newest  # of equal ones, the newest
            assert set(registry.get_cohort(run_id).agents.values()) == {f"{first}.load", f"{first}.report"}
            newest = run_id
        registry.delete_agent(f"{first}.report")
        fourth, ready, purposes = await run_once()
        assert "reused_cohort" not in ready and "planner" in purposes
        assert ready["hints"] == [T1]  # the task once, not once per stored copy
        newest = fourth
        for _ in range(2):  # before, every later run planned afresh too, for ever
            run_id, ready, purposes = await run_once()
            assert ready["reused_cohort"] == newest
            assert purposes == {"step:load", "step:report"}
            assert registry.get_cohort(run_id).agents == registry.get_cohort(fourth).agents
            newest = run_id
    finally:
        engine.close()


async def test_a_working_team_below_three_that_cannot_run_is_reused(
    isolated: Path, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MASTERPLANNER_EMBEDDER", "none")
    script = _team_script(write_script)
    settings = Settings.load()
    engine = Engine(settings)
    registry = RegistryStore(settings.database_url)
    try:
        first = engine.create_run(T1, model=f"scripted:{script}", options=RunOptions(prompt_rounds=0))
        assert (await execute_answering(engine, first.id, review=_approve)).status == "succeeded"
        team = registry.get_cohort(first.id)
        for n in range(3):  # newer teams for the same task whose agents are gone
            broken = {step_id: f"gone{n}.{step_id}" for step_id in team.agents}
            registry.put_cohort(team.model_copy(update={"id": f"{first.id}-{n}", "agents": broken}))
        assert [c.id for c, _ in registry.similar_cohorts(T1, 4)][-1] == first.id
        second = engine.create_run(T1, model=f"scripted:{script}", options=RunOptions(prompt_rounds=0))
        assert (await execute_answering(engine, second.id, review=_approve)).status == "succeeded"
        assert _ready(engine, second.id)["reused_cohort"] == first.id
        assert "planner" not in engine.report(second.id)["usage"]["by_purpose"]
    finally:
        engine.close()


@pytest.mark.parametrize("embedder", ["smollm2", "none"])  # with none, by the words alone
async def test_a_step_like_a_stored_agent_reuses_it_outside_its_team(
    isolated: Path, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, embedder: str
) -> None:
    monkeypatch.setenv("MASTERPLANNER_EMBEDDER", embedder)
    report = {
        **step("report", tools=[]),
        "title": "Write the quarterly report",
        "agent_role": "report writer",
        "instruction": "Write the quarterly report with the totals to report.md.",
    }
    scripts = [
        write_script(
            [
                {"purpose": "planner", "output": {"steps": [step(first_step, tools=[]), report]}},
                {"purpose": "prompt_creator", "output": "You write reports.", "repeat": True},
                {"purpose": "*", "output": "done", "repeat": True},
            ]
        )
        for first_step in ("fetch", "translate")
    ]
    engine = Engine(Settings.load())
    try:
        first = engine.create_run(T1, model=f"scripted:{scripts[0]}", options=RunOptions(prompt_rounds=0))
        assert (await execute_answering(engine, first.id, review=_approve)).status == "succeeded"
        other = "Translate the German invoices into English and list their amounts"
        second = engine.create_run(other, model=f"scripted:{scripts[1]}", options=RunOptions(prompt_rounds=0))
        final = await execute_answering(engine, second.id, review=_approve)
        assert final.status == "succeeded", final.error
        ready = _ready(engine, second.id)
        assert "reused_cohort" not in ready
        assert ready["reused_agents"] == {"report": f"{first.id}.report"}
        assert (
            engine.report(second.id)["usage"]["by_purpose"]["prompt_creator"]["calls"] == 1
        )  # translate only
        assert final.agents["report"].agent_id == f"{first.id}.report"
        assert final.agents["translate"].prompt == "You write reports."
        assert final.agents["translate"].agent_id is None
    finally:
        engine.close()


async def test_the_person_swaps_a_reused_agent_for_a_fresh_one(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    from masterplanner.review import parse_review_yaml, render_review_yaml

    script = _team_script(
        write_script,
        {
            "purpose": "adapter",
            "output": {
                "steps": [
                    {"title": "load", "instruction": "Load.", "expected_output": "x"},
                    {"title": "report", "instruction": "Report.", "expected_output": "y"},
                ]
            },
        },
    )
    engine = Engine(Settings.load())
    shown: list[str] = []

    async def swap(run: Any, catalog: Any) -> dict[str, Any]:
        text = render_review_yaml(run.plan, briefs_json(run.agents))
        shown.append(text)
        reused = f"agent: reused {run.agents['report'].agent_id} from run {first.id}"
        edit = parse_review_yaml(text.replace(reused, "agent: fresh"), catalog, briefs_json(run.agents))
        return {"action": "approve", "plan": edit.plan.to_json_dict(), "agents": edit.agents}

    try:
        first = engine.create_run(T1, model=f"scripted:{script}", options=RunOptions(prompt_rounds=0))
        assert (await execute_answering(engine, first.id, review=_approve)).status == "succeeded"
        second = engine.create_run(T2, model=f"scripted:{script}", options=RunOptions(prompt_rounds=0))
        final = await execute_answering(engine, second.id, review=swap)
        assert final.status == "succeeded", final.error
        assert f"agent: reused {first.id}.report from run {first.id}" in shown[0]
        assert final.agents["report"].prompt == "You are careful. Do your step."
        assert final.agents["report"].agent_id is None
        assert final.agents["load"].agent_id == f"{first.id}.load"
        assert engine.report(second.id)["usage"]["by_purpose"]["prompt_creator"]["calls"] == 1
    finally:
        engine.close()


async def test_remember_runs_ask_stores_only_what_the_person_accepts(
    isolated: Path, write_script: Callable[..., Path], monkeypatch: Any
) -> None:
    monkeypatch.setenv("MASTERPLANNER_REMEMBER_RUNS", "ask")
    script = _team_script(write_script)
    settings = Settings.load()
    engine = Engine(settings)
    answers = iter([False, True])
    asked: list[str] = []

    async def confirm(run: Any) -> bool:
        asked.append(run.id)
        return next(answers)

    try:
        registry = RegistryStore(settings.database_url)
        declined = engine.create_run(T1, model=f"scripted:{script}", options=RunOptions(prompt_rounds=0))
        await execute_answering(engine, declined.id, review=_approve, confirm_remember=confirm)
        assert registry.list_cohorts() == [] and registry.list_agents() == []
        assert any(e.kind == "team_not_stored" for e in engine.store.events(declined.id))
        accepted = engine.create_run(T1, model=f"scripted:{script}", options=RunOptions(prompt_rounds=0))
        await execute_answering(engine, accepted.id, review=_approve, confirm_remember=confirm)
        assert [c.id for c in registry.list_cohorts()] == [accepted.id]
        assert any(e.kind == "team_stored" for e in engine.store.events(accepted.id))
        assert asked == [declined.id, accepted.id]
        unasked = engine.create_run(T1, model=f"scripted:{script}", options=RunOptions(prompt_rounds=0))
        done = await execute_answering(engine, unasked.id, review=_approve)  # the question stays open
        assert done.status == "succeeded"
        assert len(registry.list_cohorts()) == 1
        service = RunService(settings)
        try:
            [question] = await service.pending(unasked.id)
            assert (question.kind, question.payload["agents"]) == ("remember", 2)
            await service.answer_plainly(question.id, approve=True, by="cli@later")  # another process, later
            assert sorted(c.id for c in registry.list_cohorts()) == sorted([accepted.id, unasked.id])
            kinds = [e.kind for e in engine.store.events(unasked.id)]
            assert kinds[-3:] == ["request_opened", "request_answered", "team_stored"]
            with pytest.raises(RequestError, match=f"request {question.id} is already answered"):
                await service.answer_plainly(question.id, approve=False, by="cli@again")
        finally:
            service.close()
    finally:
        engine.close()


def test_a_low_rating_teaches_lessons_that_reach_the_next_prompt(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("report", tools=[])]}},
            {"purpose": "prompt_creator", "output": "You write reports.", "repeat": True},
            {"purpose": "step:report", "output": "a report without numbers", "repeat": True},
            {
                "purpose": "feedback",
                "output": {"lessons": [{"step": "report", "lesson": "Always include the totals."}]},
            },
            {"purpose": "*", "repeat": True},
        ]
    )

    def mp(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "masterplanner", *args], capture_output=True, text=True, timeout=120
        )

    first = json.loads(mp("run", T1, "--model", f"scripted:{script}", "--yes", "--json").stdout)
    rated = mp(
        "feedback",
        first["run_id"],
        "--rating",
        "1",
        "--comment",
        "no numbers",
        "--model",
        f"scripted:{script}",
        "--json",
    )
    assert rated.returncode == 0, rated.stderr
    agent_id = f"{first['run_id']}.report"
    assert json.loads(rated.stdout) == {
        "rated_agents": [agent_id],
        "cohort_rated": True,
        "lessons": {agent_id: ["Always include the totals."]},
    }
    shown = json.loads(mp("agents", "show", agent_id, "--json").stdout)
    assert shown["lessons"] == ["Always include the totals."]
    assert shown["mean_rating"] == 1.0
    second = json.loads(mp("run", T2, "--model", f"scripted:{script}", "--yes", "--json").stdout)
    engine = Engine(Settings.load())
    try:
        prompt = engine.store.get_run(second["run_id"]).agents["report"].prompt
    finally:
        engine.close()
    assert prompt.endswith("Lessons from earlier runs:\n- Always include the totals.")


_MP = [sys.executable, "-m", "masterplanner"]


def _mp(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "masterplanner", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )


def _rated_run(
    write_script: Callable[..., Path], steps: list[dict[str, Any]], analysis: dict[str, Any]
) -> str:
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": steps}},
            {"purpose": "prompt_creator", "output": "You summarise.", "repeat": True},
            {"purpose": "feedback", **analysis, "repeat": True},
            *({"purpose": f"step:{item['id']}", "output": "ten pages", "repeat": True} for item in steps),
            {"purpose": "*", "repeat": True},
        ]
    )
    run = json.loads(
        _mp("run", "Summarise notes.txt", "--model", f"scripted:{script}", "--yes", "--json").stdout
    )
    assert run["status"] == "succeeded", run["error"]
    return str(run["run_id"])


@pytest.mark.parametrize(
    "analysis",
    [
        {"output": {"lessons": []}},
        # a word, a copy of the step's own wording, a step that does not exist: nothing is learned
        {
            "output": {
                "lessons": [
                    {"step": "summary", "lesson": "x"},
                    {"step": "summary", "lesson": "Summary of notes.txt"},
                    {"step": "elsewhere", "lesson": "Keep it under 100 words."},
                ]
            }
        },
        {"output": "no JSON here"},  # the analysis fails: the person's words still teach
        # the analysis read the step's output and repeats the key it printed: never a lesson
        {
            "output": {
                "lessons": [
                    {"step": "summary", "lesson": "Do not print the key sk-live-ABCDEFGHIJKLMNOP1234"}
                ]
            }
        },
        # or a key of no known shape, the value of a secret variable here (WEATHER_API_KEY below)
        {"output": {"lessons": [{"step": "summary", "lesson": "Do not print the key zq7Hkd92LmPq0xWv3nRt"}]}},
    ],
    ids=["no-lessons", "junk-lessons", "analysis-fails", "secret-lessons", "variable-lessons"],
)
def test_a_low_rating_with_a_comment_teaches_the_comment_when_the_analysis_gives_nothing_usable(
    isolated: Path,
    write_script: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
    analysis: dict[str, Any],
) -> None:
    monkeypatch.setenv("WEATHER_API_KEY", "zq7Hkd92LmPq0xWv3nRt")
    summary = {**step("summary", tools=[]), "instruction": "Summarise notes.txt.", "agent_role": "summarizer"}
    run_id = _rated_run(write_script, [summary], analysis)
    comment = "The summary was far too long"
    rated = _mp("feedback", run_id, "--rating", "1", "--comment", comment, "--json")
    assert rated.returncode == 0, rated.stderr
    agent_id = f"{run_id}.summary"
    lesson = 'A person rated an earlier run 1/5 and said: "The summary was far too long"'
    assert json.loads(rated.stdout)["lessons"] == {agent_id: [lesson]}
    shown = _mp("agents", "show", agent_id)
    assert shown.returncode == 0, shown.stderr
    assert f"lesson {lesson}" in shown.stdout
    assert json.loads(_mp("agents", "show", agent_id, "--json").stdout)["lessons"] == [lesson]


def test_feedback_says_in_a_terminal_that_it_waits_on_the_model(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    # the embedded model took 46 s over a rating of 2 while the terminal showed nothing at all
    import pexpect

    summary = {**step("summary", tools=[]), "instruction": "Summarise notes.txt."}
    run_id = _rated_run(write_script, [summary], {"output": {"lessons": []}, "delay_s": 3})
    child = pexpect.spawn(
        sys.executable,
        ["-m", "masterplanner", "feedback", run_id, "--rating", "2"],
        env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40"},
        dimensions=(40, 120),
        encoding="utf-8",
        timeout=60,
    )
    waited = child.expect([f"rating run {run_id} and asking its model what went wrong", "and the team"])
    child.expect(pexpect.EOF)
    child.close()
    assert (waited, child.exitstatus) == (0, 0), child.before
    high = _rated_run(write_script, [summary], {"output": {"lessons": []}})
    quiet = _mp("feedback", high, "--rating", "4")  # no terminal: nothing drawn, the result alone
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "rated 1 agent and the team\n")


def test_feedback_reports_only_the_lessons_it_added_and_never_a_secret(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    summary = {**step("summary", tools=[]), "instruction": "Summarise notes.txt.", "agent_role": "summarizer"}
    lessons = [
        {"step": "summary", "lesson": "Do not print the key sk-live-ABCDEFGHIJKLMNOP1234 in the summary"},
        {"step": "summary", "lesson": "Keep it under 100 words."},
    ]
    analysis = {"output": {"lessons": lessons}}
    first = _rated_run(write_script, [summary], analysis)
    agent_id = f"{first}.summary"
    rated = json.loads(_mp("feedback", first, "--rating", "1", "--json").stdout)
    assert rated["lessons"] == {agent_id: ["Keep it under 100 words."]}
    # a later run of the same team, rated with the same analysis: the agent learns nothing new
    second = _rated_run(write_script, [summary], analysis)
    again = _mp("feedback", second, "--rating", "1", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {"rated_agents": [agent_id], "cohort_rated": True, "lessons": {}}
    shown = json.loads(_mp("agents", "show", agent_id, "--json").stdout)
    assert shown["lessons"] == ["Keep it under 100 words."]
    exported = isolated / "agents.jsonl"
    assert _mp("agents", "export", str(exported)).returncode == 0
    assert "sk-live" not in exported.read_text() and "Keep it under 100 words." in exported.read_text()


def test_a_rating_the_run_refuses_exits_1_and_a_rating_out_of_range_exits_2(
    write_script: Callable[..., Path],
) -> None:
    """The README's exit codes: a call the run's state refuses is 1, an input no run takes is 2."""
    script = write_script([{"purpose": "*", "repeat": True}])
    run_id = _mp("run", "x", "-m", f"scripted:{script}", "--yes", "--detach").stdout.strip()
    said = [_mp("feedback", run_id, "--rating", "3")]
    assert _mp("runs", "cancel", run_id).returncode == 0  # no process holds it: cancelled at once
    said += [_mp("feedback", run_id, "--rating", "3"), _mp("feedback", run_id, "--rating", "9")]
    assert [(done.returncode, done.stderr) for done in said] == [
        (1, f"error: run {run_id} is planning: a run is rated once it has ended\n"),
        (1, f"error: run {run_id} was cancelled before any step ran: there is nothing to rate\n"),
        (2, "error: the rating must be a whole number from 1 to 5, got 9\n"),
    ]


def test_the_comment_teaches_only_the_steps_it_names(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    steps = [step("load", tools=[]), {**step("report", "load", tools=[]), "agent_role": "report writer"}]
    run_id = _rated_run(write_script, steps, {"output": {"lessons": []}})
    named = _mp(
        "feedback", run_id, "--rating", "2", "--comment", "The report writer left out the totals", "--json"
    )
    lesson = 'A person rated an earlier run 2/5 and said: "The report writer left out the totals"'
    assert json.loads(named.stdout)["lessons"] == {f"{run_id}.report": [lesson]}
    again = _mp("feedback", run_id, "--rating", "1", "--comment", "Useless")
    assert again.returncode == 1  # a run is rated once: its agents' ratings are not counted twice
    assert again.stderr.startswith(f"error: run {run_id} was rated 2 already (by cli@")
    # each later rating is of a run of its own (it may reuse the first run's agents)
    second = _rated_run(write_script, steps, {"output": {"lessons": []}})
    unnamed = json.loads(_mp("feedback", second, "--rating", "1", "--comment", "Useless", "--json").stdout)
    lesson = 'A person rated an earlier run 1/5 and said: "Useless"'
    assert len(unnamed["rated_agents"]) == 2
    assert unnamed["lessons"] == {agent: [lesson] for agent in unnamed["rated_agents"]}
    third = _rated_run(write_script, steps, {"output": {"lessons": []}})
    assert json.loads(_mp("feedback", third, "--rating", "1", "--json").stdout)["lessons"] == {}


async def test_a_small_models_next_task_carries_nothing_of_the_one_before(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    # Issue 14: in one home the embedded model planned a summary with the haiku team as its
    # example and wrote about the sun. The autumn haiku is close to the sea haiku (similarity
    # 0.96, its step to the poet 0.89), so the team and the poet are found; neither may be used.
    def script(prompt: str) -> Path:
        planner = {
            "purpose": "planner",
            "output": {"steps": [{"title": "Write the haiku", "agent_role": "poet"}]},
        }
        prompts = {"purpose": "prompt_creator", "output": prompt, "repeat": True}
        calls = [planner, prompts, {"purpose": "*", "repeat": True}]
        return write_script(None, raw=json.dumps({"small_model": True, "calls": calls}))

    settings = Settings.load()
    engine = Engine(settings)
    try:
        first = engine.create_run(
            "Write a haiku about the sea to haiku.txt",
            model=f"scripted:{script('You are a poet. Write a haiku about the sea.')}",
            options=RunOptions(prompt_rounds=0),
        )
        done = await execute_answering(engine, first.id, review=_approve)
        assert done.status == "succeeded", (done.error, engine.report(first.id)["steps"])
        second = engine.create_run(
            "Write a haiku about autumn leaves to leaves.txt",
            model=f"scripted:{script('You are a poet. Write the haiku your step asks for.')}",
            options=RunOptions(prompt_rounds=0),
        )
        done = await execute_answering(engine, second.id, review=_approve)
        assert done.status == "succeeded", (done.error, engine.report(second.id)["steps"])
        ready = _ready(engine, second.id)
        assert "reused_cohort" not in ready
        assert ready["reuse_failed"] == (
            f"cohort {first.id} could not be adapted: a small model reuses a stored team only for the "
            "same task, or one that differs only in file names, numbers, URLs or quoted text: it plans "
            "a reworded task afresh rather than rewrite another task's plan"
        )
        first_agents = engine.store.get_run(first.id).agents
        assert "about the sea" in json.dumps(briefs_json(first_agents))  # what could leak
        second_agents = briefs_json(engine.store.get_run(second.id).agents)
        shown = json.dumps([engine.report(second.id)["plan"], second_agents])
        assert "sea" not in shown and "haiku.txt" not in shown
        assert "autumn leaves to leaves.txt" in shown
    finally:
        engine.close()


def _a_haiku_run_then_its_review_again(
    write_script: Callable[..., Path], second_task: str
) -> tuple[str, str]:
    """A small model's run of a haiku task, stored; then `second_task`'s review, approved at the
    terminal: the first run's id and what the second printed on stderr."""
    calls = [
        {"purpose": "planner", "output": {"steps": [{"title": "Write the haiku", "agent_role": "poet"}]}},
        {"purpose": "prompt_creator", "output": "You are a poet.", "repeat": True},
        {"purpose": "*", "repeat": True},
    ]
    script = write_script(None, raw=json.dumps({"small_model": True, "calls": calls}))
    model = f"scripted:{script}"
    first = _mp("run", "Write a haiku about the sea to haiku.txt", "--model", model, "--yes", "--json")
    assert first.returncode == 0, first.stderr
    second = subprocess.run(
        [*_MP, "run", second_task, "--model", model, "--rounds", "0"],
        input="a\n",
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert second.returncode == 0, second.stderr
    return json.loads(first.stdout)["run_id"], second.stderr


def test_the_review_says_why_a_small_model_did_not_reuse_the_stored_team(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    # A person ran "summarise the files in this folder" with the embedded model, then
    # "summarize the files in this directory": the stored team was found (similarity 1.0) but
    # planned afresh, and nothing in the terminal said so, though the README promises reuse.
    first_id, said = _a_haiku_run_then_its_review_again(
        write_script, "Write a haiku about autumn leaves to leaves.txt"
    )
    reason = (
        f"stored team not reused: cohort {first_id} could not be adapted: a small model reuses a stored "
        "team only for the same task, or one that differs only in file names, numbers, URLs or quoted "
        "text: it plans a reworded task afresh rather than rewrite another task's plan; planned afresh"
    )
    assert reason in said.splitlines(), said


def test_the_review_says_which_stored_team_it_reuses_and_an_estimate_says_what_it_shows(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    # The review marked each agent reused but said nothing of the team (only `runs show` did), and
    # its estimate explained "tokens and time" it did not show (no model call measured them yet).
    first_id, said = _a_haiku_run_then_its_review_again(
        write_script, "Write a haiku about the sea to poem.txt"
    )
    lines = said.splitlines()
    assert f"reusing the team of run {first_id} (similarity 1.0, adapted: parameters)" in lines, said
    (estimate,) = [line for line in lines if line.startswith("estimate for the steps:")]
    assert estimate == (
        "estimate for the steps: about 2 model calls, cost $0.00 (one request a step, two with tools; "
        "tokens and time are estimated once this run has made a model call)"
    )


async def test_a_run_is_rated_once_all_or_nothing_and_only_after_something_ran(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    slow = {"purpose": "feedback", "output": {"lessons": []}, "delay_s": 0.5, "repeat": True}
    model = f"scripted:{_team_script(write_script, slow)}"
    service = RunService(Settings.load())
    try:
        done = await service.create(T1, model=model, options=RunOptions(auto_approve=True, prompt_rounds=0))
        assert (await service.execute(done.id)).status == "succeeded"
        agents = [f"{done.id}.load", f"{done.id}.report"]
        # not ended, or ended before any step ran: nothing to rate
        waiting = await service.create(T1, model=model, options=RunOptions(prompt_rounds=0))
        with pytest.raises(RunError, match=f"run {waiting.id} is planning: a run is rated once it has ended"):
            await service.feedback(waiting.id, rating=1)
        await service.cancel(waiting.id)
        with pytest.raises(RunError, match="was cancelled before any step ran: there is nothing to rate"):
            await service.feedback(waiting.id, rating=1)
        # text that is not UTF-8 is refused before anything is stored
        with pytest.raises(ConfigError, match="the comment is not valid UTF-8 text"):
            await service.feedback(done.id, rating=1, comment="bad \udcff output")

        # two ratings at once: one is applied, the other refused, each agent rated once
        outcomes = await asyncio.gather(
            service.feedback(done.id, rating=1, comment="the report step left out May", by="a"),
            service.feedback(done.id, rating=2, comment="the report was bad", by="b"),
            return_exceptions=True,
        )
        [summary] = [item for item in outcomes if isinstance(item, FeedbackSummary)]
        [refused] = [item for item in outcomes if isinstance(item, RunError)]
        assert "already" in str(refused) and "a run is rated once" in str(refused)
        registry = RegistryStore(Settings.load().database_url)
        try:
            assert [registry.get_agent(agent).stats.ratings for agent in agents] == [1, 1]
            # the comment named the report step: only its agent learns
            [lesson] = registry.get_agent(agents[1]).lessons
            assert registry.get_agent(agents[0]).lessons == []
            assert lesson.endswith(('bad"', 'May"'))
        finally:
            registry.close()
        assert summary.rated_agents == agents
        audit = [event for event in await service.events(done.id) if event.kind == "run_rated"]
        assert len(audit) == 1
        # a rating above the low mark asks no model: one that cannot be used is not needed
        other = await service.create(T1, model=model, options=RunOptions(auto_approve=True, prompt_rounds=0))
        assert (await service.execute(other.id)).status == "succeeded"
        liked = await service.feedback(other.id, rating=5, model="anthropic:claude-none")
        assert liked.rated_agents == agents and liked.lessons == {}  # the first run's agents, reused
    finally:
        service.close()


async def test_an_agent_reused_by_two_steps_is_rated_once(isolated: Path) -> None:
    from masterplanner.feedback import give_feedback
    from masterplanner.plan import Plan
    from masterplanner.registry import AgentSpec

    settings = Settings.load()
    settings.ensure_home()
    registry = RegistryStore(settings.database_url)
    try:
        registry.put_agent(AgentSpec(id="shared", name="writer", role="writer", system_prompt="You write."))
        plan = Plan.model_validate({"task": "t", "steps": [step("a", tools=[]), step("b", "a", tools=[])]})
        agents = {"a": {"agent_id": "shared"}, "b": {"agent_id": "shared"}}
        done = await give_feedback(registry, run_id="r", plan=plan, agents=agents, outputs={}, rating=4)
        assert done.rated_agents == ["shared"]
        assert registry.get_agent("shared").stats.ratings == 1
    finally:
        registry.close()


KEY = "sk-live-ABCDEFGHIJKLMNOP1234"
PLAIN_KEY = "zq7Hkd92LmPq0xWv3nRt"
WEATHER = "Fetch the weather and write it to forecast.txt"


def _weather_script(write_script: Callable[..., Path], instruction: str, prompt: str) -> Path:
    plan = {"steps": [{**step("call", tools=[]), "instruction": instruction, "agent_role": "integrator"}]}
    return write_script(
        [
            {"purpose": "planner", "output": plan, "repeat": True},
            {"purpose": "prompt_creator", "output": prompt, "repeat": True},
            {"purpose": "*", "output": "forecast written", "repeat": True},
        ]
    )


@pytest.mark.parametrize(
    ("task", "instruction", "prompt", "where"),
    [
        # (a key typed in the task is refused when the run is created: `test_typed_secrets.py`)
        (WEATHER, f"Call the weather API with the key {KEY}.", "You call the API.", "step call of the plan"),
        (
            WEATHER,
            "Call the weather API.",
            f"You call the API using the key {KEY}.",
            "the prompt of step call",
        ),
        # a key of no known shape, the value of a secret variable here (before, only shapes counted)
        (
            WEATHER,
            f"Call the weather API with the key {PLAIN_KEY}.",
            "You call the API.",
            "step call of the plan",
        ),
    ],
    ids=["instruction", "prompt", "variable"],
)
async def test_a_team_holding_a_secret_is_not_stored_and_reaches_no_later_task(
    isolated: Path,
    write_script: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
    task: str,
    instruction: str,
    prompt: str,
    where: str,
) -> None:
    monkeypatch.setenv("WEATHER_API_KEY", PLAIN_KEY)
    settings = Settings.load()
    engine = Engine(settings)
    try:
        secret = engine.create_run(
            task,
            model=f"scripted:{_weather_script(write_script, instruction, prompt)}",
            options=RunOptions(auto_approve=True, prompt_rounds=0),
        )
        assert (await engine.execute(secret.id)).status == "succeeded"
        registry = RegistryStore(settings.database_url)
        try:
            assert registry.list_cohorts() == [] and registry.list_agents() == []
        finally:
            registry.close()
        [event] = [e for e in engine.store.events(secret.id) if e.kind.startswith("team_")]
        assert (event.kind, event.data) == (
            "team_not_stored",
            {
                "reason": f"{where} holds what looks like a secret (a key, token or password); a team "
                "with a secret is not stored, as its texts would reach later tasks' prompts"
            },
        )
        clean = _weather_script(
            write_script, "Fetch the weather into forecast.txt.", "You fetch the weather."
        )
        later = engine.create_run(
            WEATHER, model=f"scripted:{clean}", options=RunOptions(auto_approve=True, prompt_rounds=0)
        )
        done = await engine.execute(later.id)
        assert done.status == "succeeded"
        assert "planner" in engine.report(later.id)["usage"]["by_purpose"]  # planned afresh
        assert done.agents["call"].prompt == "You fetch the weather."
        assert [e.kind for e in engine.store.events(later.id) if e.kind.startswith("team_")] == [
            "team_stored"
        ]
    finally:
        engine.close()


async def test_reused_agents_count_a_secret_runs_outcome_and_no_one_is_asked_to_store_its_team(
    isolated: Path, write_script: Callable[..., Path], monkeypatch: Any
) -> None:
    # the stored plan fitted to a paraphrase by a model that writes a password into a step
    leaky = {
        "title": "load sales",
        "instruction": "Read sales.csv with password: hunter2hunter2.",
        "expected_output": "monthly totals",
    }
    report = {
        "title": "report",
        "instruction": "Write the totals to report.md.",
        "expected_output": "report.md",
    }
    adapted = {"steps": [leaky, report]}
    script = _team_script(write_script, {"purpose": "adapter", "output": adapted})
    settings = Settings.load()
    engine = Engine(settings)
    try:
        first = engine.create_run(T1, model=f"scripted:{script}", options=RunOptions(prompt_rounds=0))
        assert (await execute_answering(engine, first.id, review=_approve)).status == "succeeded"
        monkeypatch.setenv("MASTERPLANNER_REMEMBER_RUNS", "ask")
        asked = RunOptions(prompt_rounds=0)
        secret = engine.create_run(T2, model=f"scripted:{script}", options=asked)
        done = await execute_answering(engine, secret.id, review=_approve)
        assert done.status == "succeeded"
        assert done.agents["load"].agent_id == f"{first.id}.load"  # the first run's agents, reused
        service = RunService(Settings.load())
        registry = RegistryStore(settings.database_url)
        try:
            assert await service.pending(secret.id) == []  # no remember question
            assert [c.id for c in registry.list_cohorts()] == [first.id]
            assert registry.get_agent(f"{first.id}.load").stats.successes == 2
            # a remember question asked about such a team (before this version) stores nothing either
            question, _ = engine.store.requests.open(
                secret.id, "remember", {"agents": 2, "task": done.task}, key=f"{secret.id}#remember"
            )
            await service.answer_plainly(question.id, approve=True, by="cli@later")
            assert [c.id for c in registry.list_cohorts()] == [first.id]
            assert len(registry.list_agents()) == 2
            told = [e.data for e in engine.store.events(secret.id) if e.kind.startswith("team_")]
            reason = "step load of the plan holds what looks like a secret"
            assert [data["reason"].split(" (")[0] for data in told] == [reason, reason]
            assert told[1]["request"] == question.id
            assert "hunter2" not in json.dumps(told)
        finally:
            registry.close()
            service.close()
    finally:
        engine.close()


async def _asked_to_remember(engine: Engine, script: Path) -> tuple[str, str]:
    """A run that succeeded with `remember_runs = ask` (set by the caller): its id and its open question."""
    run = engine.create_run(T1, model=f"scripted:{script}", options=RunOptions(prompt_rounds=0))
    assert (await execute_answering(engine, run.id, review=_approve)).status == "succeeded"
    [question] = engine.store.requests.find(run.id)
    assert question.kind == "remember"
    return run.id, question.id


def _stored_team(settings: Settings, run_id: str) -> tuple[list[str], dict[str, tuple[list[int], Any]]]:
    """The stored cohorts' ids, and each agent's versions and stats."""
    registry = RegistryStore(settings.database_url)
    try:
        agents = {
            agent.id: (registry.versions(agent.id), agent.stats.model_dump())
            for agent in registry.list_agents()
        }
        return [cohort.id for cohort in registry.list_cohorts()], agents
    finally:
        registry.close()


async def test_a_yes_whose_team_could_not_be_stored_stores_it_when_sent_again(
    isolated: Path, write_script: Callable[..., Path], monkeypatch: Any
) -> None:
    """The team a `remember` answer approved cannot be stored (the answering process's embedder
    cannot be made: its provider's key is not set); the same answer sent again, once that is
    fixed, stores it, and sent once more changes nothing.

    Before, the answer stood and the team was never stored: sent again, it was `taken_before`
    and did nothing, so the person's yes was lost.
    """
    monkeypatch.setenv("MASTERPLANNER_REMEMBER_RUNS", "ask")
    settings = Settings.load()
    engine = Engine(settings)
    try:
        run_id, question = await _asked_to_remember(engine, _team_script(write_script))
    finally:
        engine.close()
    monkeypatch.setenv("MASTERPLANNER_EMBEDDER", "openai:text-embedding-3-small")  # no OPENAI_API_KEY
    service = RunService(Settings.load())
    try:
        taken = await service.answer_plainly(question, approve=True, by="cli@laptop:101")
    finally:
        service.close()
    assert (taken.state, taken.answer, taken.taken_before) == ("answered", {"approved": True}, False)
    assert taken.follow_up_failed == (
        "storing the run's team failed (embedder 'openai:text-embedding-3-small' needs the environment "
        "variable OPENAI_API_KEY, which is not set); your yes stands: once that is fixed, "
        f"send the same answer again, or run `masterplanner runs remember {run_id}`, to store the team"
    )
    assert _stored_team(settings, run_id) == ([], {})
    monkeypatch.delenv("MASTERPLANNER_EMBEDDER")
    service = RunService(Settings.load())
    try:
        again = await service.answer_plainly(question, approve=True, by="cli@laptop:102")
        assert (again.taken_before, again.follow_up_failed, again.answered_by) == (
            True,
            None,
            "cli@laptop:101",
        )
        stored = _stored_team(settings, run_id)
        once = {"uses": 1, "successes": 1, "failures": 0, "ratings": 0, "rating_sum": 0.0}
        assert stored == ([run_id], {f"{run_id}.load": ([1], once), f"{run_id}.report": ([1], once)})
        # sent once more: the team is stored already, and nothing is stored or counted twice
        more = await service.answer_plainly(question, approve=True, by="cli@laptop:103")
        assert (more.taken_before, more.follow_up_failed) == (True, None)
        assert _stored_team(settings, run_id) == stored
        told = [
            (event.kind, event.data)
            for event in await service.events(run_id)
            if event.kind.startswith("team_")
        ]
        assert told == [("team_stored", {"cohort": run_id, "request": question})]
    finally:
        service.close()


async def test_a_team_whose_storing_failed_half_way_is_stored_whole_and_once(
    isolated: Path, write_script: Callable[..., Path], monkeypatch: Any
) -> None:
    """Storing a team is all or nothing: the disk filling up after its first agent stores none of
    it, and the answer sent again stores each agent once, counted once.

    Before, the first agent stayed stored (and counted) without its team.
    """
    monkeypatch.setenv("MASTERPLANNER_REMEMBER_RUNS", "ask")
    settings = Settings.load()
    engine = Engine(settings)
    try:
        run_id, question = await _asked_to_remember(engine, _team_script(write_script))
    finally:
        engine.close()
    put_agent = RegistryStore.put_agent
    full = RunError("database registry.db: cannot store an agent: database or disk is full")

    def filling(self: RegistryStore, spec: Any, *args: Any, **kwargs: Any) -> Any:
        if spec.id == f"{run_id}.report":  # the second agent: the first was stored
            raise full
        return put_agent(self, spec, *args, **kwargs)

    service = RunService(settings)
    try:
        with monkeypatch.context() as broken:
            broken.setattr(RegistryStore, "put_agent", filling)
            taken = await service.answer_plainly(question, approve=True, by="web@server:7")
        assert (taken.taken_before, (taken.follow_up_failed or "").split(";")[0]) == (
            False,
            f"storing the run's team failed ({full})",
        )
        assert _stored_team(settings, run_id) == ([], {})
        again = await service.answer_plainly(question, approve=True, by="web@server:7")
        assert (again.taken_before, again.follow_up_failed) == (True, None)
        once = {"uses": 1, "successes": 1, "failures": 0, "ratings": 0, "rating_sum": 0.0}
        assert _stored_team(settings, run_id) == (
            [run_id],
            {f"{run_id}.load": ([1], once), f"{run_id}.report": ([1], once)},
        )
    finally:
        service.close()


async def test_runs_remember_stores_the_team_of_a_run_that_succeeded_once(
    isolated: Path, write_script: Callable[..., Path], monkeypatch: Any
) -> None:
    """`runs remember RUN` stores a team nothing stored (here `remember_runs = never`), once.

    Before, nothing did: a team not stored when its run ended, or when a yes was given, was lost.
    """
    from _cli import mp

    monkeypatch.setenv("MASTERPLANNER_REMEMBER_RUNS", "never")
    settings = Settings.load()
    script = _team_script(write_script)
    engine = Engine(settings)
    try:
        done = engine.create_run(T1, model=f"scripted:{script}", options=RunOptions(prompt_rounds=0))
        assert (await execute_answering(engine, done.id, review=_approve)).status == "succeeded"
        planning = engine.create_run(T2, model=f"scripted:{script}", options=RunOptions(prompt_rounds=0))
    finally:
        engine.close()
    monkeypatch.setenv("MASTERPLANNER_REMEMBER_RUNS", "ask")
    engine = Engine(Settings.load())
    try:
        asking, question = await _asked_to_remember(engine, script)
    finally:
        engine.close()
    assert _stored_team(settings, done.id) == ([], {})
    stored = mp("runs", "remember", done.id)
    assert (stored.returncode, stored.stderr.strip()) == (
        0,
        f"run {done.id}: its team is stored (masterplanner cohorts show {done.id})",
    )
    once = {"uses": 1, "successes": 1, "failures": 0, "ratings": 0, "rating_sum": 0.0}
    team = ([done.id], {f"{done.id}.load": ([1], once), f"{done.id}.report": ([1], once)})
    assert _stored_team(settings, done.id) == team
    refusals = [
        (done.id, f"run {done.id}: its team is stored already (`masterplanner cohorts show {done.id}`)"),
        (planning.id, f"run {planning.id} is planning: only a run that succeeded has a team to store"),
        (
            asking,
            f"run {asking} asks whether to store its team: answer its request {question} "
            f"(`masterplanner runs answer {question} --approve`)",
        ),
    ]
    for run_id, refusal in refusals:
        again = mp("runs", "remember", run_id)
        assert (again.returncode, again.stderr.strip()) == (1, f"error: {refusal}")
    assert _stored_team(settings, done.id) == team
    service = RunService(Settings.load())
    try:
        told = [event.data for event in await service.events(done.id) if event.kind.startswith("team_")]
    finally:
        service.close()
    assert [data["cohort"] for data in told] == [done.id]
    assert told[0]["by"].startswith("cli@")


@pytest.mark.parametrize("meanwhile", ["the same yes sent again", "another remember"])
async def test_a_team_stored_by_two_calls_at_once_is_said_stored_once(
    isolated: Path, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, meanwhile: str
) -> None:
    """A yes whose team could not be stored (the disk full); then `runs remember` stores it and,
    before it writes its `team_stored` event, another call made at once (the same yes sent again,
    or another `runs remember`) finds the team stored and no event saying so. Both are taken,
    the team is stored once, and the run has one `team_stored` event: the other's.

    Before, the yes sent again wrote one (no event named its request) and `runs remember` another;
    a second `runs remember` was refused as "stored already" while no event said so yet.
    """
    from _faults import sqlite_failing

    from masterplanner.engine import reuse

    monkeypatch.setenv("MASTERPLANNER_REMEMBER_RUNS", "ask")
    settings = Settings.load()
    engine = Engine(settings)
    try:
        run_id, question = await _asked_to_remember(engine, _team_script(write_script))
    finally:
        engine.close()
    service = RunService(settings)
    try:
        with sqlite_failing("INSERT INTO mp_cohorts", times=1):
            taken = await service.answer_plainly(question, approve=True, by="cli@laptop:101")
        assert (taken.follow_up_failed or "").startswith("storing the run's team failed")
        assert _stored_team(settings, run_id) == ([], {})

        async def other() -> object:
            if meanwhile == "the same yes sent again":
                again = await service.answer_plainly(question, approve=True, by="cli@laptop:101")
                return (again.taken_before, again.follow_up_failed)
            try:
                return await service.remember(run_id, by="cli@laptop:102")
            except RunError as error:
                return str(error)

        loop, storing, others = asyncio.get_running_loop(), reuse.remember_run, []

        def then_the_other(*args: Any, **kwargs: Any) -> bool:
            stored = storing(*args, **kwargs)
            if not others:  # the first storing: the other call runs whole before its event is written
                others.append(None)
                others[0] = asyncio.run_coroutine_threadsafe(other(), loop).result(timeout=60)
            return stored

        monkeypatch.setattr(reuse, "remember_run", then_the_other)
        assert await service.remember(run_id, by="cli@laptop:103") == run_id
        told = [(e.kind, e.data) for e in await service.events(run_id) if e.kind.startswith("team_")]
    finally:
        service.close()
    if meanwhile == "the same yes sent again":
        assert others == [(True, None)]
        assert told == [("team_stored", {"cohort": run_id, "request": question})]
    else:
        assert others == [run_id]
        assert told == [("team_stored", {"cohort": run_id, "by": "cli@laptop:102"})]
    once = {"uses": 1, "successes": 1, "failures": 0, "ratings": 0, "rating_sum": 0.0}
    assert _stored_team(settings, run_id) == (
        [run_id],
        {f"{run_id}.load": ([1], once), f"{run_id}.report": ([1], once)},
    )


async def test_a_team_stored_as_its_run_ended_is_said_stored_once_when_its_end_is_told_again(
    isolated: Path, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process dies after the run's end stored its team and wrote `team_stored`, before the run
    recorded that the registry was told. The resume tells it again: one `team_stored`, one cohort.

    Before, the resume found the team stored and wrote a second `team_stored`.
    """
    from _faults import Killed

    from masterplanner.engine import workflows

    telling, told = workflows._tell_registry, []

    def tell_then_die(*args: Any, **kwargs: Any) -> None:
        telling(*args, **kwargs)
        if not told:
            told.append(True)
            raise Killed

    monkeypatch.setattr(workflows, "_tell_registry", tell_then_die)
    monkeypatch.setenv("MASTERPLANNER_REMEMBER_RUNS", "ask")
    engine = Engine(Settings.load())
    try:
        options = RunOptions(prompt_rounds=0, auto_approve=True)  # a run with --yes stores its team
        run = engine.create_run(T1, model=f"scripted:{_team_script(write_script)}", options=options)
        with pytest.raises(Killed):
            await engine.execute(run.id)
        assert told == [True]
        final = await engine.execute(run.id)  # resumed: its end tells the registry again
        assert final.status == "succeeded", final.error
        kinds = [event.kind for event in engine.store.events(run.id)]
        assert (kinds.count("team_stored"), kinds.count("team_not_stored")) == (1, 0)
        assert _stored_team(engine.settings, run.id)[0] == [run.id]
    finally:
        engine.close()


async def test_a_stored_agents_keywords_keep_every_script_and_what_runs_write_stays_editable(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    """Keywords lost every letter outside ASCII ("Ärger" gave "rger", a Japanese task none), so a
    search in the task's words missed its agents. What a run and its feedback write stays within
    what an edit takes: a word of the task past a keyword's limit is no keyword, and a model's
    long lesson is cut; otherwise the agent's own form, sent back, would be refused.
    """
    from masterplanner.service import RegistryService

    lesson = "Always name the totals. " + "Check every row again. " * 400
    analysis = {"purpose": "feedback", "output": {"lessons": [{"step": "report", "lesson": lesson}]}}
    model = f"scripted:{_team_script(write_script, analysis)}"
    task = f"Melde den Ärger über {'z' * 150}.txt und 報告書を書く"
    settings = Settings.load()
    service, registry = RunService(settings), RegistryService(settings)
    try:
        done = await service.create(task, model=model, options=RunOptions(auto_approve=True, prompt_rounds=0))
        assert (await service.execute(done.id)).status == "succeeded"
        agents = [f"{done.id}.load", f"{done.id}.report"]
        report = await registry.agent(agents[1])
        assert report.keywords == ["den", "melde", "txt", "und", "ärger", "über", "報告書を書く"]
        for query in ("Ärger", "ärger melden", "報告書を書く"):
            assert sorted(agent.id for agent, _ in await registry.search_agents(query)) == agents, query

        rated = await service.feedback(done.id, rating=1, model=model)
        [taught] = rated.lessons[agents[1]]
        assert taught == " ".join(lesson.split())[:300].rstrip()  # cut, where it had 9,224
        for agent_id in agents:
            form = (await registry.agent(agent_id)).model_dump(mode="json")
            edited = await registry.edit_agent(agent_id, form | {"description": "Edited."})
            assert (edited.description, edited.version) == ("Edited.", form["version"] + 1)
    finally:
        service.close()
        registry.close()


async def test_a_run_s_outcome_is_counted_once_when_its_end_is_told_again(
    isolated: Path, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process dies after the registry counted the run's outcome, before the run recorded it.

    The resume tells the registry again. Before, a run with no cohort to claim (its team waits
    for a yes) counted its reused agents' use a second time; now once.
    """
    from _faults import Killed

    from masterplanner.engine import workflows

    script = _team_script(write_script)
    monkeypatch.setenv("MASTERPLANNER_REMEMBER_RUNS", "ask")
    engine = Engine(Settings.load())
    try:
        options = RunOptions(prompt_rounds=0, auto_approve=True)  # a run with --yes stores its team
        first = engine.create_run(T1, model=f"scripted:{script}", options=options)
        assert (await engine.execute(first.id)).status == "succeeded"
        registry = RegistryStore(engine.settings.database_url)
        assert registry.get_agent(f"{first.id}.load").stats.uses == 1

        telling, told = workflows.remember_run, []

        def tell_then_die(*args: Any, **kwargs: Any) -> bool:
            result = telling(*args, **kwargs)
            if not told:
                told.append(kwargs["run_id"])
                raise Killed
            return result

        monkeypatch.setattr(workflows, "remember_run", tell_then_die)
        options = RunOptions(prompt_rounds=0, auto_approve=False)
        second = engine.create_run(T2, model=f"scripted:{script}", options=options)
        with pytest.raises(Killed):
            await execute_answering(engine, second.id, review=_approve)
        assert told == [second.id]
        assert registry.get_agent(f"{first.id}.load").stats.uses == 2

        final = await engine.execute(second.id)  # resumed: its end tells the registry again
        assert final.status == "succeeded", final.error
        stats = registry.get_agent(f"{first.id}.load").stats
        assert (stats.uses, stats.successes) == (2, 2)
        assert [c.id for c in registry.list_cohorts()] == [first.id]  # its team waits for a yes
    finally:
        engine.close()
