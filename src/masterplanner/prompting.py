"""The Prompt Creator: for each step, draft an agent system prompt, critique it, revise it.

A draft (purpose `prompt_creator`) gives the agent its role, goal, inputs from the steps it
depends on, how to use its tools and what to hand on. A critic call (purpose `critic`) scores it
against a rubric — clarity, completeness, tool fit, output format, 1 to 5 — and lists defects;
a revision (purpose `prompt_creator`) fixes them. `rounds` critique-and-revise rounds run per
step (default 1; 0 keeps the draft). Steps are processed concurrently. Draft, every critique and
the final prompt are kept so the review screen can show them. Each is the prompt alone: the
template's `<prompt>` tags and the writer's own words around it are dropped (`cleaned_prompt`),
and a revision with nothing else in it keeps the prompt before it.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from .errors import ConfigError, ModelError, nul_replaced
from .plan import Plan, Step
from .prompts import render
from .tools.catalog import Catalog
from .usage import UsageLedger

if TYPE_CHECKING:
    from pydantic_ai import Agent
    from pydantic_ai.models import Model

__all__ = [
    "DEFAULT_ROUNDS",
    "MAX_ROUNDS",
    "AgentPrompt",
    "Critique",
    "cleaned_prompt",
    "create_prompts",
    "prompts_to_json",
]

DEFAULT_ROUNDS = 1
MAX_ROUNDS = 5
_PROMPT_TOKENS = 700  # cap on one drafted or revised prompt


class Critique(BaseModel):
    """The critic's verdict on one prompt."""

    clarity: int = Field(ge=1, le=5, description="is it unambiguous?")
    completeness: int = Field(ge=1, le=5, description="role, goal, inputs, tools and output all covered?")
    tool_fit: int = Field(ge=1, le=5, description="does it say how to use exactly the step's tools?")
    output_format: int = Field(ge=1, le=5, description="does it say exactly what to hand on?")
    defects: list[str] = Field(
        default_factory=list, max_length=6, description="what to fix, most important first"
    )

    @property
    def score(self) -> float:
        """Mean of the four rubric scores."""
        return (self.clarity + self.completeness + self.tool_fit + self.output_format) / 4


@dataclass(frozen=True)
class AgentPrompt:
    """How one step's prompt came to be: the draft, each round's critique and revision, the final text."""

    step_id: str
    draft: str
    critiques: list[Critique] = field(default_factory=list)
    revisions: list[str] = field(default_factory=list)

    @property
    def final(self) -> str:
        """The prompt the step agent will get: the last revision, or the draft."""
        return self.revisions[-1] if self.revisions else self.draft

    def to_json_dict(self) -> dict[str, Any]:
        """JSON form: `prompt`, `critique` (the last one, or null), `draft`, and every round.

        The last critique is of the text the last revision replaced, not of `prompt`.
        """
        return {
            "prompt": self.final,
            "critique": self.critiques[-1].model_dump() if self.critiques else None,
            "draft": self.draft,
            "rounds": [
                {"critique": critique.model_dump(), "revision": revision}
                for critique, revision in zip(self.critiques, self.revisions, strict=True)
            ],
        }


@dataclass
class _Context:
    plan: Plan
    catalog: Catalog
    model: Model
    ledger: UsageLedger

    def step_view(self, step: Step) -> dict[str, Any]:
        return {
            "step": step,
            "task": self.plan.task,
            "tools": [self.catalog[name] for name in step.tools if name in self.catalog],
            "inputs": [self.plan.step(dep) for dep in step.depends_on],
        }


@cache
def _writer() -> Agent[None, str]:
    """The agent that writes prompts; the model and instructions come per call.

    Built once: building an agent took about 1 % of a run's time (bench/engine.py's load, 5 drafts
    a run), and it holds nothing of one call's.
    """
    from pydantic_ai import Agent

    return Agent(output_type=str)


