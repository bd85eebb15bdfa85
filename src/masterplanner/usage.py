"""Usage accounting per purpose: calls, tokens, seconds spent in the model, and money."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from decimal import Decimal

__all__ = ["PurposeUsage", "UsageLedger", "budget_money", "counted", "failed_note", "money", "noun_for"]


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`1 model call`, `2 model calls`, `1,234 tokens`: a count and its noun, plural unless it is 1.

    The plural is the noun with an `s`, or `plural` when that is wrong (`memory`, `memories`).
    """
    return f"{count:,} {noun_for(count, noun, plural)}"


def noun_for(count: int, noun: str, plural: str | None = None) -> str:
    """The noun for `count` things without the count, as `counted` says it: `step a`, `steps a, b`."""
    return noun if count == 1 else plural or f"{noun}s"


def failed_note(failed_calls: int) -> str:
    """` (2 failed)` after a count of calls some of which were made and failed; "" when none were."""
    return f" ({failed_calls:,} failed)" if failed_calls else ""


def money(cost_usd: float, unpriced_calls: int = 0) -> str:
    """`$0.0123`, saying how many calls had no known price (`4 calls of unknown price` when none had one).

    Less than a hundredth of a cent is `under $0.0001` (it was `$0.0000`, read as free).
    """
    unpriced = f"{counted(unpriced_calls, 'call')} of unknown price"
    if unpriced_calls and not cost_usd:  # was None: a summary then said nothing of cost at all
        return unpriced
    if 0 < cost_usd < 0.00005:  # what `.4f` shows as $0.0000
        text = "under $0.0001"
    else:
        text = f"${cost_usd:.2f}" if cost_usd == 0 or cost_usd >= 1 else f"${cost_usd:.4f}"
    return f"{text} + {unpriced}" if unpriced_calls else text


def budget_money(dollars: float) -> str:
    """A money budget as given, in plain decimals with cents at least: `$0.00001`, `$0.05`, `$1.00`.

    A budget is shown whole, not rounded as `money` rounds what was spent (its `under $0.0001`
    would hide how small it is); it was shown with `:g`, `$1e-05` for a thousandth of a cent.
    """
    text = format(Decimal(repr(float(dollars))), "f")  # the shortest decimal that is the float
    whole, _, cents = text.partition(".")
    return f"${whole}.{cents.rstrip('0').ljust(2, '0')}"


@dataclass
class PurposeUsage:
    """What the calls of one purpose cost."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    seconds: float = 0.0
    cost_usd: float = 0.0
    """What the calls with a known price cost, in US dollars (0 for models that run here)."""
    unpriced_calls: int = 0
    """Calls of a hosted model whose price is not known."""
    failed_calls: int = 0
    """Calls among `calls` that were made and failed (an HTTP error, no answer in time, a reply
    that could not be read): no reply said their tokens, so none are counted, nor any cost."""


class UsageLedger:
    """Adds up model usage by purpose; safe to share between tasks and threads."""

    records_blocking = False
    """Whether `record` does blocking I/O (a database write): callers on an event loop then run
    it in a worker thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_purpose: dict[str, PurposeUsage] = {}

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
        """Count one model call (`cost_usd` None: its price is not known; `failed`: it got no answer)."""
        with self._lock:
            entry = self._by_purpose.setdefault(purpose, PurposeUsage())
            entry.calls += 1
            entry.failed_calls += int(failed)
            entry.input_tokens += input_tokens
            entry.output_tokens += output_tokens
            entry.seconds += seconds
            if cost_usd is None:
                entry.unpriced_calls += 1
            else:
                entry.cost_usd += cost_usd

    def merge(self, by_purpose: Mapping[str, Mapping[str, int | float]]) -> None:
        """Add usage reported elsewhere in the `by_purpose` form (e.g. read back from a results file)."""
        with self._lock:
            for purpose, usage in by_purpose.items():
                entry = self._by_purpose.setdefault(purpose, PurposeUsage())
                entry.calls += int(usage.get("calls", 0))
                entry.input_tokens += int(usage.get("input_tokens", 0))
                entry.output_tokens += int(usage.get("output_tokens", 0))
                entry.seconds += float(usage.get("seconds", 0.0))
                entry.cost_usd += float(usage.get("cost_usd", 0.0))
                entry.unpriced_calls += int(usage.get("unpriced_calls", 0))
                entry.failed_calls += int(usage.get("failed_calls", 0))

    def by_purpose(self) -> dict[str, dict[str, int | float]]:
        """Each purpose's usage, sorted by purpose.

        `{"<purpose>": {"calls", "input_tokens", "output_tokens", "seconds", "cost_usd", "unpriced_calls",
        "failed_calls"}}`.
        """
        with self._lock:
            return {
                purpose: asdict(entry)
                | {"seconds": round(entry.seconds, 3), "cost_usd": round(entry.cost_usd, 6)}
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
                total.cost_usd += entry.cost_usd
                total.unpriced_calls += entry.unpriced_calls
                total.failed_calls += entry.failed_calls
            return total

    def summary(self) -> dict[str, object]:
        """The usage object runs report: totals plus `by_purpose`."""
        total = self.totals()
        return {
            "llm_calls": total.calls,
            "input_tokens": total.input_tokens,
            "output_tokens": total.output_tokens,
            "cost_usd": round(total.cost_usd, 6),
            "unpriced_calls": total.unpriced_calls,
            "failed_calls": total.failed_calls,
            "by_purpose": self.by_purpose(),
        }
