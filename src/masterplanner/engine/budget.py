"""A run's usage: counted into the run store, and held to the run's call, token and money budgets.

The budgets hold for the run, not for one process: before every model request the counts are
read back from the run store, so steps of one run executing in several processes share them.
Each request also reserves its worst case before it is made (`Reservation`: the tokens it may use
and what they may cost), stored in the run store (`mp_reservations`) until its real usage is,
so requests made at once, in this process or any other, cannot together pass a budget each fits
alone. A request whose worst case cannot fit what is left even alone is sent with a lower output
limit (at least `LEAST_OUTPUT_TOKENS`) rather than failing the run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import uuid
from dataclasses import dataclass, replace
from typing import Protocol, cast

from pydantic_ai.messages import ModelMessage, RetryPromptPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.settings import ModelSettings

from ..errors import BudgetExceededError, RunError
from ..models import MAX_OUTPUT_TOKENS
from ..models.pricing import innermost, price_of
from ..usage import UsageLedger, budget_money, money
from .records import RunOptions
from .store import RunStore, Spending, process_identity

__all__ = [
    "DEFAULT_OUTPUT_TOKENS",
    "LEAST_OUTPUT_TOKENS",
    "UNKNOWN_PRICE",
    "RequestBudget",
    "Reservation",
    "RunLedger",
    "reservation_for",
]

_log = logging.getLogger("masterplanner.budget")

UNKNOWN_PRICE = "a money budget cannot hold a reply of unknown price"
"""Why a run under a money budget stops after such a reply: a larger budget does not help."""


@dataclass(frozen=True)
class Reservation:
    """The most one model request may use: its input and output tokens, and what they may cost."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    least_output_tokens: int | None = None
    """The fewest output tokens the request may be sent with when its worst case cannot fit what is
    left of a budget (`LEAST_OUTPUT_TOKENS`, or its own limit when lower); None: only as it is."""
    input_cost_usd: float = 0.0
    """What its input alone may cost: the rest of `cost_usd` is its output's, at one price a token."""

    @property
    def tokens(self) -> int:
        """Input and output tokens together."""
        return self.input_tokens + self.output_tokens

    def least(self) -> Reservation:
        """The request at the fewest output tokens it may be sent with (itself when it may not be cut)."""
        least = self.least_output_tokens
        return self if least is None or least >= self.output_tokens else self.lowered(least)

    def lowered(self, output_tokens: int) -> Reservation:
        """The request sent with `output_tokens` as its output limit, priced at its output's rate."""
        if output_tokens == self.output_tokens:
            return self
        cost = self.input_cost_usd + self._output_price * output_tokens
        return replace(self, output_tokens=output_tokens, cost_usd=cost)

    def output_room(self, tokens_left: int | None, dollars_left: float | None) -> int:
        """The most output tokens it may be sent with, given what is left of each budget (None: none)."""
        room = self.output_tokens
        if tokens_left is not None:
            room = min(room, tokens_left - self.input_tokens)
        if dollars_left is not None and self._output_price > 0:
            room = min(room, math.floor((dollars_left - self.input_cost_usd) / self._output_price))
        return room

    @property
    def _output_price(self) -> float:
        """What an output token may cost, in US dollars."""
        return (self.cost_usd - self.input_cost_usd) / self.output_tokens if self.output_tokens else 0.0


