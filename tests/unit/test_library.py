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

from masterplanner import RunError, RunOptions, RunService, Settings

README = Path(__file__).resolve().parents[2] / "README.md"

PLAN = {
    "steps": [
        {
            "id": "write",
            "title": "Write it",
            "agent_role": "writer",
            "instruction": "Write the text to the file.",
            "expected_output": "The text, written",
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
    write_script: Callable[..., Path], isolated: Path
) -> None:
    code = _readme_run_example()
    assert code.count('model="local"') == 2
    printed = io.StringIO()
    # standard output only: DBOS's log handler, made in the example, keeps the standard error it saw
    with contextlib.redirect_stdout(printed):
        exec(compile(code.replace('model="local"', f"model={_script(write_script)!r}"), "README", "exec"), {})
    lines = printed.getvalue().splitlines()
    first = asyncio.run(_only_run_of(isolated, "Write a haiku about the sea to haiku.txt"))
    assert lines == [
        f"succeeded written {isolated / 'workspaces' / first}",
        "review the plan of 1 step(s): approve, reject or edit",
        "succeeded 2 model calls",
    ]


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
