"""A run's usage: counted into the run store, and held to the run's call, token and money budgets.

The budgets hold for the run, not for one process: the counts are read back from the run store
(one aggregate query) before every model request, so steps of one run executing in several
processes share them. Within a process, each request also reserves its worst case before it is
made (`Reservation`: the tokens it may use and what they may cost) and holds it until its real
usage is stored, so requests made at once cannot together pass a budget each fits alone.
Reservations are this process's: another process sees a request only once it is stored.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Protocol, cast

from pydantic_ai.messages import ModelMessage, RetryPromptPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.settings import ModelSettings

from ..errors import BudgetExceededError
from ..models import MAX_OUTPUT_TOKENS
from ..models.pricing import innermost, price_of
from ..usage import UsageLedger
from .records import RunOptions
from .store import RunStore

__all__ = ["DEFAULT_OUTPUT_TOKENS", "RequestBudget", "Reservation", "RunLedger", "reservation_for"]


@dataclass(frozen=True)
class Reservation:
    """The most one model request may use: its input and output tokens, and what they may cost."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0

    @property
    def tokens(self) -> int:
        """Input and output tokens together."""
        return self.input_tokens + self.output_tokens


class RequestBudget(Protocol):
    """What a model holding its requests to a run's budgets needs (`RunLedger` is one)."""

    options: RunOptions

    def reserve(self, reservation: Reservation) -> bool: ...  # noqa: D102
    def settle(self, reservation: Reservation, tokens: int, cost_usd: float | None) -> None: ...  # noqa: D102
    def release(self, reservation: Reservation) -> None: ...  # noqa: D102
    def check(self) -> None: ...  # noqa: D102


class RunLedger(UsageLedger):
    """Counts model usage into the run store and enforces the run's call, token and money budgets."""

    records_blocking = True

    def __init__(self, store: RunStore, run_id: str, options: RunOptions) -> None:
        super().__init__()
        self.store = store
        self.run_id = run_id
        self.options = options
        self._lock = threading.Lock()
        self._in_flight = 0
        """Calls this process made that are not stored yet (reserved, or answered and not recorded)."""
        self._held_tokens = 0
        self._held_cost = 0.0
        """Their tokens and cost: the reservation while a call waits, its real usage once answered."""

    def record(
        self,
        purpose: str,
        *,
        input_tokens: int,
        output_tokens: int,
        seconds: float,
        cost_usd: float | None = 0.0,
    ) -> None:
        """Count one model call, in memory and in the run store; it is no longer held in flight."""
        super().record(
            purpose,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            seconds=seconds,
            cost_usd=cost_usd,
        )
        self.store.add_usage(
            self.run_id,
            purpose,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            seconds=seconds,
            cost_usd=cost_usd,
        )
        # counted in the store now: `settle` held exactly these figures for it
        self._release(input_tokens + output_tokens, cost_usd or 0.0)

    def reserve(self, reservation: Reservation) -> bool:
        """Hold `reservation` for one request about to be made (a query of the run's totals).

        True: held, until `settle` and `record` count its real usage (or `release` drops it).
        False: it fits the run's budgets but not beside the requests this process has in flight;
        ask again once one of those is counted (their real usage is usually less than reserved).
        Raises `BudgetExceededError` naming the budget when it cannot fit even then.
        """
        with self._lock:  # one check at a time in this process, each seeing the others' reservations
            calls, used, spent = self._totals()
            self._refuse(calls, used, spent, reservation)
            tokens, dollars = self.options.max_tokens, self.options.max_cost_usd
            if (tokens is not None and used + self._held_tokens + reservation.tokens > tokens) or (
                dollars is not None and spent + self._held_cost + reservation.cost_usd > dollars
            ):
                return False
            self._in_flight += 1
            self._held_tokens += reservation.tokens
            self._held_cost += reservation.cost_usd
            return True

    def settle(self, reservation: Reservation, tokens: int, cost_usd: float | None) -> None:
        """The reserved request was answered: hold its real usage instead until `record` stores it."""
        with self._lock:
            self._held_tokens += tokens - reservation.tokens
            self._held_cost += (cost_usd or 0.0) - reservation.cost_usd

    def release(self, reservation: Reservation) -> None:
        """The reserved request was not answered (it failed or was cancelled): nothing was used."""
        self._release(reservation.tokens, reservation.cost_usd)

    def _release(self, tokens: int, cost_usd: float) -> None:
        with self._lock:
            self._in_flight = max(0, self._in_flight - 1)
            self._held_tokens = max(0, self._held_tokens - tokens) if self._in_flight else 0
            self._held_cost = max(0.0, self._held_cost - cost_usd) if self._in_flight else 0.0

    def check(self) -> None:
        """Raise `BudgetExceededError` if the run has no model calls, tokens or money left (a query)."""
        calls, used, spent = self._totals()
        self._refuse(calls, used, spent, None)

    def _totals(self) -> tuple[int, int, float]:
        if (
            self.options.max_model_calls is None
            and self.options.max_tokens is None
            and self.options.max_cost_usd is None
        ):
            return 0, 0, 0.0
        return self.store.usage_totals(self.run_id)

    def _refuse(self, calls: int, used: int, spent: float, reservation: Reservation | None) -> None:
        """Raise when the run's budgets are used up, or `reservation` cannot fit what is left of them."""
        limit, tokens, dollars = (
            self.options.max_model_calls,
            self.options.max_tokens,
            self.options.max_cost_usd,
        )
        in_flight = self._in_flight if reservation is not None else 0
        if limit is not None and calls + in_flight >= limit:
            raise BudgetExceededError(
                f"the run used its budget of {limit} model calls", budget="max_model_calls"
            )
        if tokens is not None and used >= tokens:
            raise BudgetExceededError(
                f"the run used its budget of {tokens:,} tokens ({used:,} used)", budget="max_tokens"
            )
        if dollars is not None and spent >= dollars:
            raise BudgetExceededError(
                f"the run used its money budget of ${dollars:g} (${spent:.4f} spent)", budget="max_cost_usd"
            )
        if reservation is None:
            return
        if tokens is not None and used + reservation.tokens > tokens:
            raise BudgetExceededError(
                f"the run's budget of {tokens:,} tokens cannot take its next model request: it may use "
                f"up to {reservation.tokens:,} tokens ({reservation.input_tokens:,} in, "
                f"{reservation.output_tokens:,} out) and {tokens - used:,} are left",
                budget="max_tokens",
            )
        if dollars is not None and spent + reservation.cost_usd > dollars:
            raise BudgetExceededError(
                f"the run's money budget of ${dollars:g} cannot take its next model request: it may cost "
                f"up to ${reservation.cost_usd:.4f} and ${dollars - spent:.4f} is left",
                budget="max_cost_usd",
            )


