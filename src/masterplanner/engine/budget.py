"""A run's usage: counted into the run store, and held to the run's call and token budgets."""

from __future__ import annotations

from ..errors import BudgetExceededError
from ..usage import UsageLedger
from .records import RunOptions
from .store import RunStore

__all__ = ["RunLedger"]


class RunLedger(UsageLedger):
    """Counts model usage into the run store and enforces the run's call and token budgets."""

    def __init__(self, store: RunStore, run_id: str, options: RunOptions) -> None:
        super().__init__()
        self.store = store
        self.run_id = run_id
        self.options = options
        used = store.usage(run_id)
        self.calls = int(used["llm_calls"])
        self.tokens = int(used["input_tokens"]) + int(used["output_tokens"])

    def record(self, purpose: str, *, input_tokens: int, output_tokens: int, seconds: float) -> None:
        """Count one model call, in memory and in the run store."""
        super().record(purpose, input_tokens=input_tokens, output_tokens=output_tokens, seconds=seconds)
        self.calls += 1
        self.tokens += input_tokens + output_tokens
        self.store.add_usage(
            self.run_id, purpose, input_tokens=input_tokens, output_tokens=output_tokens, seconds=seconds
        )

    def check(self) -> None:
        """Raise `BudgetExceededError` if the run has no model calls or tokens left."""
        limit = self.options.max_model_calls
        if limit is not None and self.calls >= limit:
            raise BudgetExceededError(f"the run used its budget of {limit} model calls")
        tokens = self.options.max_tokens
        if tokens is not None and self.tokens >= tokens:
            raise BudgetExceededError(f"the run used its budget of {tokens:,} tokens ({self.tokens:,} used)")
