"""A run's usage: counted into the run store, and held to the run's call, token and money budgets.

The budgets hold for the run, not for one process: the counts are read back from the run store
(one aggregate query) before every model request, so steps of one run executing in several
processes share them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import BudgetExceededError
from ..usage import UsageLedger
from .records import RunOptions
from .store import RunStore

__all__ = ["RunLedger"]


class RunLedger(UsageLedger):
    """Counts model usage into the run store and enforces the run's call and token budgets."""

    records_blocking = True

    def __init__(self, store: RunStore, run_id: str, options: RunOptions) -> None:
        super().__init__()
        self.store = store
        self.run_id = run_id
        self.options = options
        self._in_flight = 0
        self._lock = threading.Lock()

    def record(
        self,
        purpose: str,
        *,
        input_tokens: int,
        output_tokens: int,
        seconds: float,
        cost_usd: float | None = 0.0,
    ) -> None:
        """Count one model call, in memory and in the run store."""
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
        self._release()  # counted in the store now, no longer in flight

    @contextmanager
    def call(self) -> Iterator[None]:
        """One model call held to the budgets, the calls this process has in flight counted as made.

        Steps running at once each passed the check before any call had been counted: a budget
        of 7 calls made 10. Tokens and money are known only once a call returns, so those may
        still be passed by the calls in flight then (at most `max_parallel`).
        """
        with self._lock:  # one check at a time in this process, each seeing the others' reservations
            self._check(self._in_flight)
            self._in_flight += 1
        answered = False
        try:
            yield
            answered = True
        finally:
            if not answered:  # an answered call stays reserved until `record` has counted it
                self._release()

    def _release(self) -> None:
        with self._lock:
            self._in_flight = max(0, self._in_flight - 1)

    def check(self) -> None:
        """Raise `BudgetExceededError` if the run has no model calls, tokens or money left (a query)."""
        self._check(0)

    def _check(self, in_flight: int) -> None:
        limit, tokens, dollars = (
            self.options.max_model_calls,
            self.options.max_tokens,
            self.options.max_cost_usd,
        )
        if limit is None and tokens is None and dollars is None:
            return
        calls, used, spent = self.store.usage_totals(self.run_id)
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
