import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from masterplanner import UsageLedger, current_purpose, step_purpose, using_purpose, validate_purpose


@pytest.mark.parametrize(
    "label",
    ["planner", "replanner", "prompt_creator", "critic", "aggregator", "chat", "step:load-data", "step:a1"],
)
def test_valid_purposes(label: str) -> None:
    assert validate_purpose(label) == label


@pytest.mark.parametrize("label", ["", "Planner", "step:", "step:Bad Id", "tool:x", "step:-x"])
def test_invalid_purposes(label: str) -> None:
    with pytest.raises(ValueError, match="invalid purpose label"):
        validate_purpose(label)


def test_step_purpose_and_context() -> None:
    assert step_purpose("fetch") == "step:fetch"
    assert current_purpose() is None
    with using_purpose("critic"):
        assert current_purpose() == "critic"
        with using_purpose("step:inner"):
            assert current_purpose() == "step:inner"
        assert current_purpose() == "critic"
    assert current_purpose() is None


def test_ledger_adds_up_across_threads() -> None:
    ledger = UsageLedger()

    def work() -> None:
        for _ in range(1000):
            ledger.record("step:a", input_tokens=2, output_tokens=1, seconds=0.001)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ledger.record("planner", input_tokens=10, output_tokens=5, seconds=1.23456, cost_usd=0.0125)
    ledger.record("planner", input_tokens=1, output_tokens=1, seconds=0.0, cost_usd=None)  # no known price
    ledger.record("planner", input_tokens=0, output_tokens=0, seconds=3.0, failed=True)  # made, not answered
    assert ledger.by_purpose() == {
        "planner": {
            "calls": 3,
            "input_tokens": 11,
            "output_tokens": 6,
            "seconds": 4.235,
            "cost_usd": 0.0125,
            "unpriced_calls": 1,
            "failed_calls": 1,
        },
        "step:a": {
            "calls": 4000,
            "input_tokens": 8000,
            "output_tokens": 4000,
            "seconds": 4.0,
            "cost_usd": 0.0,
            "unpriced_calls": 0,
            "failed_calls": 0,
        },
    }
    summary = ledger.summary()
    assert (summary["llm_calls"], summary["cost_usd"], summary["unpriced_calls"]) == (4003, 0.0125, 1)
    assert summary["failed_calls"] == 1


async def test_a_counter_without_a_purpose_counts_under_the_label_outside_it(
    write_script: Callable[..., Path],
) -> None:
    from pydantic_ai import Agent

    from masterplanner import LabelledModel, ModelError, resolve_model

    script = write_script([{"purpose": "critic", "output": "ok"}, {"purpose": "chat", "output": "ok"}])
    model = resolve_model(f"scripted:{script}")
    inner, outer = UsageLedger(), UsageLedger()
    counted = LabelledModel(model, None, inner)
    assert (await Agent(LabelledModel(counted, "critic", outer)).run("x")).output == "ok"
    assert inner.by_purpose()["critic"]["calls"] == 1
    assert outer.by_purpose()["critic"]["calls"] == 1
    with pytest.raises(ModelError, match="a model request was made with no purpose label"):
        await Agent(counted).run("x")
