"""The estimate a review shows: calls from the plan's shape, tokens and time from the run so far."""

from __future__ import annotations

from _plans import step

from masterplanner.estimate import RunEstimate, estimate_run

PLAN = {
    "task": "t",
    "steps": [step("a", tools=[]), step("b", tools=["read_file"]), step("c", "a", "b", tools=[])],
}


def test_calls_come_from_the_plan_and_cost_from_the_price_table() -> None:
    assert estimate_run(PLAN, {"llm_calls": 0}, "openai:gpt-4o") == RunEstimate(4, None, None, None)
    assert estimate_run(PLAN, {"llm_calls": 0}, "scripted:/x.json").cost == "$0.00"
    usage = {
        "llm_calls": 2,
        "input_tokens": 2000,
        "output_tokens": 1000,
        "by_purpose": {"planner": {"seconds": 1}},
    }
    # 4 calls like the 2 so far: 4,000 in and 2,000 out at gpt-4o's $2.50 and $10 per million
    assert estimate_run(PLAN, usage, "openai:gpt-4o").cost == "$0.0300"
    assert estimate_run(PLAN, usage, "ollama:qwen2.5").cost == "$0.00"
    assert estimate_run(PLAN, usage, "openai:no-such-model-here").cost is None
    assert estimate_run(PLAN, usage, "openai:gpt-4o").text() == (
        "about 4 model calls, 6,000 tokens, 1.3 s, cost $0.0300"
    )
    # a call that failed (no tokens) is not one of those the tokens were measured by
    failed = usage | {"llm_calls": 3, "failed_calls": 1}
    assert estimate_run(PLAN, failed, "openai:gpt-4o") == estimate_run(PLAN, usage, "openai:gpt-4o")


def test_tokens_and_time_are_measured_by_the_calls_so_far() -> None:
    usage = {
        "llm_calls": 4,
        "input_tokens": 300,
        "output_tokens": 100,
        "by_purpose": {"planner": {"seconds": 2.0}, "prompt_creator": {"seconds": 6.0}},
    }
    # 4 calls of 100 tokens; a and b side by side (1 round), then c: 2 rounds of 4/3 requests at 2 s
    assert estimate_run(PLAN, usage, "local") == RunEstimate(4, 400, 5.3, "$0.00")
    assert estimate_run(PLAN, usage, "local", max_parallel=1).seconds == 8.0
    two_sinks = {"task": "t", "steps": [step("a", tools=[]), step("b", tools=[])]}
    assert estimate_run(two_sinks, usage, "local").model_calls == 3  # and the answer


def test_one_call_and_one_token_are_said_in_the_singular() -> None:
    """A plan of one step without tools read "about 1 model calls"."""
    one = {"task": "t", "steps": [step("a", tools=[])]}
    assert estimate_run(one, {"llm_calls": 0}, "local").text() == "about 1 model call, cost $0.00"
    usage = {"llm_calls": 2, "input_tokens": 1, "output_tokens": 1, "by_purpose": {"planner": {"seconds": 1}}}
    assert estimate_run(one, usage, "local").text() == "about 1 model call, 1 token, 0.5 s, cost $0.00"
    assert RunEstimate(1_200, 2, 3.0, None).text() == (
        "about 1,200 model calls, 2 tokens, 3.0 s, cost not known for this model"
    )
