"""What the registry remembers: agents (with versions, stats and lessons) and cohorts (teams that ran)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["MAX_KEYWORD_CHARS", "MAX_LESSON_CHARS", "AgentSpec", "AgentStats", "Cohort", "with_prompt_author"]

MAX_LESSON_CHARS = 600
"""The longest lesson an agent edit or import may write (checked there, not on reading).

Each lesson is a line of the prompt of every run that reuses the agent (`lessons_prompt`), and
an agent keeps 50: 600 characters each add at most 30,000 (about 7,500 tokens). Unbounded, 45
lessons of 80,000 characters were stored and every later run of the agent failed on its token
budget. The longest feedback writes fits: a person's comment of 500 characters in its framing
(546); a lesson is a sentence or two. An agent stored before the limit keeps its longer ones.
"""
MAX_KEYWORD_CHARS = 100
"""The longest keyword an agent edit or import may write (checked there, not on reading).

A keyword is a word or a short phrase: 100 characters hold any word of a dictionary (the
longest have about 45 letters) with room. Each is indexed for search and embedded with the agent;
unbounded, a 100,000-character keyword was stored. The words of a task longer than this are
left out of the keywords of the agents its run stores (`store_outcome`).
"""


class AgentStats(BaseModel):
    """How an agent has done."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    uses: int = Field(0, ge=0)
    successes: int = Field(0, ge=0)
    failures: int = Field(0, ge=0)
    ratings: int = Field(0, ge=0)
    rating_sum: float = Field(0.0, ge=0)

    def problems(self) -> list[str]:
        """What no track record can be, as `field: what is wrong`.

        Successes and failures beyond its uses, or a rating sum outside 1 to 5 per rating: the
        counts the registry keeps never are; an imported file's may be.
        """
        problems = []
        if self.successes + self.failures > self.uses:
            problems.append(
                f"successes: successes ({self.successes}) and failures ({self.failures}) add up to "
                f"more than uses ({self.uses})"
            )
        if not self.ratings <= self.rating_sum <= 5 * self.ratings:
            problems.append(
                f"rating_sum: must be from {self.ratings} to {5 * self.ratings} (ratings is "
                f"{self.ratings}, each from 1 to 5), got {self.rating_sum:g}"
            )
        return problems

    @property
    def mean_rating(self) -> float | None:
        """The mean of its ratings (1 to 5), if any."""
        return self.rating_sum / self.ratings if self.ratings else None

    @property
    def success_rate(self) -> float | None:
        """Successes over finished uses, if any."""
        finished = self.successes + self.failures
        return self.successes / finished if finished else None


class AgentSpec(BaseModel):
    """A reusable agent: its role, prompt and tools, where it came from, and what it learned."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    name: str = Field(min_length=1, max_length=200)
    role: str = Field(min_length=1, max_length=200)
    description: str = Field("", max_length=4000)
    system_prompt: str = Field(min_length=1, max_length=20000)
    tools: list[str] = Field(default_factory=list, max_length=64)
    model: str = Field("", max_length=200)
    keywords: list[str] = Field(default_factory=list, max_length=64)
    origin: dict[str, str] = Field(default_factory=dict, description="run_id and step_id it was made in")
    version: int = Field(1, ge=1)
    stats: AgentStats = AgentStats(uses=0, successes=0, failures=0, ratings=0, rating_sum=0.0)
    lessons: list[str] = Field(default_factory=list, max_length=50)
    prompt_by_person: bool = False
    """A person wrote its prompt: edited at review in the run that stored it, or edited here.

    A run that reuses the agent treats the prompt as one the person edited at review: a small
    model's step aids take no shortcut past it (no direct call, drafts asked under it). It is never
    cleared by an edit (`with_prompt_author`): a stale or careless form would let the shortcuts skip
    a prompt a person wrote.
    """

    def search_text(self) -> str:
        """What lexical search matches against."""
        return " ".join([self.name, self.role, self.description, " ".join(self.keywords), self.system_prompt])


class Cohort(BaseModel):
    """A team that ran a task: the approved plan's shape, its agents, and how it went."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    task: str = Field(min_length=1, max_length=20000)
    plan: dict[str, Any]
    agents: dict[str, str] = Field(default_factory=dict, description="step id -> agent id")
    outcome: Literal["succeeded", "failed"] = "succeeded"
    rating: float | None = Field(None, ge=1, le=5)
    run_id: str = ""


def with_prompt_author(spec: AgentSpec, current: AgentSpec) -> AgentSpec:
    """`spec` as the next version of `current`, `prompt_by_person` set as the registry keeps it.

    Set when `current` has it, when `spec` changes the prompt (a person edited or imported it), or
    when `spec` asks for it (the model is then to work under the prompt: it only costs the step
    aids' shortcuts). A `false` sent is not taken when it is set: the JSON form a person edits, or
    an API client's earlier read of it, would otherwise have a person's prompt bypassed.
    """
    by_person = (
        current.prompt_by_person
        or spec.prompt_by_person
        or spec.system_prompt.strip() != current.system_prompt.strip()
    )
    return (
        spec
        if spec.prompt_by_person == by_person
        else spec.model_copy(update={"prompt_by_person": by_person})
    )
