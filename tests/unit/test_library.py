"""masterplanner used as a library: the README's example, and services of several databases in one program."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from masterplanner import Remedy, RunError, RunOptions, RunService, Said, Settings

README = Path(__file__).resolve().parents[2] / "README.md"

PLAN = {
    "steps": [
        {
            "id": "write",
            "title": "Write it",
            "agent_role": "writer",
            "instruction": "Write the text to the file.",
            "expected_output": "The text, written",
            "tools": ["write_file"],
        }
    ]
}


def _script(write_script: Callable[..., Path], *, delay_s: float = 0.0) -> str:
    calls: list[dict[str, Any]] = [
        {"purpose": "planner", "output": PLAN, "repeat": True},
        {"purpose": "step:write", "output": "written", "delay_s": delay_s, "repeat": True},
        {"purpose": "*", "repeat": True},
    ]
    return f"scripted:{write_script(calls)}"


def _readme_run_example() -> str:
    library = README.read_text().split("\n## Library\n", 1)[1]
    found = re.search(r"```python\n(.*?)```", library, re.DOTALL)
    assert found is not None
    return found.group(1)


def test_the_readme_example_runs_a_task_and_answers_its_review(
    write_script: Callable[..., Path], isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = _readme_run_example()
    assert code.count('model="local"') == 2
    monkeypatch.setenv("MASTERPLANNER_TOOL_POLICIES", '{"write_file": "ask"}')
    write = {
        "purpose": "step:write",
        "tool_calls": [{"name": "write_file", "args": {"path": "o.txt", "content": "hi"}}],
    }
    done = {"purpose": "step:write", "output": "written"}
    rest = {"purpose": "*", "repeat": True}
    script = write_script(
        [{"purpose": "planner", "output": PLAN, "repeat": True}, write, done, write, done, rest]
    )
    printed = io.StringIO()
    # standard output only: DBOS's log handler, made in the example, keeps the standard error it saw
    with contextlib.redirect_stdout(printed):
        exec(compile(code.replace('model="local"', f"model={f'scripted:{script}'!r}"), "README", "exec"), {})
    lines = printed.getvalue().splitlines()
    first = asyncio.run(_only_run_of(isolated, "Write a haiku about the sea to haiku.txt"))
    assert lines == [
        f"succeeded written {isolated / 'workspaces' / first}",
        "review the plan of 1 step: approve, reject or edit",
        'allow write_file(path="o.txt", content="hi") (step write)?',
        "succeeded 3 model calls",
    ]


def _readme_block(section: str, language: str, number: int = 0) -> str:
    """The `number`-th ```LANGUAGE block of README's `section` (a heading line, up to the next `## `)."""
    text = README.read_text().split(f"\n{section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", text, re.DOTALL)[number]


def test_the_readme_model_seam_example_prints_the_answer_and_the_usage_its_comment_shows(
    write_script: Callable[..., Path],
) -> None:
    code = _readme_block("## Library", "python", 1)
    assert code.count('resolve_model("local")') == 1
    script = write_script([{"purpose": "chat", "output": "red, green, blue"}])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code.replace('"local"', repr(f"scripted:{script}")), "README", "exec"), {})
    answer, usage = printed.getvalue().splitlines()
    assert answer == "red, green, blue"
    # the comment under the print shows the same keys, in order, and the same fixed values
    comment = re.search(r"^# (\{'chat'.*\})$", code, re.MULTILINE)
    assert comment is not None
    shown = re.sub(r"'(\w+)': …", r"'\1': ANY", comment.group(1))
    assert re.sub(r"'(input_tokens|output_tokens|seconds)': [0-9.]+", r"'\1': ANY", usage) == shown


