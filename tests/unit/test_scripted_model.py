import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel, Field
from pydantic_ai import Agent

from masterplanner import (
    ScriptError,
    ScriptExhaustedError,
    UsageLedger,
    labelled,
    resolve_model,
    using_purpose,
)
from masterplanner.models.scripted import ScriptedModel

WriteScript = Callable[..., Path]


class Step(BaseModel):
    id: str = Field(min_length=2)
    kind: Literal["read", "write"]
    weight: int = Field(ge=3, le=9)


class Plan(BaseModel):
    title: str
    steps: list[Step] = Field(min_length=1)
    note: str | None = None


def agent_for(
    script: Path, purpose: str, ledger: UsageLedger | None = None, **kwargs: object
) -> Agent[None, object]:
    model = resolve_model(f"scripted:{script}")
    return Agent(labelled(model, purpose, ledger or UsageLedger()), **kwargs)  # type: ignore[arg-type]


async def test_entries_answer_in_order_per_purpose(write_script: WriteScript) -> None:
    script = write_script(
        [
            {"purpose": "planner", "output": "plan one"},
            {"purpose": "critic", "output": "critique"},
            {"purpose": "planner", "output": "plan two"},
        ]
    )
    model = resolve_model(f"scripted:{script}")
    ledger = UsageLedger()
    planner = Agent(labelled(model, "planner", ledger))
    critic = Agent(labelled(model, "critic", ledger))
    assert (await planner.run("x")).output == "plan one"
    assert (await critic.run("x")).output == "critique"
    assert (await planner.run("x")).output == "plan two"
    with pytest.raises(ScriptExhaustedError) as caught:
        await planner.run("x")
    assert caught.value.purpose == "planner"
    assert "no entry left for purpose 'planner'" in str(caught.value)
    # the call the script had no entry for was made and got no answer: a failed call
    assert (ledger.by_purpose()["planner"]["calls"], ledger.by_purpose()["planner"]["failed_calls"]) == (3, 1)
    assert ledger.by_purpose()["critic"]["calls"] == 1


async def test_delays_do_not_block_other_calls(write_script: WriteScript) -> None:
    script = write_script(
        [
            {"purpose": "step:slow", "output": "slow", "delay_s": 0.4},
            {"purpose": "step:fast", "output": "fast"},
        ]
    )
    model = resolve_model(f"scripted:{script}")
    ledger = UsageLedger()
    finished: list[str] = []

    async def run(purpose: str) -> None:
        result = await Agent(labelled(model, purpose, ledger)).run("go")
        finished.append(result.output)

    slow = asyncio.create_task(run("step:slow"))
    await asyncio.sleep(0)  # the slow call takes its entry and starts waiting
    await run("step:fast")
    assert finished == ["fast"]  # the fast call completed while the slow one was still waiting
    await slow
    assert finished == ["fast", "slow"]
    assert ledger.by_purpose()["step:slow"]["seconds"] >= 0.4


async def test_concurrent_delays_overlap(write_script: WriteScript) -> None:
    script = write_script([{"purpose": f"step:s{i}", "output": str(i), "delay_s": 0.5} for i in range(3)])
    model = resolve_model(f"scripted:{script}")
    ledger = UsageLedger()
    loop = asyncio.get_running_loop()
    started = loop.time()
    outputs = await asyncio.gather(
        *(Agent(labelled(model, f"step:s{i}", ledger)).run("go") for i in range(3))
    )
    elapsed = loop.time() - started
    assert [result.output for result in outputs] == ["0", "1", "2"]
    # Awaited one after another, three 0.5 s delays take 1.5 s; overlapping, about 0.5 s.
    assert elapsed < 1.25


async def test_repeat_and_wildcard(write_script: WriteScript) -> None:
    script = write_script(
        [
            {"purpose": "critic", "output": "same again", "repeat": True},
            {"purpose": "planner", "output": "first"},
            {"purpose": "*", "output": "anything"},
        ]
    )
    model = resolve_model(f"scripted:{script}")
    ledger = UsageLedger()
    critic = Agent(labelled(model, "critic", ledger))
    planner = Agent(labelled(model, "planner", ledger))
    assert [(await critic.run("x")).output for _ in range(3)] == ["same again"] * 3
    assert (await planner.run("x")).output == "first"
    assert (await planner.run("x")).output == "anything"  # planner's own entries are used up
    with pytest.raises(ScriptExhaustedError, match="'planner'"):
        await planner.run("x")
    assert isinstance(model, ScriptedModel)
    assert model.remaining() == {"critic": 1}


async def test_turn_entries_answer_by_place_in_the_conversation(write_script: WriteScript) -> None:
    script = write_script(
        [
            {"purpose": "step:w", "turn": 2, "output": "second: done", "repeat": True},
            {"purpose": "step:w", "turn": 1, "tool_calls": [{"name": "note", "args": {}}], "repeat": True},
        ]
    )
    noted: list[str] = []

    def note() -> str:
        """Take a note."""
        noted.append("noted")
        return "ok"

    agent = agent_for(script, "step:w", tools=[note])
    # two conversations at once: each one's first request calls the tool, its second answers
    first, second = await asyncio.gather(agent.run("x"), agent.run("y"))
    assert (first.output, second.output, noted) == ("second: done", "second: done", ["noted", "noted"])
    with pytest.raises(ScriptExhaustedError, match="'step:v'"):
        await agent_for(script, "step:v").run("x")


