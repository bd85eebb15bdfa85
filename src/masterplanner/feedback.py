"""Feedback on a finished run: ratings for its agents and cohort, and lessons after a poor rating.

At `LOW_RATING` or below the agents involved are taught a lesson, which their prompts carry from
their next run on. A model's failure analysis writes the lessons when it gives usable ones. When
it gives none (the embedded model echoed the schema's field descriptions back as its lessons,
named steps that do not exist, or put a secret in each) or fails, and the person commented,
their own words become the lesson of the agents the comment names (every agent of the run when
it names none), so a low rating with a comment always teaches something.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from .agents import run_agent
from .errors import NUL_PROBLEM, ConfigError, DatabaseError, ModelError, RunError, json_kind, nul_replaced
from .plan import Plan, Step
from .prompts import render
from .redaction import secret_parts, secret_refusal
from .usage import UsageLedger

if TYPE_CHECKING:  # a rating above LOW_RATING calls no model: pydantic-ai is imported for the analysis
    from pydantic_ai.models import Model

    from .registry import RegistryStore

__all__ = [
    "LOW_RATING",
    "FeedbackResult",
    "check_rating",
    "comment_problem",
    "give_feedback",
    "registry_refusal",
]

LOW_RATING = 2
"""At or below this rating the agents involved are taught lessons."""

MAX_ANALYSIS_LESSON_CHARS = 300
"""Longest lesson the analysis may write: a longer one is cut (a person's comment to `MAX_COMMENT_CHARS`).

Both stay within what an edit of the agent takes (`registry.specs.MAX_LESSON_CHARS`): the
agent's form, sent back as it is, is never refused for a lesson feedback wrote.
"""
MAX_COMMENT_CHARS = 500
_MAX_LESSONS = 12
_OUTPUT_CHARS = 600
"""How much of each step's output the analysis is shown."""
_WORD = re.compile(r"[^\W\d_]{3,}")
_STOPWORDS = frozenset(
    "the and for not but with from into that this these those its their your you are was were "
    "will would should must can could has have had been being all any each one".split()
)


@dataclass
class FeedbackResult:
    """What the feedback changed."""

    rated_agents: list[str] = field(default_factory=list)
    cohort_rated: bool = False
    lessons: dict[str, list[str]] = field(default_factory=dict)
    """Agent id -> lessons added (not one the agent had already)."""
    lessons_from: Literal["analysis", "comment"] | None = None
    """Who wrote the lessons: the model's failure analysis or, failing that, the person's comment."""


def involved_agents(
    registry: RegistryStore, run_id: str, plan: Plan, agents: dict[str, Any]
) -> dict[str, str]:
    """Step id -> registry agent id, for the steps of the run whose agent is in the registry."""
    candidates = {
        step.id: (agents.get(step.id) or {}).get("agent_id") or f"{run_id}.{step.id}" for step in plan.steps
    }
    known = registry.known_agents(list(candidates.values()))
    return {step_id: agent_id for step_id, agent_id in candidates.items() if agent_id in known}


def registry_refusal(registry: RegistryStore, run_id: str, plan: Plan, agents: dict[str, Any]) -> str | None:
    """Why the registry cannot rate the run (none of its agents is stored, or it was rated); None if it can.

    Blocking (database work): call it off the event loop. The database failing to say is no
    reason: its `DatabaseError` is raised (the API's 500), where it was said as one (a 409, and
    the run page said the run could not be rated).
    """
    if not involved_agents(registry, run_id, plan, agents):
        return (
            f"run {run_id} has no agents in the registry to rate: the agents made for a run are "
            "stored with its team when it succeeds (and storing it was approved), and none of its "
            "steps used a stored agent"
        )
    try:
        registry.check_unrated(run_id)
    except DatabaseError:  # the database failing to say: the server's failure, not a refusal
        raise
    except RunError as rated:
        return str(rated)
    return None


def check_rating(rating: object) -> None:
    """`ConfigError` unless `rating` is a whole number from 1 to 5."""
    if not isinstance(rating, int) or isinstance(rating, bool) or not 1 <= rating <= 5:
        raise ConfigError(f"the rating must be a whole number from 1 to 5, got {rating!r}")


def comment_problem(comment: str) -> str | None:
    """Why a rating's `comment` is refused, in the words `give_feedback` refuses it with; None if taken.

    One definition: `give_feedback` raises it (a `ConfigError`), and the run page checks the
    comment typed with it first, as it checks the rating, so what it says of a setting or the
    database (the server's answer) is never taken for what the person typed.
    """
    if not comment.isascii():
        try:
            comment.encode("utf-8")
        except UnicodeEncodeError:
            return "the comment is not valid UTF-8 text"
    if "\x00" in comment:  # a lesson's text: Postgres refuses it
        return f"the comment {NUL_PROBLEM}; the run is not rated"
    if secret_parts(comment):  # it would reach the analysis's prompt and, as a lesson, the registry
        return secret_refusal("the comment", not_in="a rating's comment") + "; the run is not rated"
    return None


async def give_feedback(
    registry: RegistryStore,
    *,
    run_id: str,
    plan: Plan,
    agents: dict[str, Any],
    outputs: dict[str, str],
    rating: int,
    comment: str = "",
    model: Model | None = None,
    ledger: UsageLedger | None = None,
    by: str = "library",
) -> FeedbackResult:
    """Rate the run's agents and cohort; at `LOW_RATING` or below, teach the agents involved a lesson.

    The lessons come from `model`'s failure analysis when it gives usable ones, otherwise from
    `comment` (see the module's docstring). A comment holding what looks like a secret is a
    `ConfigError`: it would reach the model and a lesson. Nothing is stored until the end, and
    then all of it in one transaction with the run's rating (`RegistryStore.apply_rating`): a run
    is rated once, also when two ratings come at once, and a rating stopped on the way changes nothing.
    """
    check_rating(rating)
    for what, value in (("the comment", comment), ("who rates", by)):
        if not isinstance(value, str):  # a program's argument
            raise ConfigError(f"{what} should be text, got {json_kind(value)}; the run is not rated")
    problem = comment_problem(comment)
    if problem is not None:
        raise ConfigError(problem)
    if "\x00" in by:  # the rating's record: Postgres refuses it
        raise ConfigError(f"who rates ({by!r}) {NUL_PROBLEM}; the run is not rated")
    # the registry's calls are database work (and may embed): off the event loop; a refusal is
    # said before the analysis's model call, and `apply_rating` decides
    refusal = await asyncio.to_thread(registry_refusal, registry, run_id, plan, agents)
    if refusal is not None:
        raise RunError(refusal)
    involved = await asyncio.to_thread(involved_agents, registry, run_id, plan, agents)
    # an agent reused by several steps is rated once for the run
    result = FeedbackResult(rated_agents=list(dict.fromkeys(involved.values())))
    lessons: dict[str, list[str]] = {}
    if rating <= LOW_RATING:
        if model is not None:
            try:
                analysis = await _analyse(plan, involved, outputs, comment, model, ledger or UsageLedger())
            except ModelError:
                analysis = None  # the person's words below still teach
            lessons = _usable_lessons(analysis, plan, involved)
            result.lessons_from = "analysis" if lessons else None
        said = " ".join(comment.split())
        if not lessons and said:
            lesson = _comment_lesson(rating, said)
            names = await asyncio.to_thread(
                lambda: {agent_id: registry.get_agent(agent_id).name for agent_id in involved.values()}
            )
            concerned = _concerned_steps(said, plan, involved, names)
            lessons = {involved[step_id]: [lesson] for step_id in concerned}
            result.lessons_from = "comment" if lessons else None
    applied = await asyncio.to_thread(
        lambda: registry.apply_rating(run_id, rating, by=by, agent_ids=result.rated_agents, lessons=lessons)
    )
    result.cohort_rated, result.lessons = applied.cohort_rated, applied.lessons
    if not result.lessons:  # each lesson was one its agent had already
        result.lessons_from = None
    return result


def _comment_lesson(rating: int, comment: str) -> str:
    """The person's comment as a lesson, worded for the prompt of the agent's next run."""
    if len(comment) > MAX_COMMENT_CHARS:
        comment = comment[: MAX_COMMENT_CHARS - 1].rstrip() + "…"
    return f'A person rated an earlier run {rating}/5 and said: "{comment}"'


def _concerned_steps(comment: str, plan: Plan, involved: dict[str, str], names: dict[str, str]) -> list[str]:
    """The involved steps `comment` names (by id, title, role or agent name); all of them if it names no step.

    A comment that names only steps whose agents are not in the registry (deleted) concerns none.
    """
    text = comment.casefold()

    def named(step: Step) -> bool:
        phrases = {step.id, step.id.replace("-", " "), step.title, step.agent_role}
        if step.id in involved:
            phrases.add(names[involved[step.id]])
        return any(
            re.search(rf"(?<!\w){re.escape(phrase.casefold())}(?!\w)", text)
            for phrase in phrases
            if len(phrase.strip()) >= 3
        )

    meant = [step.id for step in plan.steps if named(step)]
    if meant:
        return [step_id for step_id in meant if step_id in involved]
    return [step.id for step in plan.steps if step.id in involved]


def _usable_lessons(analysis: object, plan: Plan, involved: dict[str, str]) -> dict[str, list[str]]:
    """Agent id -> the analysis's lessons that name an involved step and teach something, deduplicated.

    A lesson teaches something when it has two words or more and one of them is news: not in
    the task, the steps or the analysis's own instructions. The embedded model otherwise wrote
    "Summary of notes.txt" as the lesson of a summary that was too long, and echoed its
    instructions' wording back. A lesson that looks like it holds a secret (the analysis reads
    the steps' outputs) is dropped, as memory refuses such a fact: it would join every later
    prompt of its agent, and be listed and exported with it.
    """
    items = analysis.get("lessons") if isinstance(analysis, dict) else None
    known_words = _words(render("feedback_system.j2"), plan.task) | _STOPWORDS
    for step in plan.steps:
        known_words |= _words(step.id, step.title, step.instruction, step.agent_role, step.expected_output)
    lessons: dict[str, list[str]] = {}
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        step_id, text = item.get("step"), item.get("lesson")
        target = involved.get(step_id.strip()) if isinstance(step_id, str) else None
        lesson = (
            nul_replaced(" ".join(text.split())[:MAX_ANALYSIS_LESSON_CHARS]) if isinstance(text, str) else ""
        )
        words = _words(lesson)
        if target is None or len(lesson.split()) < 2 or not words - known_words or secret_parts(lesson):
            continue
        found = lessons.setdefault(target, [])
        if lesson not in found:
            found.append(lesson)
    return lessons


def _words(*texts: str) -> set[str]:
    """The words of three letters or more in `texts`, case-folded."""
    return {word for text in texts for word in _WORD.findall(text.casefold())}


def _analysis_schema(step_ids: list[str]) -> dict[str, Any]:
    """The analysis's output: lessons for steps of this run only (no descriptions for a model to copy)."""
    lesson = {
        "type": "object",
        "properties": {
            "step": {"enum": step_ids},
            "lesson": {"type": "string", "minLength": 1, "maxLength": MAX_ANALYSIS_LESSON_CHARS},
        },
        "required": ["step", "lesson"],
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "title": "FailureAnalysis",
        "properties": {"lessons": {"type": "array", "items": lesson, "maxItems": _MAX_LESSONS}},
        "required": ["lessons"],
        "additionalProperties": False,
    }


async def _analyse(
    plan: Plan,
    involved: dict[str, str],
    outputs: dict[str, str],
    comment: str,
    model: Model,
    ledger: UsageLedger,
) -> object:
    """The model's failure analysis, as it wrote it (`_usable_lessons` sorts out what is usable)."""
    from pydantic_ai import Agent, NativeOutput, StructuredDict

    from .models.labelled import labelled

    output: Any = StructuredDict(_analysis_schema(list(involved)), name="failure_analysis")
    if model.profile.get("supports_json_schema_output", False):
        output = NativeOutput(output)  # grammar-enforced: the embedded model can only name real steps
    agent: Agent[None, dict[str, Any]] = Agent(
        labelled(model, "feedback", ledger),
        output_type=output,
        instructions=render("feedback_system.j2"),
        retries=1,
    )
    prompt = render(
        "feedback_user.j2",
        task=plan.task,
        steps=[(step, outputs.get(step.id, "")[:_OUTPUT_CHARS]) for step in plan.steps],
        comment=" ".join(comment.split()) or "(none)",
    )
    result: object = await run_agent(agent, prompt)
    return result
