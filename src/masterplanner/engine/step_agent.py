"""What a step agent is given: its prompt, a brief with its dependencies' outputs, its tools, its model."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings

from ..models.local import LocalModel, ToolAids
from ..plan import Plan, Step, sinks
from ..tools.workspace import Workspace
from ..working_memory import ContextBudget, FittedInput
from .records import RunOptions

__all__ = [
    "RUNNABLE_TOOLS",
    "BudgetedModel",
    "context_budget",
    "dependency_context",
    "mentioned_file_names",
    "step_brief",
    "step_instructions",
    "tool_aids",
]

_UNGROUNDED_CALLS = 2
"""Tool calls (failed ones included) after which an ungrounded small model must answer."""

RUNNABLE_TOOLS = (
    "code_execution",
    "read_file",
    "write_file",
    "list_files",
    "delete_file",
    "http_request",
    "web_search",
    "generate_image",
    "ask_user",
    "remember",
    "recall",
)
"""The catalog tools step agents can run."""

_FILE_NAME = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.[A-Za-z][A-Za-z0-9]{0,7})(?![\w/-])")


def mentioned_file_names(*texts: str) -> tuple[str, ...]:
    """File names like `haiku.txt` or `out/report.md` that the texts mention, in order, without repeats."""
    names: dict[str, None] = {}
    for text in texts:
        for match in _FILE_NAME.finditer(text):
            name = match.group(1)
            if not re.fullmatch(r"\d+\.\d+", name):
                names.setdefault(name, None)
    return tuple(names)


def tool_aids(plan: Plan, step: Step, tools: list[str], workspace: Workspace) -> ToolAids | None:
    """Tool-use aids for a small local model, grounded in the step's text and the workspace's files.

    The file names the step mentions (and, for a step nothing depends on, the task) split in two:
    those that exist may be read, those that do not may be written. The first call must be one
    of those reads or writes; with nothing grounded, the model only has to answer after a few
    tool calls (failed ones count).
    """
    texts = [step.title, step.instruction, step.expected_output]
    if step.id in sinks(plan.steps):
        texts.append(plan.task)
    names = mentioned_file_names(*texts)
    existing = tuple(name for name in names if workspace.is_file(name))
    fresh = tuple(name for name in names if name not in existing)
    values: dict[str, dict[str, tuple[str, ...]]] = {}
    if existing and "read_file" in tools:
        values["read_file"] = {"path": existing}
    if fresh and "write_file" in tools:
        values["write_file"] = {"path": fresh}
    if not values:
        # nothing to ground: at least stop the model from calling tools until the request cap
        return ToolAids(max_tool_calls=_UNGROUNDED_CALLS)
    return ToolAids(first_call_tools=tuple(values), argument_values=values, max_tool_calls=len(values))


def context_budget(options: RunOptions, model: Model) -> ContextBudget:
    """The run's working-memory budget, clamped to the window of an embedded model."""
    budget = ContextBudget(inputs_chars=options.context_chars, history_chars=options.history_chars)
    if isinstance(model, LocalModel):
        return budget.within(model.context_tokens, model.max_output_tokens)
    return budget


def dependency_context(inputs: Sequence[FittedInput]) -> str:
    """The dependencies' outputs as the brief shows them, each under its heading."""
    return "\n\n".join(f"{item.heading}\n{item.text}" for item in inputs)


def step_instructions(step: Step, prompt: str | None) -> str:
    """The agent's system prompt: the reviewed prompt, or one built from the step when there is none."""
    if prompt:
        return prompt
    return f"You are a {step.agent_role}. Do exactly the step you are given and report its result."


def step_brief(plan: Plan, step: Step, inputs: Sequence[FittedInput], *, tools: list[str]) -> str:
    """The user message of a step agent: the task, its step, what it must produce, and its inputs."""
    lines = [
        f"Overall task: {plan.task}",
        f"Your step ({step.id}): {step.title}",
        f"Instruction: {step.instruction}",
    ]
    if step.expected_output:
        lines.append(f"Expected output: {step.expected_output}")
    if tools:
        lines.append(f"Tools you can use: {', '.join(tools)}. Files live in the run's workspace.")
    context = dependency_context(inputs)
    if context:
        lines.append("Inputs from the steps before yours:\n\n" + context)
    lines.append("When you are done, reply with your step's result.")
    return "\n".join(lines)


class BudgetedModel(WrapperModel):
    """Checks the run's budget before every request (`check` raises when it is used up)."""

    def __init__(self, wrapped: Model, check: Callable[[], None]) -> None:
        super().__init__(wrapped)
        self._check = check

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        """Refuse the request if the budget is spent, else make it."""
        self._check()
        return await self.wrapped.request(messages, model_settings, model_request_parameters)