async def test_structured_output_from_script(write_script: WriteScript) -> None:
    plan = {"title": "T", "steps": [{"id": "ab", "kind": "write", "weight": 4}]}
    script = write_script([{"purpose": "planner", "output": plan}])
    result = await agent_for(script, "planner", output_type=Plan).run("make a plan")
    assert result.output == Plan.model_validate(plan)


async def test_entry_without_output_gives_minimal_valid_instance(write_script: WriteScript) -> None:
    script = write_script([{"purpose": "planner"}, {"purpose": "chat"}])
    result = await agent_for(script, "planner", output_type=Plan).run("make a plan")
    assert result.output == Plan(title="", steps=[Step(id="aa", kind="read", weight=3)])
    text = await agent_for(script, "chat").run("hello")
    assert text.output == "ok"


async def test_tool_calls_run_the_tools(write_script: WriteScript) -> None:
    script = write_script(
        [
            {
                "purpose": "step:fetch",
                "tool_calls": [{"name": "write_file", "args": {"path": "a.txt", "content": "x"}}],
            },
            {"purpose": "step:fetch", "output": "done"},
        ]
    )
    written: dict[str, str] = {}
    agent = agent_for(script, "step:fetch")

    @agent.tool_plain
    def write_file(path: str, content: str) -> str:
        """Write a file."""
        written[path] = content
        return "written"

    result = await agent.run("do it")
    assert result.output == "done"
    assert written == {"a.txt": "x"}


async def test_usage_is_recorded_per_purpose(write_script: WriteScript) -> None:
    script = write_script(
        [{"purpose": "chat", "output": "three word answer"}, {"purpose": "critic", "output": "fine"}]
    )
    ledger = UsageLedger()
    model = resolve_model(f"scripted:{script}")
    await Agent(labelled(model, "chat", ledger)).run("one two")
    await Agent(labelled(model, "critic", ledger)).run("a")
    usage = ledger.by_purpose()
    assert list(usage) == ["chat", "critic"]
    assert usage["chat"]["calls"] == 1
    assert usage["chat"]["output_tokens"] == 3
    assert usage["chat"]["input_tokens"] == 2
    summary = ledger.summary()
    assert summary["llm_calls"] == 2
    assert summary["output_tokens"] == 4


async def test_a_script_states_the_most_tokens_a_reply_takes(write_script: WriteScript) -> None:
    raw = {"calls": [{"purpose": "chat", "output": "four words right here"}], "max_output_tokens": 3}
    script = write_script(None, raw=json.dumps(raw))
    model = resolve_model(f"scripted:{script}")
    assert model.profile.get("masterplanner_max_output_tokens") == 3  # the run's budgets reserve that
    with pytest.raises(ScriptError) as caught:
        await Agent(labelled(model, "chat", UsageLedger())).run("x")
    assert str(caught.value) == (
        f"scripted model file {script}: a chat call's reply has 4 tokens, more than the script's "
        "max_output_tokens of 3"
    )


async def test_unlabelled_calls_count_as_chat(write_script: WriteScript) -> None:
    script = write_script([{"purpose": "chat", "output": "hi"}])
    assert (await Agent(resolve_model(f"scripted:{script}")).run("x")).output == "hi"


async def test_using_purpose_labels_direct_calls(write_script: WriteScript) -> None:
    script = write_script([{"purpose": "aggregator", "output": "summary"}])
    agent = Agent(resolve_model(f"scripted:{script}"))
    with using_purpose("aggregator"):
        assert (await agent.run("x")).output == "summary"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("not json", "not JSON: line 1, column 1: a value was expected"),
        ('{"calls": [] x}', "not JSON: line 1, column 14: a comma was expected"),
        (json.dumps({"entries": []}), "calls: is missing"),
        (json.dumps({"calls": [{"output": "x"}]}), "calls.0.purpose: is missing"),
        (
            json.dumps({"calls": [{"purpose": "a", "delay_s": -1}]}),
            "calls.0.delay_s: must be at least 0, got -1",
        ),
        (
            json.dumps({"calls": [{"purpose": "a", "output": "x", "tool_calls": [{"name": "t"}]}]}),
            "either 'output' or 'tool_calls'",
        ),
        (
            json.dumps({"calls": [{"purpose": "a", "tool_calls": [{"args": {}}]}]}),
            "tool_calls.0.name: is missing",
        ),
        (  # the fields known are named: before, only "calls.0.colour: unknown field"
            json.dumps({"calls": [{"purpose": "a", "colour": "red"}]}),
            "calls.0.colour: unknown field; known: cut_off, delay_s, expect, output, purpose, repeat, "
            "tool_calls, turn",
        ),
        (
            json.dumps({"calls": [{"purpose": "a", "output": "x"}], "colour": "red"}),
            "colour: unknown field; known: calls, max_output_tokens, small_model",
        ),
        (json.dumps({"calls": [], "max_output_tokens": 0}), "max_output_tokens: must be at least 1, got 0"),
    ],
)
def test_malformed_scripts_name_the_problem(write_script: WriteScript, content: str, expected: str) -> None:
    path = write_script(None, raw=content)
    with pytest.raises(ScriptError) as caught:
        resolve_model(f"scripted:{path}")
    assert str(path) in str(caught.value)
    assert expected in str(caught.value)
