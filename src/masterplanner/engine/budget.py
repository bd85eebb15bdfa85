"""A run's usage: counted into the run store, and held to the run's call, token and money budgets.

The budgets hold for the run, not for one process: the counts are read back from the run store
(one aggregate query) before every model request, so steps of one run executing in several
processes share them.
"""

from __future__ import annotations

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

    def check(self) -> None:
        """Raise `BudgetExceededError` if the run has no model calls, tokens or money left (a query)."""
        limit, tokens, dollars = (
            self.options.max_model_calls,
            self.options.max_tokens,
            self.options.max_cost_usd,
        )
        if limit is None and tokens is None and dollars is None:
            return
        calls, used, spent = self.store.usage_totals(self.run_id)
        if limit is not None and calls >= limit:
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
