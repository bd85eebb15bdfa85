"""What the registry remembers: agents (with versions, stats and lessons) and cohorts (teams that ran)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["AgentSpec", "AgentStats", "Cohort"]


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
