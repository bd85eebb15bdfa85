"""Purpose labels: every LLM call says what it is for.

Usage accounting, traces and the scripted test model all key on the label. The fixed labels are
`planner`, `replanner`, `adapter`, `prompt_creator`, `critic`, `aggregator`, `chat`, `feedback`
(the failure analysis after a low rating), `summarizer` (a long input summarised for the step
that reads it) and `checker` (whether a step's output meets its expected output); a step
agent's calls are labelled `step:<step-id>`, and a finished step consulted by another one
(`ask_agent`) answers under `consult:<step-id>`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["FIXED_PURPOSES", "current_purpose", "step_purpose", "using_purpose", "validate_purpose"]

FIXED_PURPOSES = frozenset(
    {
        "planner",
        "replanner",
        "adapter",
        "prompt_creator",
        "critic",
        "aggregator",
        "chat",
        "feedback",
        "summarizer",
        "checker",
    }
)
_STEP_PURPOSE = re.compile(r"(?:step|consult):[a-z0-9][a-z0-9_-]{0,63}")

_current: ContextVar[str | None] = ContextVar("masterplanner_purpose", default=None)


def validate_purpose(label: str) -> str:
    """Return `label` if it is a valid purpose label, else raise `ValueError`."""
    if label in FIXED_PURPOSES or _STEP_PURPOSE.fullmatch(label):
        return label
    raise ValueError(
        f"invalid purpose label {label!r}: use one of {', '.join(sorted(FIXED_PURPOSES))}, "
        "step:<step-id> or consult:<step-id>"
    )


def step_purpose(step_id: str) -> str:
    """The purpose label of a step agent's calls."""
    return validate_purpose(f"step:{step_id}")


def current_purpose() -> str | None:
    """The purpose of the model call being made in this context, if any."""
    return _current.get()


@contextmanager
def using_purpose(label: str) -> Iterator[str]:
    """Label the model calls made inside this block (and tasks started from it)."""
    token = _current.set(validate_purpose(label))
    try:
        yield label
    finally:
        _current.reset(token)
