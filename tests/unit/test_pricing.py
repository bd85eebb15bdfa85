"""Money: what requests cost (price table for hosted models, nothing for local ones) and the money budget."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.anthropic import AnthropicProvider
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.usage import RequestUsage

from masterplanner import BudgetExceededError, Settings, labelled, resolve_model
from masterplanner.engine import RunOptions
from masterplanner.engine.budget import DEFAULT_OUTPUT_TOKENS, Reservation, RunLedger, reservation_for
from masterplanner.engine.store import RunStore, Spending
from masterplanner.models.pricing import estimated_cost, request_cost


def response(model_name: str, input_tokens: int, output_tokens: int) -> ModelResponse:
    usage = RequestUsage(input_tokens=input_tokens, output_tokens=output_tokens)
    return ModelResponse(parts=[TextPart("x")], usage=usage, model_name=model_name)


def openai_model(name: str, base_url: str) -> OpenAIChatModel:
    return OpenAIChatModel(name, provider=OpenAIProvider(base_url=base_url, api_key="not-used"))


def test_hosted_requests_are_priced_from_the_table_and_local_ones_cost_nothing(tmp_path: Path) -> None:
    hosted = openai_model("gpt-4o-mini", "https://api.openai.com/v1")
    # gpt-4o-mini: $0.15 per million input tokens, $0.60 per million output tokens
    assert request_cost(hosted, response("gpt-4o-mini", 1000, 500)) == pytest.approx(0.00045)
    unknown = openai_model("no-such-model-anywhere", "https://api.openai.com/v1")
    assert request_cost(unknown, response("no-such-model-anywhere", 1000, 500)) is None
    local_server = openai_model("gpt-4o-mini", "http://127.0.0.1:8080/v1")
    assert request_cost(local_server, response("gpt-4o-mini", 1000, 500)) == 0.0
    script = tmp_path / "s.json"
    script.write_text('{"calls": [{"purpose": "*", "repeat": true}]}')
    from masterplanner import UsageLedger

    scripted = labelled(resolve_model(f"scripted:{script}"), "planner", UsageLedger())
    assert request_cost(scripted, response("x", 1000, 500)) == 0.0  # through the wrapper
    assert estimated_cost("anthropic:claude-sonnet-4-5", 100_000, 0) == pytest.approx(0.3)  # $3 a million
    assert estimated_cost("local", 10**9, 10**9) == estimated_cost("scripted:/x.json", 5, 5) == 0.0
    assert estimated_cost("openai:qwen", 1000, 1000, base_url="http://localhost:8080/v1") == 0.0
    assert estimated_cost("openai:qwen", 1000, 1000) is None


def test_cached_input_tokens_are_priced_at_the_cache_rate_and_a_usage_that_cannot_be_is_unknown() -> None:
    """Cached input was charged at the full input price: a cache-heavy run showed up to 10x its cost."""
    hosted = openai_model("gpt-4o-mini", "https://api.openai.com/v1")
    cached = RequestUsage(
        input_tokens=1000, cache_read_tokens=800, output_tokens=500, output_reasoning_tokens=300
    )
    reply = ModelResponse(parts=[TextPart("x")], usage=cached, model_name="gpt-4o-mini")
    # 200 fresh at $0.15, 800 cached at $0.075 and 500 out (reasoning among them) at $0.60 per million
    assert request_cost(hosted, reply) == pytest.approx(0.00039)
    claude = AnthropicModel("claude-sonnet-4-5", provider=AnthropicProvider(api_key="not-used"))
    written = RequestUsage(input_tokens=1000, cache_write_tokens=1000)
    # a cache write costs $3.75 a million against $3 for plain input
    assert request_cost(claude, ModelResponse(parts=[], usage=written, model_name="claude-sonnet-4-5")) == (
        pytest.approx(0.00375)
    )
    impossible = RequestUsage(input_tokens=10, cache_read_tokens=800)  # more cached than sent
    assert request_cost(hosted, ModelResponse(parts=[], usage=impossible, model_name="gpt-4o-mini")) is None


@pytest.fixture
def store(isolated: Path) -> Iterator[RunStore]:
    """A run store holding run r1 (of a priced hosted model)."""
    settings = Settings.load()
    settings.ensure_home()
    opened = RunStore(settings.database_url)
    opened.create_run("r1", "t", model="openai:gpt-4o", workspace=str(isolated), options=RunOptions())
    yield opened
    opened.close()


def test_the_money_budget_stops_the_run_once_spent(store: RunStore) -> None:
    ledger = RunLedger(store, "r1", RunOptions(max_cost_usd=0.05))
    ledger.record("planner", input_tokens=1000, output_tokens=100, seconds=1.0, cost_usd=0.03)
    ledger.check()  # $0.03 of $0.05
    ledger.record("step:a", input_tokens=1000, output_tokens=100, seconds=1.0, cost_usd=0.025)
    ledger.record("step:a", input_tokens=10, output_tokens=1, seconds=0.1, cost_usd=None)
    with pytest.raises(BudgetExceededError) as caught:
        ledger.check()
    assert str(caught.value) == "the run used its money budget of $0.05 ($0.0550 spent)"
    usage = store.usage("r1")
    assert (usage["cost_usd"], usage["unpriced_calls"]) == (0.055, 1)
    assert usage["by_purpose"]["step:a"]["cost_usd"] == 0.025
    assert usage["by_purpose"]["step:a"]["unpriced_calls"] == 1


def test_a_money_budget_for_a_model_of_unknown_price_is_refused_before_the_run_is_made(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It let every call through as free: --max-cost 0.01 ran a million tokens, and said nothing of cost."""
    from masterplanner import ConfigError
    from masterplanner.engine import Engine

    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-used")
    engine = Engine(Settings.load())
    try:
        with pytest.raises(ConfigError) as refused:
            engine.create_run("t", model="openai:my-inhouse-llm", options=RunOptions(max_cost_usd=0.01))
        assert str(refused.value) == (
            "a money budget needs a model whose price is known, and openai:my-inhouse-llm is not in the "
            "price table: budget its model calls or tokens instead"
        )
        assert engine.store.list_runs(10) == []
        priced = engine.create_run("t", model="openai:gpt-4o-mini", options=RunOptions(max_cost_usd=0.01))
        assert priced.options.max_cost_usd == 0.01
    finally:
        engine.close()