DEFAULT_OUTPUT_TOKENS = 4096
"""Output tokens reserved for a request that sets no limit, of a model that states none.

Under a money budget the request is sent with this as its `max_tokens`, so the provider stops
there; under a token budget alone it is only reserved (see `reservation_for`)."""
_MESSAGE_TOKENS = 16
"""Tokens reserved per message and per tool definition beyond its text (roles, a chat template)."""
_MEDIA_TOKENS = 2_000
"""Tokens reserved for an image or other file in a prompt."""


def reservation_for(
    model: Model,
    messages: list[ModelMessage],
    settings: ModelSettings | None,
    params: ModelRequestParameters,
    *,
    bounded: bool,
) -> tuple[Reservation, ModelSettings | None]:
    """The most a request may use, and the settings to send it with.

    Input: a token per byte of the request's text (its messages, tool definitions and output
    schema) plus `_MESSAGE_TOKENS` each: tokenizers make a token of a byte or more. Output: the
    request's `max_tokens`, else the model's own cap (a GGUF model's), else
    `DEFAULT_OUTPUT_TOKENS`, sent as `max_tokens` when `bounded` (a money budget). Priced from
    the price table as the request will be (nothing for a model that runs here).
    """
    merged: dict[str, object] = {**(getattr(model, "settings", None) or {}), **(settings or {})}
    output = merged.get("max_tokens")
    if not isinstance(output, int):
        cap = innermost(model).profile.get(MAX_OUTPUT_TOKENS)
        output = cap if isinstance(cap, int) and cap > 0 else DEFAULT_OUTPUT_TOKENS
        if bounded and not isinstance(cap, int):
            settings = cast("ModelSettings", {**(settings or {}), "max_tokens": output})
    input_tokens = _request_bytes(messages, params)
    cost = price_of(model, input_tokens, output) or 0.0
    return Reservation(input_tokens=input_tokens, output_tokens=output, cost_usd=cost), settings


def _request_bytes(messages: list[ModelMessage], params: ModelRequestParameters) -> int:
    total = _MESSAGE_TOKENS * 4
    for message in messages:
        total += _MESSAGE_TOKENS + _size(getattr(message, "instructions", None))
        for part in message.parts:
            total += _MESSAGE_TOKENS // 4 + _part_size(part)
    tools = [*params.function_tools, *params.output_tools]
    for tool in tools:
        total += _MESSAGE_TOKENS + _size(tool.name) + _size(tool.description)
        total += _size(json.dumps(tool.parameters_json_schema))
    if params.output_object is not None:
        total += _MESSAGE_TOKENS + _size(json.dumps(params.output_object.json_schema))
    return total


def _part_size(part: object) -> int:
    if isinstance(part, ToolCallPart):
        return _size(part.tool_name) + _size(part.args_as_json_str())
    if isinstance(part, ToolReturnPart):
        return _size(part.tool_name) + _size(part.model_response_str())
    if isinstance(part, RetryPromptPart):
        return _size(part.model_response())
    return _size(getattr(part, "content", None))


def _size(content: object) -> int:
    """Bytes of a text, or of each text in a prompt's contents (`_MEDIA_TOKENS` for anything else)."""
    if content is None:
        return 0
    if isinstance(content, str):
        return len(content.encode("utf-8", "surrogatepass"))
    if isinstance(content, list | tuple):
        return sum(_size(item) for item in content)
    return _MEDIA_TOKENS
