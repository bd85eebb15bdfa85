"""What the REST API takes: the request bodies of its routes, strict, with their bounds in the schema.

The options' defaults and bounds are `RunOptions`'s and `engine.records`'s, so `/openapi.json`
states the same limits the engine checks; a value out of them is the API's 422, each problem
naming its field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, JsonValue, field_validator

from ..engine.records import BUDGET_LIMITS, SECONDS_OPTION_LIMITS, WHOLE_OPTION_LIMITS, RunOptions
from ..engine.requests import ANSWER_TEXT_CHARS
from ..plan import MAX_TASK_CHARS
from ..tools import BUILTIN_TOOL_NAMES
from ..tools.team import TEAM_TOOL_NAMES

__all__ = [
    "AnswerIn",
    "FeedbackIn",
    "RetryIn",
    "RunIn",
    "RunOptionsIn",
    "Whole",
    "workspace_path",
]


def _integral(value: object) -> object:
    """A float with no fraction as the whole number it is (JSON Schema counts 4.0 as an integer)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


Whole = Annotated[int, BeforeValidator(_integral)]
"""A whole number in the strict request models (anything else, text included, is refused)."""
_DEFAULT = RunOptions()
"""The options' defaults and bounds are `RunOptions`'s and `engine.records`'s (one place for each)."""


def _whole_option(name: str, description: str) -> Any:
    """The field of a whole-number option: the run's default, the engine's bounds."""
    low, high = WHOLE_OPTION_LIMITS[name]
    return Field(default=getattr(_DEFAULT, name), ge=low, le=high, description=description)


def _budget(name: str, description: str) -> Any:
    """The field of a budget: the run's default, at most `BUDGET_LIMITS`; a count is at least 1."""
    most, default = BUDGET_LIMITS[name], getattr(_DEFAULT, name)
    if name in ("max_model_calls", "max_tokens"):
        return Field(default=default, ge=1, le=most, description=description)
    return Field(default=default, gt=0, le=most, description=description)


_SHIPPED_TOOLS: list[JsonValue] = [*sorted([*BUILTIN_TOOL_NAMES, *TEAM_TOOL_NAMES])]
"""The tool names the API's schema states for `tool_policies` (an MCP server's are named at run time)."""


class RunOptionsIn(BaseModel):
    """How a new run executes (the `masterplanner run` flags)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    max_parallel: Whole = _whole_option("max_parallel", "Steps running at once.")
    auto_approve: bool = Field(default=False, description="Approve the plan, tool calls, storing the team.")
    prompt_rounds: Whole = _whole_option("prompt_rounds", "Critique-and-revise rounds a prompt.")
    step_timeout_s: float = Field(
        default=_DEFAULT.step_timeout_s,
        gt=0,
        le=SECONDS_OPTION_LIMITS["step_timeout_s"],
        description="Seconds a step attempt may take, not counting waits for a person's answer.",
    )
    max_model_calls: Whole = _budget("max_model_calls", "Model calls in the run.")
    max_tokens: Whole = _budget("max_tokens", "Tokens in the run.")
    max_wall_s: float = _budget("max_wall_s", "Seconds of execution.")
    max_cost_usd: float | None = _budget("max_cost_usd", "US dollars the run's model calls may cost.")
    max_replans: Whole = _whole_option("max_replans", "Replans of failed steps.")
    check_outputs: bool = Field(default=False, description="Check outputs against expected outputs.")
    team_tools: bool | None = Field(default=None, description="Team tools for step agents (None: by model).")
    tool_policies: dict[str, Literal["auto", "ask", "deny"]] = Field(
        default_factory=dict,
        description=(
            "Approval policy by tool name, over the settings': a shipped tool's name, or "
            "<server>_<tool> for a configured MCP server's (another name is refused)."
        ),
        # the shipped tools' names; an MCP server's tools are named at run time
        json_schema_extra={"propertyNames": {"enum": _SHIPPED_TOOLS}},
    )


class RunIn(BaseModel):
    """A new run: the task, and optionally the model, the workspace folder and the options."""

    model_config = ConfigDict(extra="forbid", strict=True)

    task: str = Field(min_length=1, max_length=MAX_TASK_CHARS)
    model: str | None = Field(
        default=None, min_length=1, max_length=2_000, description="Model spec (left out: the setting)."
    )
    workspace: str | None = Field(
        default=None,
        max_length=4_096,
        description="Folder on the server, as an absolute path.",
        # stated in the schema; checked by `_absolute`, in our words
        json_schema_extra={"pattern": "^/"},
    )
    options: RunOptionsIn = Field(default_factory=lambda: RunOptionsIn.model_validate({}))

    @field_validator("workspace")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        # a relative one would be resolved against wherever the server was started
        return value if value is None else workspace_path(value)


def workspace_path(value: str) -> str:
    """`value` as a workspace folder on the server; ValueError unless absolute (or under `~`)."""
    # a relative one would be resolved against wherever the server was started; `~` is the
    # server's user's home, as on the command line (the engine expands it)
    if not (value.startswith("/") or value == "~" or value.startswith("~/")) or "\x00" in value:
        raise ValueError(f"must be an absolute path on the server, got {value[:200]!r}")
    return value


class AnswerIn(BaseModel):
    """An answer: `approve` (with a `reason` when false), a `text`, or a whole `decision`.

    A `decision` answers a plan review or a replan with edits: `{"action": "approve", "plan":
    …, "agents": …, "tool_policies": …}` or `{"action": "reject", "reason": …}`.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    approve: bool | None = None
    text: str | None = Field(default=None, max_length=ANSWER_TEXT_CHARS)
    reason: str | None = Field(default=None, max_length=ANSWER_TEXT_CHARS)
    decision: dict[str, Any] | None = None


class RetryIn(BaseModel):
    """New budgets and critique rounds for a retried run (each left out keeps the run's)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    # the bounds before the whole-number check, so the schema states them (`minimum`, `maximum`)
    max_model_calls: (
        Annotated[int, Field(ge=1, le=BUDGET_LIMITS["max_model_calls"]), BeforeValidator(_integral)] | None
    ) = Field(default=None, description="Model calls in the run.")
    max_tokens: (
        Annotated[int, Field(ge=1, le=BUDGET_LIMITS["max_tokens"]), BeforeValidator(_integral)] | None
    ) = Field(default=None, description="Tokens in the run.")
    max_wall_s: Annotated[float, Field(gt=0, le=BUDGET_LIMITS["max_wall_s"])] | None = Field(
        default=None, description="Seconds of execution from the retry."
    )
    max_cost_usd: Annotated[float, Field(gt=0, le=BUDGET_LIMITS["max_cost_usd"])] | None = Field(
        default=None, description="US dollars the run's model calls may cost."
    )
    prompt_rounds: (
        Annotated[
            int,
            Field(ge=WHOLE_OPTION_LIMITS["prompt_rounds"][0], le=WHOLE_OPTION_LIMITS["prompt_rounds"][1]),
            BeforeValidator(_integral),
        ]
        | None
    ) = Field(
        default=None,
        description=(
            "Critique-and-revise rounds a prompt written from now (a prompt kept from planning "
            "under other rounds is written again)."
        ),
    )


class FeedbackIn(BaseModel):
    """A person's rating of a finished run (1-5) and, optionally, what they would change."""

    model_config = ConfigDict(extra="forbid", strict=True)

    rating: Whole = Field(ge=1, le=5)
    comment: str = Field(default="", max_length=4_000)
