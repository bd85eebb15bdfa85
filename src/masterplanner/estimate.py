"""What a plan will likely cost before it runs: model calls, tokens, time, and money when known.

A rough guide for the review, from two things only: the plan's shape and the calls the run has
made so far (planning and prompts), measured on this model and this machine. Each step is
counted as one model request, plus one when it has tools (a call and the answer after it); a
plan with several final steps adds the request that writes the answer. Tokens and seconds per
request are the run's own so far, split into input and output as the run's calls were. Money is
those tokens at the model's price (`models.pricing`: nothing for models that run here, the
maintained price table for hosted ones; unknown when the table lacks the model).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from .usage import counted, money

__all__ = ["RunEstimate", "estimate_run"]

_REQUESTS = "one request a step, two with tools"


@dataclass(frozen=True)
class RunEstimate:
    """The expected cost of running a plan's steps (planning already spent is not included)."""

    model_calls: int
    tokens: int | None
    """None until the run has made a call to measure by."""
    seconds: float | None
    """Wall time with the steps' parallelism; None until the run has made a call to measure by."""
    cost: str | None
    """What those tokens cost (`$0.0123`; `$0.00` for models that run here); None when not known."""

    def basis(self) -> str:
        """What the estimate assumes, shown beside it, of the figures it shows.

        Without a call to measure by, it shows no tokens or time: it says when it will (it
        explained "tokens and time a request as this run's calls so far" it did not show).
        """
        if self.tokens is None:
            return f"{_REQUESTS}; tokens and time are estimated once this run has made a model call"
        return f"{_REQUESTS}; tokens and time a request as this run's calls so far"

    def text(self) -> str:
        """`about 4 model calls, 400 tokens, 5.3 s, cost $0.00`, as the reviews show it (`1 model call`)."""
        parts = [f"about {counted(self.model_calls, 'model call')}"]
        if self.tokens is not None:
            parts += [counted(self.tokens, "token"), f"{self.seconds} s"]
        parts.append(f"cost {self.cost}" if self.cost else "cost not known for this model")
        return ", ".join(parts)


def _levels(steps: list[Mapping[str, Any]]) -> list[int]:
    """How many steps sit at each depth of the graph (what can run side by side)."""
    ids = {step["id"] for step in steps}
    after = {step["id"]: [dep for dep in step.get("depends_on", []) if dep in ids] for step in steps}
    depth: dict[str, int] = {}
    for _ in range(len(steps) + 1):  # relax until stable (a plan is acyclic; a cycle just stops)
        for step_id, deps in after.items():
            depth[step_id] = 1 + max((depth.get(dep, 0) for dep in deps), default=-1)
    counts: dict[int, int] = {}
    for level in depth.values():
        counts[level] = counts.get(level, 0) + 1
    return [counts[level] for level in sorted(counts)]


def estimate_run(
    plan: Mapping[str, Any],
    usage: Mapping[str, Any],
    model: str,
    *,
    max_parallel: int = 4,
    done: Collection[str] = (),
) -> RunEstimate:
    """The estimate for `plan` (public JSON form), measured by `usage` (a run's usage report).

    `done`: the ids of steps that have run and will not again (at a replan): not counted, and
    their dependents wait for nothing (a replan was estimated as the whole plan).
    """
    steps: list[Mapping[str, Any]] = [step for step in plan.get("steps") or [] if step["id"] not in done]
    depended = {dep for step in steps for dep in step.get("depends_on", [])}
    sinks = [step for step in steps if step["id"] not in depended]
    per_step = [1 + (1 if step.get("tools") else 0) for step in steps]
    calls = sum(per_step) + (1 if len(sinks) > 1 else 0)
    # answered calls: a failed one (counted toward the call budget) says nothing of tokens or time
    made = int(usage.get("llm_calls") or 0) - int(usage.get("failed_calls") or 0)
    if not made:
        return RunEstimate(calls, None, None, _money(model, 0, 0))
    input_tokens, output_tokens = int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)
    tokens_per_call = (input_tokens + output_tokens) / made
    seconds_so_far = sum(
        float(entry.get("seconds") or 0) for entry in (usage.get("by_purpose") or {}).values()
    )
    seconds_per_call = seconds_so_far / made
    # each level of the graph runs side by side, up to max_parallel steps at once
    rounds = sum(-(-width // max(1, max_parallel)) for width in _levels(steps))
    mean_requests = sum(per_step) / len(per_step) if per_step else 0
    seconds = seconds_per_call * (rounds * mean_requests + (1 if len(sinks) > 1 else 0))
    scale = calls / made
    spent = _money(model, round(input_tokens * scale), round(output_tokens * scale))
    return RunEstimate(calls, round(tokens_per_call * calls), round(seconds, 1), spent)


def _money(model: str, input_tokens: int, output_tokens: int) -> str | None:
    from .models.pricing import costs_nothing, estimated_cost

    base_url = os.environ.get("OPENAI_BASE_URL")
    if not input_tokens + output_tokens:  # nothing measured yet: only a model that costs nothing is known
        return money(0.0) if costs_nothing(model, base_url=base_url) else None
    dollars = estimated_cost(model, input_tokens, output_tokens, base_url=base_url)
    return None if dollars is None else money(dollars)
