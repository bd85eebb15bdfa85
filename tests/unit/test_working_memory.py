"""Working memory: inputs summarised to fit a budget, conversations trimmed (scripted model)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _plans import step
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from masterplanner import Settings, UsageLedger, labelled, resolve_model
from masterplanner.engine import Engine, RunOptions, RunRecord
from masterplanner.plan import Step
from masterplanner.working_memory import (
    ContextBudget,
    FittedInput,
    Summarizer,
    fit_inputs,
    input_shares,
    trim_history,
    untrimmed,
)

READER = Step.model_validate(step("report", "a", "b", tools=[]))
LONG = "The quarterly revenue was 4.2 million. " * 200  # 7,800 characters


def test_short_inputs_keep_all_and_long_ones_split_what_is_left() -> None:
    assert input_shares({"a": 100, "b": 5000, "c": 5000}, 3000) == {"a": 100, "b": 1450, "c": 1450}
    assert input_shares({"a": 100, "b": 200}, 3000) == {"a": 100, "b": 200}
    assert input_shares({"a": 9000, "b": 1000}, 3000) == {"a": 2000, "b": 1000}
    assert input_shares({}, 3000) == {}
    assert input_shares({"a": 5000, "b": 5000}, 10) == {"a": 200, "b": 200}  # a floor, not nothing


def test_the_budget_is_clamped_to_a_small_window() -> None:
    assert ContextBudget(12_000, 48_000).within(8192, 2048) == ContextBudget(9216, 18432)
    assert ContextBudget(12_000, 48_000).within(None) == ContextBudget(12_000, 48_000)
    assert ContextBudget(1000, 2000).within(100_000) == ContextBudget(1000, 2000)


async def test_a_long_input_is_summarised_for_the_step_that_reads_it(
    write_script: Callable[..., Path],
) -> None:
    script = write_script(
        [
            {
                "purpose": "summarizer",
                "output": "Revenue: 4.2 million.",
                "expect": ["step report", "at most 1,195 characters"],
            }
        ]
    )
    ledger = UsageLedger()
    summarizer = Summarizer(labelled(resolve_model(f"scripted:{script}"), "summarizer", ledger))
    fitted = await fit_inputs(READER, {"a": LONG, "b": "short"}, 1200, summarizer)
    assert fitted == [
        FittedInput("a", "Revenue: 4.2 million.", 7800, "summarized"),
        FittedInput("b", "short", 5, "whole"),
    ]
    assert fitted[0].heading == "### Output of step a (summarised from 7,800 characters)"
    assert ledger.by_purpose()["summarizer"]["calls"] == 1


async def test_an_input_longer_than_the_summariser_reads_is_summarised_in_pieces_then_again(
    write_script: Callable[..., Path],
) -> None:
    piece_summary = "x" * 300  # three pieces: 900 characters together, over the 500 allowed
    script = write_script(
        [
            {"purpose": "summarizer", "output": piece_summary, "expect": ["part 1 of 3"]},
            {"purpose": "summarizer", "output": piece_summary, "expect": ["part 2 of 3"]},
            {"purpose": "summarizer", "output": piece_summary, "expect": ["part 3 of 3"]},
            {"purpose": "summarizer", "output": "the whole, short", "expect": [piece_summary]},
        ]
    )
    ledger = UsageLedger()
    summarizer = Summarizer(
        labelled(resolve_model(f"scripted:{script}"), "summarizer", ledger), chunk_chars=3000
    )
    summary = await summarizer.summarize(LONG, limit=500, source="a", reader=READER)
    assert summary == "the whole, short"
    assert ledger.by_purpose()["summarizer"]["calls"] == 4


async def test_when_summarising_fails_the_input_is_cut_and_says_why(
    write_script: Callable[..., Path],
) -> None:
    reader = READER.model_copy(update={"depends_on": ["a"]})

    async def fitted_with(calls: list[dict[str, Any]]) -> FittedInput:
        model = resolve_model(f"scripted:{write_script(calls)}")
        [fitted] = await fit_inputs(
            reader, {"a": LONG}, 1000, Summarizer(labelled(model, "summarizer", UsageLedger()))
        )
        return fitted

    stuck = await fitted_with([{"purpose": "summarizer", "output": "y" * 2000, "repeat": True}])
    assert stuck.how == "cut"
    assert stuck.text == LONG[:1000] + "\n[… cut: 6,800 more characters not shown]"
    assert (
        stuck.reason
        == "the summary of step a's output (2,000 characters) was no shorter than the text (2,000)"
    )
    slow = await fitted_with([{"purpose": "summarizer", "output": "y" * size} for size in (5000, 3000, 1500)])
    assert slow.reason == "the summaries of step a's output stayed over 1,000 characters after 3 rounds"
    failing = await fitted_with([])  # no entry: the model call itself fails
    assert failing.how == "cut"
    assert failing.reason.startswith("scripted model ")
    assert "no entry left for purpose 'summarizer'" in failing.reason


def _exchange(number: int, size: int) -> list[ModelMessage]:
    call = ToolCallPart("read_file", {"path": f"f{number}.txt"}, tool_call_id=f"c{number}")
    result = ToolReturnPart("read_file", "r" * size, tool_call_id=f"c{number}")
    return [ModelResponse(parts=[call]), ModelRequest(parts=[result])]


def test_the_oldest_tool_results_are_dropped_to_fit_the_conversation() -> None:
    brief = ModelRequest(parts=[UserPromptPart("b" * 1000)])
    messages = [brief, *_exchange(1, 5000), *_exchange(2, 5000), *_exchange(3, 5000)]
    trimmed = trim_history(messages, 12_000)
    contents = [part.content for message in trimmed for part in message.parts if hasattr(part, "content")]
    note = (
        "[earlier result of read_file, 5,000 characters, dropped to keep within the context window; "
        "call the tool again if you need it]"
    )
    assert contents == ["b" * 1000, note, "r" * 5000, "r" * 5000]
    assert trim_history(messages, 100_000) == messages
    # However small the budget, the brief stays and so does the newest result's start, cut to
    # half the budget (at least 1,000 characters), saying so
    smallest = trim_history(messages, 10)
    cut = (
        "r"
        * 1000
        + "\n[cut here: this result of read_file is 5,000 characters; the first 1,000 are shown to "
        "keep within the context window. Ask for less, e.g. a part or a summary]"
    )
    assert [part.content for part in smallest[-1].parts] == [cut]  # type: ignore[union-attr]
    assert smallest[0] is brief
    # what each call returned is kept beside the model's copy, for the engine's own answers (a
    # count of a file's lines counted the cut copy); cut again on a later turn, it is still kept
    dropped, newest = smallest[2].parts[0], smallest[-1].parts[0]
    assert isinstance(dropped, ToolReturnPart) and isinstance(newest, ToolReturnPart)
    assert (untrimmed(dropped), untrimmed(newest)) == ("r" * 5000, "r" * 5000)
    assert untrimmed(trim_history(smallest, 10)[-1].parts[0]) == "r" * 5000  # type: ignore[arg-type]
    assert untrimmed(messages[-1].parts[0]) == "r" * 5000  # type: ignore[arg-type]
    # one huge result alone (a program printing 2 MB) is cut to half the budget
    huge = trim_history([brief, *_exchange(1, 2_000_000)], 48_000)
    assert len(huge[-1].parts[0].content) == 24_000 + len(  # type: ignore[union-attr]
        "\n[cut here: this result of read_file is 2,000,000 characters; the first 24,000 are shown to "
        "keep within the context window. Ask for less, e.g. a part or a summary]"
    )


@pytest.fixture
def engine(isolated: Path) -> Iterator[Engine]:
    created = Engine(Settings.load())
    yield created
    created.close()


async def _execute(engine: Engine, task: str, script: Path, options: RunOptions) -> RunRecord:
    """Create a run of `task` answered by `script`, execute it, and return it as it ended."""
    return await engine.execute(engine.create_run(task, model=f"scripted:{script}", options=options).id)


def _script(*extra: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"purpose": "planner", "output": {"steps": [step("a", tools=[]), step("report", "a", tools=[])]}},
        {"purpose": "prompt_creator", "output": "You are a worker. Do the step.", "repeat": True},
        {"purpose": "step:a", "output": LONG},
        *extra,
    ]


async def test_a_run_summarises_a_long_output_for_the_step_that_needs_it(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    script = write_script(
        _script(
            {"purpose": "summarizer", "output": "Revenue: 4.2 million."},
            {
                "purpose": "step:report",
                "output": "Report: revenue 4.2 million.",
                "expect": [
                    "### Output of step a (summarised from 7,800 characters)\nRevenue: 4.2 million.",
                ],
            },
        )
    )
    options = RunOptions(auto_approve=True, prompt_rounds=0, context_chars=2000)
    final = await _execute(engine, "sum up revenue", script, options)
    assert final.status == "succeeded", final.error
    assert final.output == "Report: revenue 4.2 million."
    report = engine.report(final.id)
    assert report["usage"]["by_purpose"]["summarizer"]["calls"] == 1
    [event] = [event for event in engine.store.events(final.id) if event.kind == "input_summarized"]
    assert (event.step, event.data) == ("report", {"dependency": "a", "chars": 7800, "shown_chars": 21})


async def test_the_expected_text_missing_fails_the_scripted_call(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    script = write_script(
        _script(
            {"purpose": "summarizer", "output": "Revenue: 4.2 million."},
            {"purpose": "step:report", "output": "never", "expect": ["The quarterly revenue was"]},
        )
    )
    options = RunOptions(auto_approve=True, prompt_rounds=0, context_chars=2000, step_attempts=1)
    final = await _execute(engine, "sum up revenue", script, options)
    assert final.status == "failed"
    [failed] = [item for item in engine.report(final.id)["steps"] if item["id"] == "report"]
    assert "does not contain the expected text 'The quarterly revenue was'" in failed["error"]


async def test_a_step_agent_conversation_is_trimmed_to_its_budget(
    engine: Engine, write_script: Callable[..., Path], isolated: Path
) -> None:
    big = "z" * 3000
    writes = [
        {
            "purpose": "step:a",
            "tool_calls": [{"name": "write_file", "args": {"path": f"f{n}.txt", "content": big}}],
        }
        for n in (1, 2)
    ]
    reads = [
        {"purpose": "step:a", "tool_calls": [{"name": "read_file", "args": {"path": f"f{n}.txt"}}]}
        for n in (1, 2)
    ]
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("a", tools=["write_file", "read_file"])]}},
            {"purpose": "prompt_creator", "output": "You are a worker. Do the step.", "repeat": True},
            *writes,
            *reads,
            {
                "purpose": "step:a",
                "output": "read both",
                # f1's result, cut to half the budget when it was the newest (the two writes' 6,000
                # characters of arguments stay), then dropped; f2's is the newest, cut
                "expect": [
                    "[earlier result of read_file, ",
                    "[cut here: this result of read_file is 3,038 characters; the first 2,500 are shown",
                ],
            },
        ]
    )
    options = RunOptions(auto_approve=True, prompt_rounds=0, history_chars=5000)
    final = await _execute(engine, "write and read", script, options)
    assert final.status == "succeeded", final.error
    assert final.output == "read both"


async def test_a_budget_overrun_while_summarising_fails_the_run_instead_of_cutting(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    script = write_script(_script({"purpose": "summarizer", "output": "Revenue: 4.2 million."}))
    # planner 1, a prompt for each of the 2 steps, step a 1: the summary would be call 5
    options = RunOptions(auto_approve=True, prompt_rounds=0, context_chars=2000, max_model_calls=4)
    final = await _execute(engine, "sum up revenue", script, options)
    assert final.status == "failed"
    assert final.error == "the run used its budget of 4 model calls"
    assert not [event for event in engine.store.events(final.id) if event.kind == "input_cut"]


async def test_the_aggregator_reads_long_sink_outputs_summarised(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("a", tools=[]), step("b", tools=[])]}},
            {"purpose": "prompt_creator", "output": "You are a worker. Do the step.", "repeat": True},
            {"purpose": "step:a", "output": LONG},
            {"purpose": "step:b", "output": "b is short"},
            {"purpose": "summarizer", "output": "Revenue: 4.2 million.", "expect": ["step answer"]},
            {
                "purpose": "aggregator",
                "output": "Both.",
                "expect": [
                    "### Output of step a (summarised from 7,800 characters)\nRevenue: 4.2 million.",
                    "### Output of step b\nb is short",
                ],
            },
        ]
    )
    options = RunOptions(auto_approve=True, prompt_rounds=0, context_chars=2000)
    final = await _execute(engine, "two results", script, options)
    assert final.status == "succeeded", final.error
    assert final.output == "Both."
    [event] = [event for event in engine.store.events(final.id) if event.kind == "input_summarized"]
    assert (event.step, event.data["dependency"]) == (None, "a")
