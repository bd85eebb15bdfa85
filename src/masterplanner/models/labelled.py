"""`LabelledModel`: a model bound to one purpose label, recording its usage into a ledger."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from contextlib import AbstractContextManager, asynccontextmanager, nullcontext
from functools import partial
from typing import Any

from opentelemetry.trace import Span
from pydantic_ai import RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models import Model, ModelRequestParameters, StreamedResponse
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings

from ..errors import ConfigError, ModelError, RunError, ToolError
from ..purpose import current_purpose, using_purpose, validate_purpose
from ..telemetry import span as traced
from ..usage import UsageLedger
from .pricing import innermost, request_cost

__all__ = ["LabelledModel", "labelled", "made_and_failed"]


def made_and_failed(error: BaseException) -> bool:
    """Whether a request that raised `error` was made and failed, and so is counted as a failed call.

    A provider's failure (an HTTP error, no answer in time, a reply that could not be read, the
    retries given up: `ModelError`) is. Not counted: a cancel (the run stopping), our own
    refusals before the request is made, all `RunError`s (a budget that cannot take it, a run
    store that failed to reserve it), a model that cannot be asked as configured
    (`ConfigError`: a GGUF file that does not load, a key not set, a script that is malformed),
    and a step aid's turn that ends the step (`ToolError`: the files it is about cannot be read).
    """
    return isinstance(error, Exception) and not isinstance(error, RunError | ConfigError | ToolError)


class LabelledModel(WrapperModel):
    """Wraps a model so every request is made under `purpose` and counted in `ledger`.

    The purpose is visible to the wrapped model through `current_purpose()` (the scripted model
    picks its answer by it); calls, tokens, seconds and cost land in the ledger under the same label.
    A request that was made and failed (`made_and_failed`) is counted too, as a failed call of no
    tokens and no cost: it was made, so it counts toward the run's call budget.
    With `purpose` None it sets no purpose and counts each request under the one in effect (set
    by a labelled model further out): the engine puts such a counter inside its checkpoint, under
    the planner's own labelling, so a request replayed after a crash is not counted again.
    """

    def __init__(self, wrapped: Model, purpose: str | None, ledger: UsageLedger) -> None:
        super().__init__(wrapped)
        self.purpose = None if purpose is None else validate_purpose(purpose)
        self.ledger = ledger

    def _labelling(self) -> AbstractContextManager[object]:
        return nullcontext() if self.purpose is None else using_purpose(self.purpose)

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        """Make the request under this model's purpose and record its usage."""
        started = time.perf_counter()
        with self._labelling(), self._span() as span:
            try:
                response = await self.wrapped.request(messages, model_settings, model_request_parameters)
            except BaseException as error:
                if made_and_failed(error):
                    await self._recorded_failure(time.perf_counter() - started)
                raise
            cost = await self._recorded(response, time.perf_counter() - started)
            _usage_attributes(span, response, cost)
        return response

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncGenerator[StreamedResponse]:
        """Stream the request under this model's purpose; usage is recorded when the stream ends.

        A stream that fails to open is counted as a failed call (what fails once it is read is
        raised in the reader's code, which may be the reader's own error: not counted).
        """
        started = time.perf_counter()
        with self._labelling(), self._span() as span:
            opened = False
            try:
                async with self.wrapped.request_stream(
                    messages, model_settings, model_request_parameters, run_context
                ) as stream:
                    opened = True
                    yield stream
            except BaseException as error:
                if not opened and made_and_failed(error):
                    await self._recorded_failure(time.perf_counter() - started)
                raise
            cost = await self._recorded(stream.get(), time.perf_counter() - started)
            _usage_attributes(span, stream.get(), cost)

    def _span(self) -> AbstractContextManager[Span]:
        """The request's `chat` span (GenAI conventions: operation, provider, model, purpose)."""
        inner = innermost(self.wrapped)
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": inner.system,
            "gen_ai.request.model": inner.model_name,
            "masterplanner.purpose": self.purpose or current_purpose() or "",
        }
        return traced(f"chat {inner.model_name}", attributes)

    async def _recorded(self, response: ModelResponse, seconds: float) -> float | None:
        """Count the answered request in the ledger; its cost."""
        cost = request_cost(self.wrapped, response)
        await self._record(
            input_tokens=response.usage.input_tokens,
            output_tokens=response.usage.output_tokens,
            seconds=seconds,
            cost_usd=cost,
        )
        return cost

    async def _recorded_failure(self, seconds: float) -> None:
        """Count a request that was made and failed: a call, of no tokens and no cost (no reply said any)."""
        await self._record(input_tokens=0, output_tokens=0, seconds=seconds, cost_usd=0.0, failed=True)

    async def _record(
        self,
        *,
        input_tokens: int,
        output_tokens: int,
        seconds: float,
        cost_usd: float | None,
        failed: bool = False,
    ) -> None:
        """Count one request under the purpose in effect (in a thread when the ledger writes to a store)."""
        purpose = self.purpose or current_purpose()
        if purpose is None:
            raise ModelError("a model request was made with no purpose label (a bug: label the model)")
        record = partial(
            self.ledger.record,
            purpose,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            seconds=seconds,
            cost_usd=cost_usd,
            failed=failed,
        )
        if self.ledger.records_blocking:
            await asyncio.to_thread(record)
        else:
            record()


def _usage_attributes(span: Span, response: ModelResponse, cost: float | None) -> None:
    span.set_attribute("gen_ai.usage.input_tokens", response.usage.input_tokens)
    span.set_attribute("gen_ai.usage.output_tokens", response.usage.output_tokens)
    if response.model_name:
        span.set_attribute("gen_ai.response.model", response.model_name)
    if cost is not None:
        span.set_attribute("masterplanner.cost_usd", cost)


def labelled(model: Model, purpose: str, ledger: UsageLedger) -> LabelledModel:
    """Bind `model` to `purpose`, recording usage into `ledger`."""
    return LabelledModel(model, purpose, ledger)