class RequestBudget(Protocol):
    """What a model holding its requests to a run's budgets needs (`RunLedger` is one)."""

    options: RunOptions

    def reserve(self, reservation: Reservation) -> Reservation | None: ...  # noqa: D102
    def settle(self, reservation: Reservation, tokens: int, cost_usd: float | None) -> None: ...  # noqa: D102
    def release(self, reservation: Reservation) -> None: ...  # noqa: D102
    def note_wait(self, reservation: Reservation, purpose: str | None) -> None: ...  # noqa: D102
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
        self._owner: str | None = None
        self._held: dict[Reservation, list[str]] = {}
        """This process's stored reservations not answered yet, by their figures (equal ones are alike)."""
        self._waiting: set[Reservation] = set()
        """Reservations told to wait: asked again, a read of the store decides until they may fit."""
        self._answered: list[tuple[str, int, float, int, float]] = []
        """Those answered and not counted yet: `(key, tokens, cost, tokens and cost held beyond them)`."""

    @property
    def _budgeted(self) -> bool:
        return (
            self.options.max_model_calls is not None
            or self.options.max_tokens is not None
            or self.options.max_cost_usd is not None
        )

    def record(
        self,
        purpose: str,
        *,
        input_tokens: int,
        output_tokens: int,
        seconds: float,
        cost_usd: float | None = 0.0,
        failed: bool = False,
    ) -> None:
        """Count one model call, in memory and in the run store, dropping its reservation there too.

        A `failed` call (made, and not answered) counts toward the call budget like any other.
        When the usage cannot be stored, the reservation is still dropped (its own transaction):
        it was held until this process's lease lapsed, all the while it went on running.
        """
        super().record(
            purpose,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            seconds=seconds,
            cost_usd=cost_usd,
            failed=failed,
        )
        tokens, cost = input_tokens + output_tokens, cost_usd or 0.0
        request = uuid.uuid4().hex  # one key for the write and its repeats (`reconnecting`): counted once
        with self._lock:  # taken off before the store drops its row: a check meanwhile holds more, not less
            key = next((entry[0] for entry in self._answered if entry[1:3] == (tokens, cost)), None)
            self._answered = [entry for entry in self._answered if entry[0] != key]
        try:
            self.store.add_usage(
                self.run_id,
                purpose,
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                seconds=seconds,
                cost_usd=cost_usd,
                failed=failed,
                request=request,
                reservation=key,
            )
        except BaseException:
            if key is not None:
                _unreserve(self.store, key)
            raise

    def reserve(self, reservation: Reservation) -> Reservation | None:
        """Hold `reservation` for one request about to be made (one transaction in the run store).

        The run's usage and the reservations of its requests in flight in every process are read
        together, one check at a time for the run (`RunStore.reserve`). Returns what is held,
        until `record` counts its real usage (or `release` drops it): `reservation` itself, or,
        when its worst case cannot fit what is left of the budgets even alone, the request cut to
        the output tokens left beside those in flight (at least its `least()`: send it with that
        `max_tokens`). None: it fits the run's budgets but not beside the requests in flight; ask
        again once one of those is counted (their real usage is usually less than reserved).
        Raises `BudgetExceededError` naming the budget when it cannot fit even at its least.
        """
        if not self._budgeted:
            return reservation
        with self._lock:
            waiting = reservation in self._waiting
        if waiting and self._hold(self.store.spending(self.run_id), reservation) is None:
            return None  # asked again while it waits: a read tells, the lock only once it may fit
        key = uuid.uuid4().hex

        def hold(spending: Spending) -> tuple[int, float] | None:
            held = self._hold(spending, reservation)
            return None if held is None else (held.tokens, held.cost_usd)

        stored = self.store.reserve(self.run_id, key, owner=self._process(), hold=hold)
        held = None
        if stored is not None:  # as stored (a retry of a reserve whose commit went unacknowledged too)
            tokens, cost = stored
            held = replace(reservation, output_tokens=tokens - reservation.input_tokens, cost_usd=cost)
        with self._lock:
            if held is not None:
                self._held.setdefault(held, []).append(key)
                self._waiting.discard(reservation)
            else:
                self._waiting.add(reservation)
        return held

    def _hold(self, spending: Spending, reservation: Reservation) -> Reservation | None:
        """What to hold for `reservation` given `spending`: itself, cut to fit, or None (it waits)."""
        self._refuse(
            spending.calls,
            spending.tokens,
            spending.cost_usd,
            reservation,
            spending.held_calls,
            unpriced=spending.unpriced_calls,
        )
        with self._lock:  # read after the store's rows: an answer counted meanwhile is not subtracted
            held_tokens = spending.held_tokens - sum(entry[3] for entry in self._answered)
            held_cost = spending.held_cost_usd - sum(entry[4] for entry in self._answered)
        tokens, dollars = self.options.max_tokens, self.options.max_cost_usd
        if not self._over(spending.tokens, spending.cost_usd, reservation):  # its worst case fits alone
            beside = self._over(spending.tokens + held_tokens, spending.cost_usd + held_cost, reservation)
            return None if beside else reservation
        # it cannot fit whole even once those in flight are counted: cut to what is left beside them
        room = reservation.output_room(
            None if tokens is None else tokens - spending.tokens - held_tokens,
            None if dollars is None else dollars - spending.cost_usd - held_cost,
        )
        least = reservation.least().output_tokens
        if spending.held_calls == 0:
            # alone, its least fits (`_refuse` said so): sent at least at it, as the room worked out
            # from the dollars left may round to a token less (it waited for ever, nothing in flight)
            return reservation.lowered(max(room, least))
        return reservation.lowered(room) if room >= least else None

    def _over(self, used: int, spent: float, reservation: Reservation) -> bool:
        """Whether `reservation` passes a token or money budget beside `used` tokens and `spent` dollars."""
        tokens, dollars = self.options.max_tokens, self.options.max_cost_usd
        return (tokens is not None and used + reservation.tokens > tokens) or (
            dollars is not None and spent + reservation.cost_usd > dollars
        )

    def note_wait(self, reservation: Reservation, purpose: str | None) -> None:
        """Record that a request of `purpose` starts to wait for room in a budget (`reserve` said None).

        A `model_waiting` event (of the step, for a step's request): the purpose, the budget that
        cannot hold it beside the requests in flight (`max_tokens` or `max_cost_usd`) and how many
        of those it waits for to be counted. The event only tells: when the run store cannot take
        it, that is logged and the request waits all the same (before, the failure failed it).
        """
        try:
            self._note_wait(reservation, purpose or "")
        except RunError as error:
            _log.warning(
                "run %s: could not store the model_waiting event of a model request of %s (it waits "
                "for room in the run's budgets all the same): %s",
                self.run_id,
                purpose or "no purpose",
                error,
            )

    def _note_wait(self, reservation: Reservation, label: str) -> None:
        spending = self.store.spending(self.run_id)
        tokens, dollars = self.options.max_tokens, self.options.max_cost_usd
        short_of_money = dollars is not None and (
            spending.cost_usd + spending.held_cost_usd + reservation.cost_usd > dollars
        )
        short_of_tokens = tokens is not None and (
            spending.tokens + spending.held_tokens + reservation.tokens > tokens
        )
        money = tokens is None or (short_of_money and not short_of_tokens)
        budget = "max_cost_usd" if money else "max_tokens"
        data = {"purpose": label, "budget": budget, "in_flight": spending.held_calls}
        step = label.removeprefix("step:") if label.startswith("step:") else None
        self.store.append_event(self.run_id, "model_waiting", step, data)

    def settle(self, reservation: Reservation, tokens: int, cost_usd: float | None) -> None:
        """The reserved request was answered: this process holds its real usage instead until `record`.

        Other processes hold its reservation until then (a moment: one write less per request).
        """
        with self._lock:
            key = self._take(reservation)
            if key is not None:
                cost = cost_usd or 0.0
                self._answered.append(
                    (key, tokens, cost, reservation.tokens - tokens, reservation.cost_usd - cost)
                )

    def release(self, reservation: Reservation) -> None:
        """The reserved request was not answered (it failed or was cancelled): nothing was used."""
        with self._lock:
            key = self._take(reservation)
        if key is not None:
            self.store.unreserve(key)

    def _take(self, reservation: Reservation) -> str | None:
        keys = self._held.get(reservation)
        if not keys:
            return None
        key = keys.pop(0)
        if not keys:
            del self._held[reservation]
        return key

    def _process(self) -> str:
        """This process's `mp_processes` id (its DBOS executor id), under which it reserves.

        A process that has not launched DBOS has no lease there: its reservations are never
        dropped by others, only by itself.
        """
        if self._owner is None:
            from .runtime import executor_id  # DBOS is imported only by the processes executing runs

            self._owner = executor_id() or process_identity()
        return self._owner

    def check(self) -> None:
        """Raise `BudgetExceededError` if the run has no model calls, tokens or money left (a query)."""
        calls, used, spent, unpriced = self._totals()
        self._refuse(calls, used, spent, None, unpriced=unpriced)

    def _totals(self) -> tuple[int, int, float, int]:
        return self.store.usage_totals(self.run_id) if self._budgeted else (0, 0, 0.0, 0)

    def _refuse(
        self,
        calls: int,
        used: int,
        spent: float,
        reservation: Reservation | None,
        in_flight: int = 0,
        *,
        unpriced: int = 0,
    ) -> None:
        """Raise when the run's budgets are used up, or `reservation` cannot fit what is left of them.

        `in_flight`: the run's requests held in flight, which count against the call budget.
        `unpriced`: the run's calls of unknown price, which a money budget cannot hold: the run
        stops at the next request after one (it let every such call through as free).
        """
        limit, tokens, dollars = (
            self.options.max_model_calls,
            self.options.max_tokens,
            self.options.max_cost_usd,
        )
        allowed = "" if dollars is None else budget_money(dollars)
        if limit is not None and calls + in_flight >= limit:
            calls_said = f"{limit} model call{'' if limit == 1 else 's'}"
            raise BudgetExceededError(f"the run used its budget of {calls_said}", budget="max_model_calls")
        if tokens is not None and used >= tokens:
            raise BudgetExceededError(
                f"the run used its budget of {tokens:,} tokens ({used:,} used)", budget="max_tokens"
            )
        if dollars is not None and spent >= dollars:
            raise BudgetExceededError(
                f"the run used its money budget of {allowed} ({money(spent)} spent)", budget="max_cost_usd"
            )
        if dollars is not None and unpriced:
            raise BudgetExceededError(
                f"{money(spent, unpriced)} spent under the run's money budget of {allowed}, and "
                f"{UNKNOWN_PRICE} (one that reported no usage, or that the price table cannot price)",
                budget="max_cost_usd",
            )
        if reservation is None:
            return
        least = reservation.least()  # what it needs at the least: its output cut to its least
        cut = least.output_tokens < reservation.output_tokens
        if tokens is not None and used + least.tokens > tokens:
            needs = (
                f"even with its output cut to {least.output_tokens:,} tokens it needs {least.tokens:,} "
                f"({least.input_tokens:,} in)"
                if cut
                else f"it may use up to {least.tokens:,} tokens ({least.input_tokens:,} in, "
                f"{least.output_tokens:,} out)"
            )
            raise BudgetExceededError(
                f"the run's budget of {tokens:,} tokens cannot take its next model request: {needs} "
                f"and {tokens - used:,} are left",
                budget="max_tokens",
            )
        if dollars is not None and spent + least.cost_usd > dollars:
            needs = (
                f"even with its output cut to {least.output_tokens:,} tokens it costs {money(least.cost_usd)}"
                if cut
                else f"it may cost up to {money(least.cost_usd)}"
            )
            raise BudgetExceededError(
                f"the run's money budget of {allowed} cannot take its next model request: {needs} "
                f"and {money(dollars - spent)} is left",
                budget="max_cost_usd",
            )