_OPENING_TAG = re.compile(r"<prompt>", re.IGNORECASE)
_CLOSING_TAG = re.compile(r"</prompt>", re.IGNORECASE)
_LEAD_IN = re.compile(
    r"^(?:(?:sure|certainly|of\s+course|okay)[.!,]?\s*$"
    r"|(?=.*\b(?:prompt|version|revision|rewrite|rewritten)\b).*:\s*$)",
    re.IGNORECASE,
)
"""The writer's line before the prompt: "Sure!", or a line about the prompt that ends in a colon
("Here's the revised version:", "To improve clarity, I've rewritten the prompt. Here it is:").
"Here is your task: write …" and "Here is the data you will receive:" are the prompt's own."""
_SIGN_OFF = re.compile(
    r"^(?:i(?:'ve|\s+have)?\s+(?:made|rewrote|rewritten|revised|updated|adjusted|changed|improved|kept"
    r"|removed|added|clarified|simplified)\b|(?:this|the)\s+(?:revised|updated|improved|new)\s+"
    r"(?:version|prompt)\b|(?:note|notes|changes)\s*:)"
    r"(?=.*\b(?:prompt|version|revision|wording|clarity|reviewer|adjustments?)\b)",
    re.IGNORECASE,
)
"""The writer's line after the prompt about what it changed ("I made minor adjustments to the
wording for the reviewer."); "I have 3 rules: …" and "Changes: list them in CHANGES.md" are the
prompt's own."""
_FENCE = re.compile(r"^```\w*\s*$")


def cleaned_prompt(text: str) -> str:
    """The prompt in a Prompt Creator reply, without the template's tags and the writer's own words.

    The revision template shows the prompt inside `<prompt>…</prompt>`; the embedded model
    answered with the tags ("<prompt>", then "Write a haiku …"), and with words to the reviewer around
    the prompt ("To improve clarity …, I've rewritten the prompt … Here's the revised version:"
    … "I made minor adjustments … for the reviewer."), and the review showed them (and the team
    stored them) as the agent's prompt. The text inside the tags is taken when the reply opens
    them (a missing closing tag: to the end; a `</prompt>` with none opened is the prompt's own
    words). Then one lead-in line (`_LEAD_IN`) and the sign-off lines (`_SIGN_OFF`) go, and a fence
    around the whole prompt. Only lines that are plainly about the prompt go: a review found
    "Here is your task: …" and "I have 3 rules: …" lost. Empty when nothing else is left.
    """
    opening = _OPENING_TAG.search(text)
    if opening is not None:
        text = text[opening.end() :]
        closing = _CLOSING_TAG.search(text)
        if closing is not None:
            text = text[: closing.start()]
    lines = text.strip().split("\n")  # not `splitlines`: a "\r" inside a line is the prompt's own
    if lines and _LEAD_IN.match(lines[0].strip()):
        lines.pop(0)
    while lines and (not lines[-1].strip() or _SIGN_OFF.match(lines[-1].strip())):
        lines.pop()
    while lines and not lines[0].strip():
        lines.pop(0)
    if len(lines) >= 2 and _FENCE.match(lines[0].strip()) and lines[-1].strip() == "```":
        lines = lines[1:-1]
    return "\n".join(lines).strip()


async def _text(context: _Context, purpose: str, system: str, prompt: str) -> str:
    """The prompt a `prompt_creator` call wrote (`cleaned_prompt`: empty if it wrote only words about one)."""
    from .agents import run_agent
    from .models import labelled

    agent_output = await run_agent(
        _writer(),
        prompt,
        model=labelled(context.model, purpose, context.ledger),
        instructions=system,
        model_settings={"max_tokens": _PROMPT_TOKENS},
    )
    text = nul_replaced(str(agent_output).strip())  # the step's prompt, and its stored agent's
    if not text:
        raise ModelError(f"the {purpose} call returned an empty prompt")
    return cleaned_prompt(text)


async def _critique(context: _Context, view: dict[str, Any], prompt: str) -> Critique:
    from pydantic_ai import Agent, NativeOutput

    from .agents import run_agent
    from .models import labelled

    output: Any = (
        NativeOutput(Critique) if context.model.profile.get("supports_json_schema_output") else Critique
    )
    agent: Agent[None, Critique] = Agent(
        labelled(context.model, "critic", context.ledger),
        instructions=render("critic_system.j2"),
        output_type=output,
    )
    result: Critique = await run_agent(agent, render("critic_user.j2", prompt=prompt, **view))
    return result