def test_the_readme_scripted_model_example_runs_as_the_readme_says(isolated: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    (tmp_path / "work" / "script.json").write_text(_readme_block("### The scripted model", "json"))
    said = re.search(r"`(masterplanner run [^`]*)`\s+writes `a.txt` and answers `done`", README.read_text())
    assert said is not None
    args = said.group(1).split(" ", 2)[1:]
    args = [args[0], *re.findall(r'"[^"]*"|\S+', args[1])]
    args = [arg.strip('"') for arg in args]
    assert args == ["run", "Write x to a.txt", "--model", "scripted:script.json", "--yes"]
    done = subprocess.run(
        [sys.executable, "-m", "masterplanner", *args], capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stdout) == (0, "done\n"), done.stderr
    (workspace,) = (isolated / "workspaces").iterdir()
    assert (workspace / "a.txt").read_text() == "x"


async def _only_run_of(home: Path, task: str) -> str:
    service = RunService(Settings(home=home))
    try:
        (found,) = [run for run in await service.list_runs() if run.task == task]
        return found.id
    finally:
        service.close()


def test_services_of_two_databases_in_one_program(write_script: Callable[..., Path], tmp_path: Path) -> None:
    slow = _script(write_script, delay_s=1.5)
    quick = _script(write_script)

    async def program() -> list[str]:
        first = RunService(Settings(home=tmp_path / "one"))
        second = RunService(Settings(home=tmp_path / "two"))
        seen: list[str] = []
        try:
            a = await first.create("write it", model=slow, options=RunOptions(auto_approve=True))
            b = await second.create("write it", model=quick, options=RunOptions(auto_approve=True))
            running = asyncio.create_task(first.execute(a.id))
            while (await first.get(a.id)).status != "running" and not running.done():  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            # the first database's run is executed here now: the second's is refused, unharmed
            with pytest.raises(RunError) as refused:
                await second.execute(b.id)
            seen.append(str(refused.value))
            seen.append((await second.get(b.id)).status)
            seen.append((await running).status)
            # once it has ended, the second database's runs are executed in the same event loop
            seen.append((await second.execute(b.id)).status)
            # closing the first service leaves the second's engine running
            first.close()
            c = await second.create("write it", model=quick, options=RunOptions(auto_approve=True))
            seen.append((await second.execute(c.id)).status)
            # and back: the first database again, in a new service
            again = RunService(Settings(home=tmp_path / "one"))
            try:
                d = await again.create("write it", model=quick, options=RunOptions(auto_approve=True))
                seen.append((await again.execute(d.id)).status)
            finally:
                again.close()
            seen.append(a.id)
        finally:
            first.close()
            second.close()
        return seen

    seen = asyncio.run(program())
    one = f"sqlite:///{tmp_path / 'one' / 'masterplanner.sqlite'}"
    two = f"sqlite:///{tmp_path / 'two' / 'masterplanner.sqlite'}"
    assert seen[0] == (
        f"this process is executing run {seen[-1]} on the database {one}, and executes one "
        f"database's runs at a time: execute runs of {two} in another process, or once that run "
        "has ended"
    )
    assert seen[1:-1] == ["planning", "succeeded", "succeeded", "succeeded", "succeeded"]


def test_a_program_s_runs_take_the_settings_policies_and_their_options_are_checked(
    write_script: Callable[..., Path], tmp_path: Path
) -> None:
    from masterplanner import ConfigError

    model = _script(write_script)
    settings = Settings(home=tmp_path / "home", tool_policies={"write_file": "deny"})

    async def program() -> list[Any]:
        service = RunService(settings)
        seen: list[Any] = []
        try:
            plain = await service.create("x", model=model, options=RunOptions(auto_approve=True))
            seen.append(plain.options.tool_policies)
            own = RunOptions(tool_policies={"write_file": "ask", "read_file": "ask"})
            seen.append((await service.create("x", model=model, options=own)).options.tool_policies)
            before = len(await service.list_runs())
            for bad in (
                RunOptions(max_parallel="4"),  # type: ignore[arg-type]
                RunOptions(tool_policies={"write_file": "maybe"}),
                RunOptions(max_model_calls=-5),
                RunOptions(max_wall_s=float("nan")),
                RunOptions(step_timeout_s=0),
            ):
                with pytest.raises(ConfigError) as refused:
                    await service.create("x", model=model, options=bad)
                seen.append(str(refused.value))
            seen.append(len(await service.list_runs()) - before)
        finally:
            service.close()
        return seen

    assert asyncio.run(program()) == [
        {"write_file": "deny"},
        {"write_file": "ask", "read_file": "ask"},
        "max_parallel must be a whole number from 1 to 64, got '4'",
        "tool_policies gives 'write_file' the policy 'maybe': a policy is auto, ask or deny",
        "max_model_calls must be a whole number from 1 to 1,000,000, got -5",
        "max_wall_s must be more than 0 and at most 604,800, got nan",
        "step_timeout_s must be a number of seconds from 0 to 86,400, got 0",
        0,
    ]


def test_a_run_s_steps_events_and_usage_take_the_start_of_its_id_and_refuse_an_unknown_one(
    write_script: Callable[..., Path], tmp_path: Path
) -> None:
    from masterplanner import RunNotFoundError

    async def program() -> list[Any]:
        service = RunService(Settings(home=tmp_path / "home"))
        try:
            run = await service.create(
                "x", model=_script(write_script), options=RunOptions(auto_approve=True)
            )
            # created and never executed (or its process stopped): it says how to go on
            stopped = await service.waiting(run)
            await service.execute(run.id)
            start = run.id[:-2]
            whole = [await service.steps(run.id), await service.events(run.id), await service.usage(run.id)]
            by_start = [await service.steps(start), await service.events(start), await service.usage(start)]
            followed = [event async for event in service.follow(start)]
            refused = []
            for read in (service.steps, service.events, service.usage):
                with pytest.raises(RunNotFoundError) as unknown:
                    await read("nope-nope")
                refused.append(str(unknown.value).split(" in ")[0])
            # what to do is data: each front end says it in its terms
            reason = "no process is executing it (the one that did stopped)"
            told = stopped == Said(reason, Remedy("resume", run.id)) and [
                stopped.said(front_end) for front_end in ("cli", "web", "api")
            ] == [
                f"{reason}: continue it with `masterplanner runs resume {run.id}`",
                f"{reason}: continue it with its Resume run button",
                f"{reason}: continue it with POST /api/v1/runs/{run.id}/resume",
            ]
            return [whole == by_start, len(whole[1]) > 3, followed == whole[1], refused, told]
        finally:
            service.close()

    assert asyncio.run(program()) == [True, True, True, ["no run 'nope-nope'"] * 3, True]


def test_a_run_no_running_worker_takes_names_the_credentials_only_of_a_provider_that_needs_them(
    write_script: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`local` and `scripted` need no key, where the hint said "where the provider's API key is set"."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-used")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-not-used")

    async def program() -> list[str | None]:
        service = RunService(Settings(home=tmp_path / "home"))
        try:
            # a worker that takes only another provider's runs is running
            service._store.processes.register("w1", "worker", lease_s=60, queues=["steps-ollama"])
            said = []
            models = (_script(write_script), "local", "openai:gpt-4o-mini", "anthropic:claude-sonnet-4-0")
            for model in models:
                run = await service.create("x", model=model, for_workers=True)
                said.append(str(await service.waiting(run)))
            return said
        finally:
            service.close()

    waits = "no worker running on this database takes {} runs: the run waits until one does "
    assert asyncio.run(program()) == [
        waits.format("scripted") + "(`masterplanner worker --queues scripted`)",
        waits.format("local") + "(`masterplanner worker --queues local`)",
        waits.format("openai")
        + "(`masterplanner worker --queues openai`, where OPENAI_API_KEY or OPENAI_BASE_URL is set)",
        waits.format("anthropic")
        + "(`masterplanner worker --queues anthropic`, where ANTHROPIC_API_KEY is set)",
    ]


def test_a_home_made_again_after_a_service_closed_gets_the_next_team(
    write_script: Callable[..., Path], tmp_path: Path
) -> None:
    """`close` releases the registry too: before, it kept the removed database file open and wrote there."""
    import shutil

    from masterplanner import RegistryService

    home, model = tmp_path / "home", _script(write_script)

    async def once() -> tuple[str, int]:
        service = RunService(Settings(home=home))
        try:
            run = await service.create("write it", model=model, options=RunOptions(auto_approve=True))
            final = await service.execute(run.id)
        finally:
            service.close()
        registry = RegistryService(Settings(home=home))
        try:
            return final.status, len(await registry.cohorts())
        finally:
            registry.close()

    assert asyncio.run(once()) == ("succeeded", 1)
    shutil.rmtree(home)
    assert asyncio.run(once()) == ("succeeded", 1)


def test_a_program_s_bad_arguments_are_errors_that_name_them(
    write_script: Callable[..., Path], tmp_path: Path
) -> None:
    from masterplanner import (
        AgentEditError,
        ConfigError,
        NotFoundError,
        PlanError,
        RegistryService,
        achat,
        chat,
    )

    async def program() -> list[str]:
        settings = Settings(home=tmp_path / "home")
        service, registry = RunService(settings), RegistryService(settings)
        refused: list[str] = []
        model = _script(write_script)
        try:
            calls = [
                lambda: service.create("x", model=""),
                lambda: service.create("x", model=model, options=RunOptions(max_parallel=0)),
                lambda: service.list_runs(status="bogus"),
                lambda: service.list_runs(10**20),
                lambda: registry.memories(kind="bogus"),  # type: ignore[arg-type]
                lambda: registry.recall("sea", limit=-1),
            ]
            for call in calls:
                with pytest.raises(ConfigError) as error:
                    await call()
                refused.append(str(error.value))
            with pytest.raises(ConfigError) as blocking:  # in a coroutine: achat is the one to await
                chat("hi", model=model)
            refused.append(str(blocking.value))
            with pytest.raises(ConfigError) as no_text:
                await achat(None, model=model)  # type: ignore[arg-type]
            refused.append(str(no_text.value))
            for task in (None, "write \udcff it"):
                with pytest.raises(PlanError) as bad_task:
                    await service.create(task, model=model)  # type: ignore[arg-type]
                refused.append(str(bad_task.value))
            # nothing of the refused runs is left: no workspace recorded or made
            assert not (tmp_path / "home" / "workspaces.jsonl").exists()
            assert list((tmp_path / "home" / "workspaces").glob("*")) == []
            run = await service.create("x", model=model, options=RunOptions(auto_approve=True))
            await service.execute(run.id)
            with pytest.raises(ConfigError) as rating:
                await service.feedback(run.id, rating=4.5)  # type: ignore[arg-type]
            refused.append(str(rating.value))
            for comment, by in [(None, "me"), ("fine", 5)]:
                with pytest.raises(ConfigError) as not_text:
                    await service.feedback(run.id, rating=5, comment=comment, by=by)  # type: ignore[arg-type]
                refused.append(str(not_text.value))
            with pytest.raises(ConfigError) as after:
                await service.events(run.id, after="x")  # type: ignore[arg-type]
            refused.append(str(after.value))
            with pytest.raises(NotFoundError) as unknown:
                await registry.versions("nobody")
            refused.append(str(unknown.value))
            (stored,) = await registry.agents()
            with pytest.raises(AgentEditError) as nul:
                await registry.edit_agent(
                    stored.id, stored.model_dump(mode="json") | {"system_prompt": "a\x00b"}
                )
            refused.append(str(nul.value))
            await service.feedback(run.id, rating=5)
            (entry,) = [entry for entry in await service.audit(run.id) if entry.action.startswith("rated")]
            refused.append(f"{entry.action} by {entry.by.split('@')[0]}")
        finally:
            service.close()
            registry.close()
        return refused

    statuses = "planning, awaiting_approval, running, succeeded, failed, cancelled"
    assert asyncio.run(program()) == [
        "model must be a model spec such as 'local' or 'openai:gpt-4o-mini' (or left out for the model "
        "setting), got ''",
        "max_parallel must be a whole number from 1 to 64, got 0",
        f"status must be one of {statuses}, got 'bogus'",
        "limit must be a whole number from 1 to 10,000, got 100000000000000000000",
        "kind must be fact or episode, got 'bogus'",
        "limit must be a whole number from 1 to 100, got -1",
        "chat() blocks, and this thread runs an event loop: await achat() here instead",
        "the prompt should be text, got null",
        "invalid task: the task should be text, got null",
        "invalid task: the task holds a character that is not text (a lone surrogate)",
        "the rating must be a whole number from 1 to 5, got 4.5",
        "the comment should be text, got null; the run is not rated",
        "who rates should be text, got a number; the run is not rated",
        "after must be a whole number of at least 0 (an event's seq), got 'x'",
        "no agent 'nobody' in the registry",
        "the edit is not a valid agent, nothing changed: system_prompt: must not hold a NUL character",
        "rated the run 5/5 by library",
    ]


async def _open_review(service: RunService, run_id: str) -> Any:
    for _ in range(600):
        found = [request for request in await service.pending(run_id) if request.kind == "plan_review"]
        if found:
            return found[0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"run {run_id} opened no plan review")


def test_text_holding_a_nul_is_refused_naming_it_and_nothing_is_stored(
    database_url: str, write_script: Callable[..., Path]
) -> None:
    """A rejection's reason, an edited prompt, who answers, an edited plan, a rating's comment, an
    agent's keywords and lessons: on SQLite each was stored with its NUL; on Postgres the reason
    was taken and the run then failed in the database's words.
    """
    from masterplanner import AgentEditError, ConfigError, PlanError, RegistryService, RequestError

    async def program() -> list[str]:
        settings = Settings.load()
        service, registry = RunService(settings), RegistryService(settings)
        refused: list[str] = []
        try:
            run = await service.create("write it", model=_script(write_script))
            executing = asyncio.create_task(service.execute(run.id))
            review = await _open_review(service, run.id)
            for answer, by in [
                ({"action": "reject", "reason": "no\x00pe"}, "me"),
                ({"action": "approve", "agents": {"write": {"prompt": "a\x00b"}}}, "me"),
                ({"action": "approve"}, "m\x00e"),
            ]:
                with pytest.raises(RequestError) as answer_error:
                    await service.answer(review.id, answer, by=by)
                refused.append(str(answer_error.value).replace(review.id, "R"))
            plan = review.payload["plan"]
            edited = {**plan, "steps": [{**plan["steps"][0], "instruction": "Write\x00 it."}]}
            with pytest.raises(PlanError) as plan_error:
                await service.decide(run.id, {"action": "approve", "plan": edited}, by="me")
            refused.append(str(plan_error.value))
            assert (await service.request(review.id)).state == "open"
            await service.decide(run.id, {"action": "approve"}, by="me")
            assert (await executing).status == "succeeded"
            with pytest.raises(ConfigError) as comment:
                await service.feedback(run.id, rating=1, comment="bad\x00")
            refused.append(str(comment.value))
            (stored,) = await registry.agents()
            for field in ("keywords", "lessons"):
                with pytest.raises(AgentEditError) as edit:
                    await registry.edit_agent(stored.id, stored.model_dump(mode="json") | {field: ["a\x00b"]})
                refused.append(str(edit.value))
            assert await registry.agent(stored.id) == stored
            await service.feedback(run.id, rating=5, comment="good")
        finally:
            service.close()
            registry.close()
        return refused

    kept = "nothing was stored, and the request is still open"
    assert asyncio.run(program()) == [
        f"request R: reason: must not hold a NUL character; {kept}",
        f"request R: agents.write.prompt: must not hold a NUL character; {kept}",
        "request R: who answers ('m\\x00e') must not hold a NUL character",
        "invalid plan: step 'write': instruction: must not hold a NUL character",
        "the comment must not hold a NUL character; the run is not rated",
        "the edit is not a valid agent, nothing changed: keywords.0: must not hold a NUL character",
        "the edit is not a valid agent, nothing changed: lessons.0: must not hold a NUL character",
    ]


def test_a_memory_holding_a_nul_is_refused_to_the_agent_naming_it(
    database_url: str, write_script: Callable[..., Path]
) -> None:
    """On SQLite it was kept; on Postgres the tool failed in the database's words."""
    from masterplanner import RegistryService

    plan = {"steps": [{**PLAN["steps"][0], "tools": ["remember"]}]}  # type: ignore[index]
    calls = [
        {"purpose": "planner", "output": plan},
        {"purpose": "step:write", "tool_calls": [{"name": "remember", "args": {"fact": "tea\x00 at five"}}]},
        {"purpose": "step:write", "output": "written"},
        {"purpose": "*", "repeat": True},
    ]

    async def program() -> tuple[str, list[Any], list[Any]]:
        settings = Settings.load()
        service, registry = RunService(settings), RegistryService(settings)
        try:
            run = await service.create(
                "x", model=f"scripted:{write_script(calls)}", options=RunOptions(auto_approve=True)
            )
            done = await service.execute(run.id)
            results = [event.data for event in await service.events(run.id) if event.kind == "tool_result"]
            return done.status, results, await registry.memories(kind="fact")
        finally:
            service.close()
            registry.close()

    assert asyncio.run(program()) == (
        "succeeded",
        [{"tool": "remember", "error": "the text to remember must not hold a NUL character"}],
        [],
    )


def test_a_model_s_prompt_or_lesson_holding_a_nul_is_stored_with_a_replacement_character(
    database_url: str, write_script: Callable[..., Path]
) -> None:
    """The prompt a model wrote reached the agent stored from the run, and the failure analysis's
    lesson the agent it teaches: SQLite stored each with its NUL (and searches stopped at it); on
    Postgres the database refused the team, which was not stored, and the lesson kept its NUL."""
    from masterplanner import RegistryService

    plan = {"steps": [{**PLAN["steps"][0], "tools": []}]}  # type: ignore[index]
    calls = [
        {"purpose": "planner", "output": plan},
        {"purpose": "prompt_creator", "output": "You write\x00 texts."},
        {"purpose": "step:write", "expect": ["You write\ufffd texts."], "output": "written"},
        {
            "purpose": "feedback",
            "output": {"lessons": [{"step": "write", "lesson": "Spell\x00 names carefully"}]},
        },
        {"purpose": "*", "repeat": True},
    ]

    async def program() -> tuple[str, Any, Any, list[str]]:
        settings = Settings.load()
        service, registry = RunService(settings), RegistryService(settings)
        try:
            run = await service.create(
                "x",
                model=f"scripted:{write_script(calls)}",
                options=RunOptions(auto_approve=True, prompt_rounds=0, max_replans=0),
            )
            done = await service.execute(run.id)
            rated = await service.feedback(run.id, rating=1)
            (agent,) = await registry.agents()
            return done.status, rated.lessons, agent.system_prompt, agent.lessons
        finally:
            service.close()
            registry.close()

    lesson = "Spell\ufffd names carefully"
    status, lessons, prompt, stored = asyncio.run(program())
    assert (status, prompt, stored) == ("succeeded", "You write\ufffd texts.", [lesson])
    assert list(lessons.values()) == [[lesson]]