def _unreserve(store: RunStore, key: str) -> None:
    """Drop a reservation; a store that fails to leaves it to be dropped with this process's lease."""
    with contextlib.suppress(RunError):
        store.unreserve(key)


DEFAULT_OUTPUT_TOKENS = 4096
"""Output tokens reserved for a request that sets no limit, of a model that states none.

Under a money budget the request is sent with this as its `max_tokens`, so the provider stops
there; under a token budget alone it is only reserved (see `reservation_for`)."""
LEAST_OUTPUT_TOKENS = 1024
"""The fewest output tokens a request is cut to when its worst case cannot fit what is left of the
run's token or money budget (its own limit when lower): enough for a step's answer or a tool call
of some length; a request that cannot fit even so fails the run (`RunLedger.reserve`)."""
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
    `DEFAULT_OUTPUT_TOKENS`, sent as `max_tokens` when `bounded` (a money budget) and the model
    costs something (one that runs here is not cut short). Priced from
    the price table as the request will be (nothing for a model that runs here). It may be cut
    to `LEAST_OUTPUT_TOKENS` output tokens (fewer when its limit is lower) to fit a budget.
    """
    merged: dict[str, object] = {**(getattr(model, "settings", None) or {}), **(settings or {})}
    output = merged.get("max_tokens")
    input_tokens = _request_bytes(messages, params)
    if not isinstance(output, int):
        cap = innermost(model).profile.get(MAX_OUTPUT_TOKENS)
        output = cap if isinstance(cap, int) and cap > 0 else DEFAULT_OUTPUT_TOKENS
        cost = price_of(model, input_tokens, output) or 0.0
        # a model that costs nothing (Ollama, a server on this machine) is not cut short for money
        if bounded and not isinstance(cap, int) and cost > 0:
            settings = cast("ModelSettings", {**(settings or {}), "max_tokens": output})
    else:
        cost = price_of(model, input_tokens, output) or 0.0
    reservation = Reservation(
        input_tokens=input_tokens,
        output_tokens=output,
        cost_usd=cost,
        least_output_tokens=min(output, LEAST_OUTPUT_TOKENS),
        input_cost_usd=min(cost, price_of(model, input_tokens, 0) or 0.0),
    )
    return reservation, settings


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
    try:
        if isinstance(part, ToolCallPart):
            return _size(part.tool_name) + _size(part.args_as_json_str())
        if isinstance(part, ToolReturnPart):
            return _size(part.tool_name) + _size(part.model_response_str())
        if isinstance(part, RetryPromptPart):
            return _size(part.model_response())
    except ValueError:  # pydantic's JSON refuses a lone surrogate, which a model's tool call may hold
        assert isinstance(part, ToolCallPart | ToolReturnPart | RetryPromptPart)
        return _json_size(part)  # (the tool says so to the agent; the step failed here instead)
    return _size(getattr(part, "content", None))


_RETRY_TEXT = 64
"""Bytes a retry prompt adds to its errors ("Fix the errors and try again.", a code fence)."""


def _json_size(part: ToolCallPart | ToolReturnPart | RetryPromptPart) -> int:
    """Bytes of a part's contents as JSON, indented as a retry prompt's errors are, with a surrogate."""
    value = part.args if isinstance(part, ToolCallPart) else part.content
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str, indent=2)
    return _size(part.tool_name) + len(text.encode("utf-8", "surrogatepass")) + _RETRY_TEXT


def _size(content: object) -> int:
    """Bytes of a text, or of each text in a prompt's contents (`_MEDIA_TOKENS` for anything else)."""
    if content is None:
        return 0
    if isinstance(content, str):
        return len(content.encode("utf-8", "surrogatepass"))
    if isinstance(content, list | tuple):
        return sum(_size(item) for item in content)
    return _MEDIA_TOKENS
