"""Usage accounting per purpose: calls, tokens and seconds spent in the model."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass

__all__ = ["PurposeUsage", "UsageLedger"]


@dataclass
class PurposeUsage:
    """What the calls of one purpose cost."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    seconds: float = 0.0


class UsageLedger:
    """Adds up model usage by purpose; safe to share between tasks and threads."""

    records_blocking = False
    """Whether `record` does blocking I/O (a database write): callers on an event loop then run
    it in a worker thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_purpose: dict[str, PurposeUsage] = {}

    def record(self, purpose: str, *, input_tokens: int, output_tokens: int, seconds: float) -> None:
        """Count one model call."""
        with self._lock:
            entry = self._by_purpose.setdefault(purpose, PurposeUsage())
            entry.calls += 1
            entry.input_tokens += input_tokens
            entry.output_tokens += output_tokens
            entry.seconds += seconds

    def merge(self, by_purpose: Mapping[str, Mapping[str, int | float]]) -> None:
        """Add usage reported elsewhere in the `by_purpose` form (e.g. read back from a results file)."""
        with self._lock:
            for purpose, usage in by_purpose.items():
                entry = self._by_purpose.setdefault(purpose, PurposeUsage())
                entry.calls += int(usage.get("calls", 0))
                entry.input_tokens += int(usage.get("input_tokens", 0))
                entry.output_tokens += int(usage.get("output_tokens", 0))
                entry.seconds += float(usage.get("seconds", 0.0))

    def by_purpose(self) -> dict[str, dict[str, int | float]]:
        """`{"<purpose>": {"calls", "input_tokens", "output_tokens", "seconds"}}`, sorted by purpose."""
        with self._lock:
            return {
                purpose: asdict(entry) | {"seconds": round(entry.seconds, 3)}
                for purpose, entry in sorted(self._by_purpose.items())
            }

    def totals(self) -> PurposeUsage:
        """The sum over all purposes."""
        with self._lock:
            total = PurposeUsage()
            for entry in self._by_purpose.values():
                total.calls += entry.calls
                total.input_tokens += entry.input_tokens
                total.output_tokens += entry.output_tokens
                total.seconds += entry.seconds
            return total

    def summary(self) -> dict[str, object]:
        """The usage object runs report: totals plus `by_purpose`."""
        total = self.totals()
        return {
            "llm_calls": total.calls,
            "input_tokens": total.input_tokens,
            "output_tokens": total.output_tokens,
            "by_purpose": self.by_purpose(),
        }