def test_a_money_budget_for_a_model_of_unknown_price_is_refused_when_a_run_is_retried(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`runs retry --max-cost` took the budget for such a model, and the retried run spent without a limit."""
    from masterplanner import ConfigError
    from masterplanner.engine import Engine

    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-used")
    engine = Engine(Settings.load())
    try:
        run = engine.create_run("t", model="openai:my-inhouse-llm", options=RunOptions(max_model_calls=5))
        engine.store.set_status(run.id, "failed", error="the model server failed")
        with pytest.raises(ConfigError) as refused:
            engine.retry(run.id, max_cost_usd=0.01)
        assert str(refused.value) == (
            "a money budget needs a model whose price is known, and openai:my-inhouse-llm is not in the "
            "price table: budget its model calls or tokens instead"
        )
        record = engine.store.get_run(run.id)
        assert (record.status, record.retries, record.options.max_cost_usd) == ("failed", 0, None)
        retried = engine.retry(run.id, max_model_calls=9)  # a budget that can hold is taken
        assert retried.options.max_model_calls == 9
    finally:
        engine.close()


def test_a_call_in_flight_counts_against_the_call_budget_until_recorded_or_failed(store: RunStore) -> None:
    ledger = RunLedger(store, "r1", RunOptions(max_model_calls=2))
    nothing = Reservation()
    assert ledger.reserve(nothing)
    ledger.release(nothing)  # the request failed: nothing was counted
    assert ledger.reserve(nothing) and ledger.reserve(nothing)  # two in flight at once: the budget's two
    with pytest.raises(BudgetExceededError):
        ledger.reserve(nothing)
    for purpose in ("step:a", "step:b"):  # each answered call is counted, then released
        ledger.settle(nothing, 2, 0.0)
        ledger.record(purpose, input_tokens=1, output_tokens=1, seconds=0.1)
    with pytest.raises(BudgetExceededError) as spent:
        ledger.reserve(nothing)
    assert str(spent.value) == "the run used its budget of 2 model calls"


def test_requests_in_flight_hold_their_worst_case_against_the_token_and_money_budgets(
    store: RunStore,
) -> None:
    """Each request checked the budget alone before it was made: requests at once passed it together."""
    ledger = RunLedger(store, "r1", RunOptions(max_tokens=1000, max_cost_usd=0.05))
    big = Reservation(input_tokens=300, output_tokens=300, cost_usd=0.02)
    assert ledger.reserve(big)  # 600 tokens and $0.02 held
    assert not ledger.reserve(big)  # fits the budget, not beside the one in flight: it waits
    ledger.settle(big, 350, 0.01)  # answered: its real 350 tokens and $0.01 are held instead
    assert ledger.reserve(big)  # 350 + 600 of 1,000; $0.03 of $0.05
    assert not ledger.reserve(Reservation(input_tokens=10, output_tokens=10, cost_usd=0.03))  # $0.06
    ledger.record("step:a", input_tokens=300, output_tokens=50, seconds=1.0, cost_usd=0.01)
    ledger.release(big)  # the second failed
    assert store.usage_totals("r1") == (1, 350, 0.01, 0)
    with pytest.raises(BudgetExceededError) as refused:
        ledger.reserve(Reservation(input_tokens=400, output_tokens=300))
    assert str(refused.value) == (
        "the run's budget of 1,000 tokens cannot take its next model request: it may use up to "
        "700 tokens (400 in, 300 out) and 650 are left"
    )
    assert refused.value.budget == "max_tokens"
    with pytest.raises(BudgetExceededError) as priced:
        ledger.reserve(Reservation(input_tokens=100, output_tokens=100, cost_usd=0.045))
    assert str(priced.value) == (
        "the run's money budget of $0.05 cannot take its next model request: it may cost up to "
        "$0.0450 and $0.0400 is left"
    )
    assert priced.value.budget == "max_cost_usd"
    assert ledger.reserve(Reservation(input_tokens=300, output_tokens=350, cost_usd=0.04))  # just fits


def test_a_request_is_reserved_at_its_worst_case_and_bounded_under_a_money_budget() -> None:
    hosted = openai_model("gpt-4o-mini", "https://api.openai.com/v1")
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart("ab" * 50)])]  # 100 bytes
    params = ModelRequestParameters()
    reserved, settings = reservation_for(hosted, messages, None, params, bounded=True)
    assert (reserved.input_tokens, reserved.output_tokens) == (100 + 64 + 16 + 4, DEFAULT_OUTPUT_TOKENS)
    assert settings == {"max_tokens": DEFAULT_OUTPUT_TOKENS}  # the provider stops there
    assert reserved.cost_usd == pytest.approx((184 * 0.15 + DEFAULT_OUTPUT_TOKENS * 0.6) / 1e6)
    reserved, settings = reservation_for(hosted, messages, {"max_tokens": 50}, params, bounded=True)
    assert (reserved.output_tokens, settings) == (50, {"max_tokens": 50})
    reserved, settings = reservation_for(hosted, messages, None, params, bounded=False)
    assert (reserved.output_tokens, settings) == (DEFAULT_OUTPUT_TOKENS, None)  # reserved, not sent
    # a model that costs nothing (a server on this machine) is not cut short for a money budget
    loopback = openai_model("gpt-4o-mini", "http://127.0.0.1:8080/v1")
    reserved, settings = reservation_for(loopback, messages, None, params, bounded=True)
    assert (reserved.output_tokens, reserved.cost_usd, settings) == (DEFAULT_OUTPUT_TOKENS, 0.0, None)


def test_a_reply_naming_a_model_the_table_lacks_is_priced_as_the_model_asked_for() -> None:
    """It was of unknown price (a dated version, a provider's own name): a money budget let it through."""
    hosted = openai_model("gpt-4o-mini", "https://api.openai.com/v1")
    reply = response("gpt-4o-mini-as-served-by-my-proxy", 1000, 500)
    assert request_cost(hosted, reply) == pytest.approx(0.00045)


def test_a_hosted_reply_without_usage_is_of_unknown_price_not_free(monkeypatch: pytest.MonkeyPatch) -> None:
    """An OpenAI-compatible server that sends no `usage` was priced at $0.00, read as free."""
    import asyncio

    from pydantic_ai import models

    from _model_server import Rule, model_server
    from masterplanner import UsageLedger
    from masterplanner.models import pricing
    from masterplanner.usage import money

    monkeypatch.setattr(pricing, "_loopback", lambda url: False)  # the test's server stands for a hosted one
    monkeypatch.setattr(models, "ALLOW_MODEL_REQUESTS", True)  # loopback server only
    with model_server([Rule(match=[""], reply="hi", always="no_usage")]) as server:
        ledger = UsageLedger()
        model = labelled(openai_model("gpt-4o-mini", server.base_url), "planner", ledger)
        messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart("hello")])]
        asyncio.run(model.request(messages, None, ModelRequestParameters()))
    total = ledger.totals()
    assert (total.calls, total.cost_usd, total.unpriced_calls) == (1, 0.0, 1)
    assert money(total.cost_usd, total.unpriced_calls) == "1 call of unknown price"


