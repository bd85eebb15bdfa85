"""A solved task's team is remembered, and a paraphrase of the task reuses it without planning."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from _plans import step

from masterplanner import Settings
from masterplanner.engine import Engine, RunOptions
from masterplanner.registry import RegistryStore

T1 = "Read sales.csv and write the monthly totals to report.md"
T2 = "Write the monthly totals of sales.csv to report.md"


async def test_a_paraphrase_reuses_the_stored_team(isolated: Path, write_script: Callable[..., Path]) -> None:
    plan = {"steps": [step("load", tools=[]), step("report", "load", tools=[])]}
    script = write_script(
        [
            {"purpose": "planner", "output": plan},
            {"purpose": "prompt_creator", "output": "You are careful. Do your step.", "repeat": True},
            {"purpose": "step:load", "output": "totals", "repeat": True},
            {"purpose": "step:report", "output": "report written", "repeat": True},
            {"purpose": "*", "repeat": True},
        ]
    )
    settings = Settings.load()
    engine = Engine(settings)
    reviewed: list[Any] = []

    async def review(run: Any, _catalog: Any) -> dict[str, Any]:
        reviewed.append(run)
        return {"action": "approve"}

    try:
        first = engine.create_run(T1, model=f"scripted:{script}", options=RunOptions(prompt_rounds=0))
        assert (await engine.execute(first.id, review=review)).status == "succeeded"
        registry = RegistryStore(settings.database_url)
        assert [c.id for c in registry.list_cohorts()] == [first.id]
        assert sorted(a.id for a in registry.list_agents()) == [f"{first.id}.load", f"{first.id}.report"]
        assert registry.get_agent(f"{first.id}.load").stats.successes == 1

        second = engine.create_run(T2, model=f"scripted:{script}", options=RunOptions(prompt_rounds=0))
        final = await engine.execute(second.id, review=review)
        assert final.status == "succeeded", final.error
        usage = engine.report(second.id)["usage"]["by_purpose"]
        assert "planner" not in usage and "prompt_creator" not in usage
        assert set(usage) == {"step:load", "step:report"}
        ready = next(e.data for e in engine.store.events(second.id) if e.kind == "plan_ready")
        assert ready["reused_cohort"] == first.id and ready["similarity"] >= 0.6
        assert reviewed[1].agents["load"]["reused_from"] == first.id  # the review sees what was reused
        assert registry.get_agent(f"{first.id}.load").stats.uses == 2
        assert [c.id for c in registry.list_cohorts()] == [first.id, second.id] or len(
            registry.list_cohorts()
        ) == 2
    finally:
        engine.close()


def test_a_low_rating_teaches_lessons_that_reach_the_next_prompt(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    import json
    import subprocess
    import sys

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
        prompt = engine.store.get_run(second["run_id"]).agents["report"]["prompt"]
    finally:
        engine.close()
    assert prompt.endswith("Lessons from earlier runs:\n- Always include the totals.")