Progress = Callable[[dict[str, Any]], Awaitable[None]]
"""Told which part of writing the prompts is under way: `{"stage": "prompts", "draft", "of"}` as a
step's draft starts, `{"stage": "review", "round"}` as the first step starts a critique round."""

Written = Callable[["AgentPrompt"], Awaitable[None]]
"""Given each step's prompt as soon as it is finished (its draft and every round done)."""


@dataclass
class _Progress:
    """Tells `report` (when given) of each draft started and each critique round begun."""

    report: Progress | None
    of: int
    drafts: int = 0
    round: int = 0
    told: asyncio.Lock = field(default_factory=asyncio.Lock)
    """One report at a time: they are recorded in the order they are counted."""

    async def drafting(self) -> None:
        async with self.told:
            self.drafts += 1
            if self.report is not None:
                await self.report({"stage": "prompts", "draft": self.drafts, "of": self.of})

    async def reviewing(self, round_: int) -> None:
        async with self.told:
            if round_ > self.round:
                self.round = round_
                if self.report is not None:
                    await self.report({"stage": "review", "round": round_})


async def _create_one(context: _Context, step: Step, rounds: int, progress: _Progress) -> AgentPrompt:
    view = context.step_view(step)
    system = render("prompt_creator_system.j2")
    await progress.drafting()
    draft = await _text(context, "prompt_creator", system, render("prompt_creator_draft.j2", **view))
    if not draft:
        raise ModelError("the prompt_creator call returned no prompt, only words about one")
    critiques: list[Critique] = []
    revisions: list[str] = []
    current = draft
    for round_ in range(1, rounds + 1):
        await progress.reviewing(round_)
        critique = await _critique(context, view, current)
        revised = await _text(
            context,
            "prompt_creator",
            system,
            render("prompt_creator_revise.j2", prompt=current, critique=critique, **view),
        )
        current = revised or current  # only words about a prompt: the one before it is kept
        critiques.append(critique)
        revisions.append(current)
    return AgentPrompt(step.id, draft, critiques, revisions)


async def create_prompts(
    plan: Plan,
    catalog: Catalog,
    *,
    model: Model,
    ledger: UsageLedger | None = None,
    rounds: int = DEFAULT_ROUNDS,
    concurrency: int = 4,
    only: Collection[str] | None = None,
    progress: Progress | None = None,
    written: Written | None = None,
    drafted_before: int = 0,
) -> dict[str, AgentPrompt]:
    """Write, critique and revise a system prompt for each step of `plan` (or of `only`), concurrently.

    `progress`, when given, is told as each step's draft starts and as each critique round begins;
    `drafted_before` prompts written earlier (by a process that stopped) count in its numbers.
    `written`, when given, gets each step's prompt as soon as it is finished (to keep it).
    """
    if not 0 <= rounds <= MAX_ROUNDS:
        raise ConfigError(f"prompt rounds must be between 0 and {MAX_ROUNDS}, got {rounds}")
    context = _Context(plan, catalog, model, ledger or UsageLedger())
    gate = asyncio.Semaphore(max(1, concurrency))
    steps = [step for step in plan.steps if only is None or step.id in only]
    told = _Progress(progress, drafted_before + len(steps), drafts=drafted_before)

    async def one(step: Step) -> AgentPrompt:
        async with gate:
            prompt = await _create_one(context, step, rounds, told)
        if written is not None:
            await written(prompt)
        return prompt

    tasks = [asyncio.ensure_future(one(step)) for step in steps]
    try:
        created = await asyncio.gather(*tasks)
    except BaseException:
        # one failed (or the run was stopped): the others stop too. Left running, they went on
        # calling the model for a run that had failed, and what they wrote was no longer kept.
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return {prompt.step_id: prompt for prompt in created}


def prompts_to_json(prompts: dict[str, AgentPrompt]) -> dict[str, Any]:
    """The `agents` map of `masterplanner plan --prompts --json`."""
    return {step_id: prompt.to_json_dict() for step_id, prompt in prompts.items()}