def test_a_reply_of_unknown_price_stops_a_run_under_a_money_budget(
    isolated: Path, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was counted as nothing, and the run went on spending past its budget unseen."""
    import asyncio

    from _plans import step

    from masterplanner.engine import Engine
    from masterplanner.models import pricing

    monkeypatch.setattr(pricing, "_FREE_SYSTEMS", frozenset())  # the script priced at $1 a million tokens
    # but for step a's reply (seven words), which the table cannot price
    monkeypatch.setattr(
        pricing,
        "_priced",
        lambda provider, name, usage: (
            None if usage.output_tokens == 7 else (usage.input_tokens + usage.output_tokens) / 1e6
        ),
    )
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("a", tools=[]), step("b", "a", tools=[])]}},
            {"purpose": "step:a", "output": "one two three four five six seven"},
            {"purpose": "*", "repeat": True},
        ]
    )
    engine = Engine(Settings.load())
    try:
        options = RunOptions(auto_approve=True, prompt_rounds=0, max_cost_usd=1.0, max_replans=0)
        run = engine.create_run("two", model=f"scripted:{script}", options=options)
        final = asyncio.run(engine.execute(run.id))
        usage = engine.report(run.id)["usage"]
        assert final.status == "failed"
        assert (
            "+ 1 call of unknown price spent under the run's money budget of $1.00, and a money budget "
            "cannot hold a reply of unknown price (one that reported no usage, or that the price table "
            "cannot price)"
        ) in (final.error or "")
        assert usage["unpriced_calls"] == 1
        assert "step:b" not in usage["by_purpose"]
        with pytest.raises(BudgetExceededError) as refused:
            engine.retry(run.id, max_cost_usd=2.0)
        assert "retry it with a larger budget" not in str(refused.value)
    finally:
        engine.close()


def test_a_money_budget_s_tiny_figures_are_not_shown_as_nothing(store: RunStore) -> None:
    """`$0.0000 is left` read as nothing left (and as a request that costs nothing)."""
    ledger = RunLedger(store, "r1", RunOptions(max_cost_usd=0.0001))
    ledger.record("planner", input_tokens=10, output_tokens=10, seconds=0.1, cost_usd=0.00008)
    with pytest.raises(BudgetExceededError) as refused:
        ledger.reserve(Reservation(input_tokens=10, output_tokens=10, cost_usd=0.00003))
    assert str(refused.value) == (
        "the run's money budget of $0.0001 cannot take its next model request: it may cost up to "
        "under $0.0001 and under $0.0001 is left"
    )


def test_a_request_whose_worst_case_cannot_fit_what_is_left_is_cut_to_it_not_refused(store: RunStore) -> None:
    """A late request reserved its whole output limit (100,000) against a budget with 10,000 left:
    the run failed though the request would have used a tenth of it."""
    ledger = RunLedger(store, "r1", RunOptions(max_tokens=10_000))
    late = Reservation(input_tokens=1_000, output_tokens=100_000, least_output_tokens=1_024)
    held = ledger.reserve(late)
    assert held == Reservation(input_tokens=1_000, output_tokens=9_000, least_output_tokens=1_024)
    assert ledger.reserve(late) is None  # beside the one in flight not even its least fits: it waits
    assert held is not None
    ledger.settle(held, 2_000, 0.0)
    second = ledger.reserve(late)  # cut to what is left beside the first's real usage
    assert second is not None and second.output_tokens == 7_000
    ledger.record("step:a", input_tokens=1_000, output_tokens=1_000, seconds=1.0)
    ledger.release(second)
    assert store.usage_totals("r1") == (1, 2_000, 0.0, 0)
    with pytest.raises(BudgetExceededError) as refused:
        ledger.reserve(Reservation(input_tokens=7_000, output_tokens=100_000, least_output_tokens=1_024))
    assert str(refused.value) == (
        "the run's budget of 10,000 tokens cannot take its next model request: even with its output "
        "cut to 1,024 tokens it needs 8,024 (7,000 in) and 8,000 are left"
    )
    assert refused.value.budget == "max_tokens"
    # a request whose own limit is under the least is not cut: it fits whole or waits or fails
    small = Reservation(input_tokens=7_500, output_tokens=600, least_output_tokens=600)
    with pytest.raises(BudgetExceededError, match="it may use up to 8,100 tokens \\(7,500 in, 600 out\\)"):
        ledger.reserve(small)


def test_a_request_whose_worst_case_cannot_fit_the_money_left_is_cut_to_what_it_buys(store: RunStore) -> None:
    ledger = RunLedger(store, "r1", RunOptions(max_cost_usd=0.01))
    per_token = 2.0**-20  # dollars an output token
    late = Reservation(
        input_tokens=500,
        output_tokens=100_000,
        cost_usd=0.001 + 100_000 * per_token,
        least_output_tokens=1_024,
        input_cost_usd=0.001,
    )
    held = ledger.reserve(late)
    assert held is not None
    assert held.output_tokens == 9_437  # (0.01 - 0.001) / 2**-20 = 9,437.18
    assert held.cost_usd == pytest.approx(0.001 + 9_437 * per_token)
    ledger.release(held)
    ledger.record("step:a", input_tokens=500, output_tokens=500, seconds=1.0, cost_usd=0.0085)
    with pytest.raises(BudgetExceededError) as refused:
        ledger.reserve(late)
    assert str(refused.value) == (
        "the run's money budget of $0.01 cannot take its next model request: even with its output "
        "cut to 1,024 tokens it costs $0.0020 and $0.0015 is left"
    )


async def test_a_request_cut_to_fit_the_token_budget_is_sent_with_that_max_tokens(
    store: RunStore, tmp_path: Path
) -> None:
    """The lowered limit reaches the model: the scripted model stops its reply there."""
    from masterplanner.engine.step_agent import BudgetedModel
    from masterplanner.purpose import using_purpose

    script = tmp_path / "s.json"
    long = " ".join(["word"] * 50_000)
    script.write_text(json.dumps({"calls": [{"purpose": "*", "output": long}], "max_output_tokens": 100_000}))
    scripted = resolve_model(f"scripted:{script}")
    ledger = RunLedger(store, "r1", RunOptions(max_tokens=20_000))
    ledger.record("planner", input_tokens=2_000, output_tokens=1_000, seconds=1.0)
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart("go on")])]
    params = ModelRequestParameters()
    worst, _ = reservation_for(scripted, messages, None, params, bounded=False)
    assert worst.output_tokens == 100_000  # the script's cap: it could not fit the 17,000 left
    with using_purpose("step:a"):
        reply = await BudgetedModel(scripted, ledger).request(messages, None, params)
    assert reply.usage.output_tokens == 17_000 - worst.input_tokens  # the max_tokens it was sent
    assert reply.finish_reason == "length"


def test_a_reserve_made_again_after_its_commit_went_unacknowledged_answers_as_it_did(
    database_url: str,
) -> None:
    """`reconnecting` makes a call again when its connection dropped, though its commit may have
    landed: the reservation's second insert hit its own row's key and failed the request."""
    store = RunStore(database_url)
    try:
        store.create_run("r1", "t", model="openai:gpt-4o", workspace="/w", options=RunOptions())
        asked: list[Spending] = []

        def hold(spending: Spending) -> tuple[int, float]:
            asked.append(spending)
            return 600, 0.02

        assert store.reserve("r1", "k1", owner="w1", hold=hold) == (600, 0.02)
        assert store.reserve("r1", "k1", owner="w1", hold=hold) == (600, 0.02)  # the retry finds its row
        assert len(asked) == 1
        assert store.spending("r1") == Spending(0, 0, 0.0, held_calls=1, held_tokens=600, held_cost_usd=0.02)
        assert store.reserve("r1", "k2", owner="w1", hold=hold) == (600, 0.02)  # another request: held too
        assert store.spending("r1").held_tokens == 1_200
    finally:
        store.close()


def test_a_tiny_money_budget_is_shown_as_a_plain_amount(store: RunStore) -> None:
    """A budget of a thousandth of a cent was shown as `$1e-05`, and one of a dollar as `$1`."""
    tiny = RunLedger(store, "r1", RunOptions(max_cost_usd=0.00001))
    with pytest.raises(BudgetExceededError) as held:
        tiny.reserve(Reservation(input_tokens=10, output_tokens=10, cost_usd=0.00003))
    tiny.record("planner", input_tokens=10, output_tokens=10, seconds=0.1, cost_usd=0.00002)
    with pytest.raises(BudgetExceededError) as spent:
        tiny.check()
    dollar = RunLedger(store, "r1", RunOptions(max_cost_usd=1.0))
    dollar.record("planner", input_tokens=10, output_tokens=10, seconds=0.1, cost_usd=None)
    with pytest.raises(BudgetExceededError) as unpriced:
        dollar.check()
    assert [str(held.value), str(spent.value), str(unpriced.value).split(", and")[0]] == [
        "the run's money budget of $0.00001 cannot take its next model request: it may cost up to "
        "under $0.0001 and under $0.0001 is left",
        "the run used its money budget of $0.00001 (under $0.0001 spent)",
        "under $0.0001 + 1 call of unknown price spent under the run's money budget of $1.00",
    ]


def test_a_request_whose_least_fits_the_money_left_exactly_is_sent_not_left_waiting(store: RunStore) -> None:
    """The output room worked out from the dollars left rounded to 1,023 tokens, one less than the
    least the budget check had let through: with nothing in flight the request waited for ever."""
    request = Reservation(
        input_tokens=8_905,
        output_tokens=4_096,
        cost_usd=8_905 * 1.1e-6 + 4_096 * 1.5e-5,
        input_cost_usd=8_905 * 1.1e-6,
        least_output_tokens=1_024,
    )
    spent = 0.247718
    ledger = RunLedger(store, "r1", RunOptions(max_cost_usd=spent + request.least().cost_usd))
    ledger.record("planner", input_tokens=10, output_tokens=10, seconds=0.1, cost_usd=spent)
    held = ledger.reserve(request)
    assert held is not None and held.output_tokens == 1_024


async def test_a_request_made_that_failed_is_a_call_counted_and_held_to_the_call_budget(
    store: RunStore,
) -> None:
    """A request that failed once sent (HTTP 500) was not counted: a provider failing every time could
    be called without limit under a calls budget, and reports showed none of those calls."""
    from pydantic_ai.exceptions import ModelHTTPError
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from masterplanner import LabelledModel
    from masterplanner.engine.step_agent import BudgetedModel

    sent: list[int] = []

    def failing(_messages: list[ModelMessage], _info: AgentInfo) -> ModelResponse:
        sent.append(1)
        raise ModelHTTPError(500, "failing", {"error": {"message": "the server had an error"}})

    ledger = RunLedger(store, "r1", RunOptions(max_model_calls=2))
    model = LabelledModel(BudgetedModel(FunctionModel(failing), ledger), "step:a", ledger)
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart("go on")])]
    for _ in range(2):
        with pytest.raises(ModelHTTPError):
            await model.request(messages, None, ModelRequestParameters())
    with pytest.raises(BudgetExceededError) as refused:  # the third is not made
        await model.request(messages, None, ModelRequestParameters())
    assert str(refused.value) == "the run used its budget of 2 model calls"
    assert len(sent) == 2
    usage = store.usage("r1")
    assert (usage["llm_calls"], usage["failed_calls"]) == (2, 2)
    assert {key: value for key, value in usage["by_purpose"]["step:a"].items() if key != "seconds"} == {
        "calls": 2,
        "input_tokens": 0,
        "output_tokens": 0,
        "cost_usd": 0.0,
        "unpriced_calls": 0,
        "failed_calls": 2,
    }
    assert store.spending("r1").held_calls == 0  # their reservations went with their counting
    assert ledger.summary()["failed_calls"] == 2  # the refused request is no call


async def test_a_cancelled_request_is_not_counted_as_a_failed_call() -> None:
    import asyncio

    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from masterplanner import UsageLedger

    async def slow(_messages: list[ModelMessage], _info: AgentInfo) -> ModelResponse:
        await asyncio.sleep(60)
        raise AssertionError("not reached")

    ledger = UsageLedger()
    model = labelled(FunctionModel(slow), "planner", ledger)
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart("go on")])]
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await model.request(messages, None, ModelRequestParameters())
    assert ledger.by_purpose() == {}


def test_a_usage_write_made_again_with_its_request_key_is_counted_once(database_url: str) -> None:
    """`reconnecting` makes a call again when its connection dropped, though its commit may have
    landed: the usage's upsert then added the request a second time."""
    store = RunStore(database_url)
    try:
        store.create_run("r1", "t", model="openai:gpt-4o", workspace="/w", options=RunOptions())
        usage = {"input_tokens": 10, "output_tokens": 5, "seconds": 0.5, "cost_usd": 0.01}
        store.add_usage("r1", "step:a", **usage, request="q1")
        store.add_usage("r1", "step:a", **usage, request="q1")  # the same request again: counted
        store.add_usage("r1", "step:a", **usage, request="q2")  # another request
        assert store.usage_totals("r1") == (2, 30, 0.02, 0)
    finally:
        store.close()


@pytest.mark.postgres
def test_a_usage_whose_commit_acknowledgement_was_lost_is_counted_once(
    postgres_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server restarted after the usage's commit: the ledger's write was made again (`reconnecting`)
    and the request counted twice, against the run's budgets too."""
    store = RunStore(postgres_database)
    try:
        store.create_run("r1", "t", model="openai:gpt-4o", workspace="/w", options=RunOptions())
        ledger = RunLedger(store, "r1", RunOptions(max_model_calls=5))
        dialect = store.engine.dialect
        commit = dialect.do_commit
        lost: list[str] = []

        def commit_and_lose_the_acknowledgement(connection: object) -> None:
            commit(connection)
            if not lost:
                lost.append("usage")
                raise dialect.loaded_dbapi.OperationalError("server closed the connection unexpectedly")

        held = ledger.reserve(Reservation(input_tokens=10, output_tokens=10))
        assert held is not None
        ledger.settle(held, 15, 0.0)
        monkeypatch.setattr(dialect, "do_commit", commit_and_lose_the_acknowledgement)
        ledger.record("step:a", input_tokens=10, output_tokens=5, seconds=0.5)
        assert lost == ["usage"]  # made again once
        assert store.usage_totals("r1") == (1, 15, 0.0, 0)
        assert store.spending("r1").held_calls == 0
    finally:
        store.close()


async def test_a_model_waiting_event_that_cannot_be_stored_leaves_the_request_waiting_and_is_logged(
    store: RunStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The event only says the request waits: its write failing failed the request (and its step)."""
    import asyncio
    import logging
    import threading

    from masterplanner import RunError
    from masterplanner.engine.step_agent import BudgetedModel
    from masterplanner.purpose import using_purpose

    script = tmp_path / "s.json"
    script.write_text(json.dumps({"calls": [{"purpose": "*", "output": "done", "repeat": True}]}))
    scripted = resolve_model(f"scripted:{script}")
    ledger = RunLedger(store, "r1", RunOptions(max_tokens=10_000))
    in_flight = ledger.reserve(Reservation(input_tokens=6_000))  # its 4,096 out cannot fit beside this
    assert in_flight is not None
    written: list[str] = []
    tried = threading.Event()

    def failing(run_id: str, kind: str, *args: object, **kwargs: object) -> None:
        written.append(kind)
        tried.set()
        raise RunError("the run's database failed: disk I/O error")

    monkeypatch.setattr(store, "append_event", failing)
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart("go on")])]
    with using_purpose("step:a"), caplog.at_level(logging.WARNING, logger="masterplanner"):
        budgeted = BudgetedModel(scripted, ledger)
        request = asyncio.create_task(budgeted.request(messages, None, ModelRequestParameters()))
        assert await asyncio.to_thread(tried.wait, 10)
        await asyncio.sleep(0.2)  # polled meanwhile: it waits
        assert not request.done()
        ledger.release(in_flight)  # room in the budget
        reply = await asyncio.wait_for(request, 10)
    assert reply.parts == [TextPart("done")]
    assert written == ["model_waiting"]
    assert [(record.levelname, record.getMessage()) for record in caplog.records] == [
        (
            "WARNING",
            "run r1: could not store the model_waiting event of a model request of step:a (it waits "
            "for room in the run's budgets all the same): the run's database failed: disk I/O error",
        )
    ]


@pytest.mark.parametrize("end", ["succeeded", "failed", "cancelled"])
def test_a_run_that_ends_forgets_its_usage_keys_and_a_live_run_s_repeated_write_counts_once(
    store: RunStore, isolated: Path, end: str
) -> None:
    """`mp_usage_requests` grew by a row per model request for ever; a key is made again only by its
    own write (`reconnecting`), which a run's end comes after."""
    import sqlalchemy as sa

    def keys() -> dict[str, int]:
        with store.engine.connect() as connection:
            rows = connection.execute(
                sa.text("SELECT run_id, COUNT(*) FROM mp_usage_requests GROUP BY run_id ORDER BY run_id")
            )
            return {str(run_id): int(count) for run_id, count in rows}

    store.create_run("r2", "t", model="openai:gpt-4o", workspace=str(isolated), options=RunOptions())
    for run_id, request in (("r1", "k1"), ("r1", "k1"), ("r1", "k2"), ("r2", "k3")):  # k1 written again
        store.add_usage(run_id, "step:a", input_tokens=10, output_tokens=5, seconds=0.5, request=request)
    assert store.usage_totals("r1") == (2, 30, 0.0, 0)
    assert keys() == {"r1": 2, "r2": 1}

    assert store.set_status("r1", end)  # type: ignore[arg-type]
    assert keys() == {"r2": 1}  # the live run keeps its own
    assert store.usage_totals("r1") == (2, 30, 0.0, 0)  # the usage stays
    store.add_usage("r2", "step:a", input_tokens=10, output_tokens=5, seconds=0.5, request="k3")
    assert store.usage_totals("r2") == (1, 15, 0.0, 0)  # still counted once while it is live
