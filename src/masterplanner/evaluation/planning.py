"""`masterplanner eval planning`: the Master Planner against UltraTool / TMDB, beside baselines.

Scoring follows `../shared/benchmarks/README.md`: per request, node F1 over predicted vs gold tool
names, link F1 over (source, target) tool pairs, and accuracy (the node set exactly right);
macro-averaged over requests. A request whose planner raised `PlanError` counts as invalid and
scores 0. When a request has no gold links and the plan predicts none, its link F1 is 1.

Three baselines run beside the planner, on the same pre-selected tools:

- `design_notes` (reported as `baseline` too): the design notes' planner
  (`prompts/baseline_planner.j2`), one plain prompt to the same model asking for
  `{"plan": [{"agent", "prompt"}]}` with the dataset's tools as the agents, no grammar, no repair;
  its steps form a chain in their order, as that design runs them.
- `single` (no model): the task as one step, with the tool that best matches the task (BM25,
  `tools.selection.best_tools`).
- `clauses` (no model): one step per clause of the task (`plan_structure.clauses`), each with the
  tool that best matches its clause, chained in order (each depends on the one before).

The no-model baselines are computed afresh for every request, also when the planner's records
come from a results file: they are cheap and deterministic.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from ..errors import MasterplannerError, ModelError, PlanError
from ..plan import Plan
from ..plan_structure import clauses
from ..planner import PlanExample
from ..planner import plan as make_plan
from ..prompts import render
from ..tools.catalog import Catalog
from ..tools.selection import DEFAULT_PRESELECT, best_tools, preselect, rank, words
from ..usage import UsageLedger
from .datasets import Request, load_dataset
from .results import ResultsFile, planning_code_fingerprint

if TYPE_CHECKING:
    from pathlib import Path

    from pydantic_ai.models import Model

__all__ = [
    "BASELINES",
    "NO_MODEL_BASELINES",
    "PlanningReport",
    "Scores",
    "evaluate_baselines",
    "evaluate_planning",
    "f1",
]

BASELINES = ("design_notes", "single", "clauses")
NO_MODEL_BASELINES = ("single", "clauses")


def f1(predicted: set[Any], gold: set[Any]) -> float:
    """F1 of two sets; 1.0 when both are empty."""
    if not predicted and not gold:
        return 1.0
    overlap = len(predicted & gold)
    if not overlap:
        return 0.0
    precision, recall = overlap / len(predicted), overlap / len(gold)
    return 2 * precision * recall / (precision + recall)


@dataclass
class Scores:
    """Macro-averaged scores of one planner over the requests."""

    node_f1: float = 0.0
    link_f1: float = 0.0
    accuracy: float = 0.0
    valid_rate: float = 0.0
    p50_latency_s: float = 0.0
    per_request: list[dict[str, Any]] = field(default_factory=list)

    def add(
        self, request: Request, nodes: set[str] | None, links: set[tuple[str, str]], seconds: float
    ) -> None:
        """Record one request (`nodes` None when the planner gave no valid plan)."""
        valid = nodes is not None
        gold_nodes, gold_links = set(request.nodes), set(request.links)
        node_score = f1(nodes, gold_nodes) if nodes is not None else 0.0
        link_score = f1(links, gold_links) if nodes is not None else 0.0
        self.per_request.append(
            {
                "id": request.id,
                "valid": valid,
                "node_f1": node_score,
                "link_f1": link_score,
                "exact": valid and nodes == gold_nodes,
                "seconds": seconds,
            }
        )

    def finish(self) -> Scores:
        """Compute the averages from `per_request`."""
        rows = self.per_request
        if rows:
            self.node_f1 = round(statistics.fmean(row["node_f1"] for row in rows), 4)
            self.link_f1 = round(statistics.fmean(row["link_f1"] for row in rows), 4)
            self.accuracy = round(statistics.fmean(1.0 if row["exact"] else 0.0 for row in rows), 4)
            self.valid_rate = round(statistics.fmean(1.0 if row["valid"] else 0.0 for row in rows), 4)
            self.p50_latency_s = round(statistics.median(row["seconds"] for row in rows), 3)
        return self

    def running(self) -> Scores:
        """The averages over the requests recorded so far (this object is left as it is)."""
        return Scores(per_request=list(self.per_request)).finish()

    def summary(self) -> dict[str, float]:
        """The averages only."""
        return {key: value for key, value in asdict(self).items() if key != "per_request"}


@dataclass
class PlanningReport:
    """What `eval planning` prints; `planner` and the design notes' baseline are None without a model."""

    dataset: str
    model: str | None
    requests: int
    planner: Scores | None
    baselines: dict[str, Scores]
    preselect_limit: int
    gold_tools_kept_rate: float
    usage: dict[str, Any] = field(default_factory=dict)
    baseline_usage: dict[str, Any] = field(default_factory=dict)

    @property
    def baseline(self) -> Scores | None:
        """The design notes' baseline (the one `baseline` has always named)."""
        return self.baselines.get("design_notes")

    def rows(self) -> list[tuple[str, Scores]]:
        """Each planner's scores, for a table: masterplanner first, then the baselines."""
        named = [("masterplanner", self.planner)] if self.planner else []
        return named + list(self.baselines.items())

    def to_json_dict(self, *, per_request: bool = False) -> dict[str, Any]:
        """Top-level planner scores, `baseline`, `baselines`, pre-selection survival and usage.

        `baseline` is the design notes' baseline again, as results kept before `baselines`
        existed have it. Without a model only `baselines` (`single`, `clauses`) is there.
        """
        payload: dict[str, Any] = {"dataset": self.dataset, "model": self.model, "requests": self.requests}
        if self.planner:
            payload.update(self.planner.summary())
        if self.baseline:
            payload["baseline"] = self.baseline.summary()
        payload["baselines"] = {name: scores.summary() for name, scores in self.baselines.items()}
        payload |= {
            "preselect_limit": self.preselect_limit,
            "gold_tools_kept_rate": self.gold_tools_kept_rate,
        }
        if self.planner:
            payload |= {"usage": self.usage, "baseline_usage": self.baseline_usage}
        if per_request:
            rows = {"planner": self.planner.per_request} if self.planner else {}
            if self.baseline:
                rows["baseline"] = self.baseline.per_request
            payload["per_request"] = rows | {
                name: self.baselines[name].per_request for name in NO_MODEL_BASELINES
            }
        return payload


def plan_graph(result: Plan) -> tuple[set[str], set[tuple[str, str]]]:
    """Predicted tool nodes and tool links of a plan: each dependency links the steps' tools."""
    nodes = {tool for step in result.steps for tool in step.tools}
    links = {
        (source, target)
        for step in result.steps
        for dependency in step.depends_on
        for source in result.step(dependency).tools
        for target in step.tools
        if source != target
    }
    return nodes, links


def _slug(name: str, taken: set[str]) -> str:
    base = re.sub(r"[^a-z0-9]+", "-", "-".join(words(name)) or name.lower()).strip("-")[:36] or "step"
    slug, number = base, 2
    while slug in taken:
        slug, number = f"{base}-{number}", number + 1
    taken.add(slug)
    return slug


def as_example(request: Request) -> PlanExample:
    """A gold request shown to the planner as an example plan."""
    taken: set[str] = set()
    ids = {node: _slug(node, taken) for node in dict.fromkeys(request.nodes)}
    steps = []
    for index, node in enumerate(dict.fromkeys(request.nodes)):
        instruction = request.steps[index] if index < len(request.steps) else f"Use {node}."
        steps.append(
            {
                "id": ids[node],
                "title": node,
                "instruction": instruction[:400],
                "agent_role": "assistant",
                "tools": [node],
                "depends_on": [
                    ids[source] for source, target in request.links if target == node and source in ids
                ],
                "expected_output": "",
            }
        )
    return PlanExample(request.text, steps)


def _parse_baseline(text: str) -> list[str]:
    """Agent names of the baseline's plan, as the original design read it: JSON or nothing."""
    body = text.strip()
    if body.startswith("```"):
        body = body.strip("`").removeprefix("json").strip()
    data = json.loads(body)
    steps = data["plan"]
    if not isinstance(steps, list) or not steps:
        raise ValueError("empty plan")
    return [str(step["agent"]) for step in steps]


async def _baseline(task: str, catalog: Catalog, model: Model, ledger: UsageLedger) -> list[str] | None:
    from pydantic_ai import Agent

    from ..agents import run_agent
    from ..models import labelled

    agent: Agent[None, str] = Agent(labelled(model, "planner", ledger))
    try:
        text = await run_agent(agent, render("baseline_planner.j2", task=task, tools=list(catalog)))
        return _parse_baseline(str(text))
    except (MasterplannerError, ValueError, KeyError, TypeError):
        return None


def _no_model_baselines(request: Request, tools: Catalog) -> dict[str, dict[str, Any]]:
    """The `single` and `clauses` baselines' scores for one request (see the module docstring)."""
    rows: dict[str, dict[str, Any]] = {}
    for name, actions in (("single", [request.text]), ("clauses", clauses(request.text))):
        started = time.perf_counter()
        chain = [best_tools(action, tools, 1) for action in actions]
        nodes = {tool for step in chain for tool in step}
        links = {
            (source, target)
            for before, after in pairwise(chain)
            for source in before
            for target in after
            if source != target
        }
        scores = Scores()
        scores.add(request, nodes, links, time.perf_counter() - started)
        rows[name] = scores.per_request[0]
    return rows


_RECORD_FIELDS = ("id", "kept", "planner", "baseline", "usage", "baseline_usage")


def _output_cap(model: Model) -> dict[str, int]:
    """The embedded model's reply and window sizes, which change its plans: part of a results header."""
    from ..models.local import LocalModel

    inner = getattr(model, "wrapped", model)
    if isinstance(inner, LocalModel):
        return {"max_output_tokens": inner.max_output_tokens, "context_tokens": inner.context_tokens}
    return {}


async def _score_request(
    request: Request,
    catalog: Catalog,
    hints: list[PlanExample] | None,
    model: Model,
    preselect_limit: int,
) -> dict[str, Any]:
    """Plan one request with the Master Planner and with the baseline: its results-file record."""
    ledger, baseline_ledger = UsageLedger(), UsageLedger()
    tools = preselect(request.text, catalog, preselect_limit)
    planner_row, baseline_row = Scores(), Scores()
    started = time.perf_counter()
    try:
        result = await make_plan(request.text, tools, model=model, ledger=ledger, hints=hints)
        nodes, links = plan_graph(result)
        planner_row.add(request, nodes, links, time.perf_counter() - started)
    except (PlanError, ModelError):
        planner_row.add(request, None, set(), time.perf_counter() - started)
    started = time.perf_counter()
    agents = await _baseline(request.text, tools, model, baseline_ledger)
    chain = set(pairwise(agents)) if agents else set()
    baseline_row.add(request, set(agents) if agents else None, chain, time.perf_counter() - started)
    return {
        "id": request.id,
        "kept": set(request.nodes) <= set(tools.names),
        "planner": planner_row.per_request[0],
        "baseline": baseline_row.per_request[0],
        "usage": ledger.by_purpose(),
        "baseline_usage": baseline_ledger.by_purpose(),
    }


async def evaluate_planning(
    dataset: str,
    *,
    model: Model,
    model_spec: str,
    limit: int | None = None,
    preselect_limit: int = DEFAULT_PRESELECT,
    examples: int = 2,
    results: Path | None = None,
    progress: Callable[[int, int, Scores], None] | None = None,
) -> PlanningReport:
    """Plan every test request of `dataset` with the Master Planner and the baselines, and score them.

    With `results`, each finished request is appended to that file, and requests already in it
    (from an earlier, stopped run with the same settings) are taken from it instead of planned.
    `progress(done, total, planner_scores_so_far)` is called before each request and at the end.
    """
    catalog, test, train = load_dataset(dataset)
    requests = test[:limit] if limit else test
    saved = None
    if results:
        header: dict[str, Any] = {
            "dataset": dataset,
            "model": model_spec,
            "preselect_limit": preselect_limit,
            "examples": examples,
            "planning_code": planning_code_fingerprint(),
        }
        saved = ResultsFile(results, header | _output_cap(model), required=_RECORD_FIELDS)
    planner_scores = Scores()
    baselines = {name: Scores() for name in BASELINES}
    ledger, baseline_ledger = UsageLedger(), UsageLedger()
    kept = 0
    train_index = {str(request.id): words(request.text) for request in train}
    by_id = {str(request.id): request for request in train}
    for done, request in enumerate(requests):
        if progress:
            progress(done, len(requests), planner_scores.running())
        record = saved.records.get(str(request.id)) if saved else None
        if record is None:
            hints = (
                [as_example(by_id[key]) for key in rank(request.text, train_index)[:examples]]
                if train
                else None
            )
            record = await _score_request(request, catalog, hints, model, preselect_limit)
            if saved:
                saved.append(record)
        kept += bool(record["kept"])
        planner_scores.per_request.append(record["planner"])
        baselines["design_notes"].per_request.append(record["baseline"])
        no_model = _no_model_baselines(request, preselect(request.text, catalog, preselect_limit))
        for name, row in no_model.items():
            baselines[name].per_request.append(row)
        ledger.merge(record["usage"])
        baseline_ledger.merge(record["baseline_usage"])
    if progress:
        progress(len(requests), len(requests), planner_scores.running())
    return PlanningReport(
        dataset=dataset,
        model=model_spec,
        requests=len(requests),
        planner=planner_scores.finish(),
        baselines={name: scores.finish() for name, scores in baselines.items()},
        preselect_limit=preselect_limit,
        gold_tools_kept_rate=round(kept / len(requests), 4) if requests else 0.0,
        usage=ledger.summary(),
        baseline_usage=baseline_ledger.summary(),
    )


def evaluate_baselines(
    dataset: str, *, limit: int | None = None, preselect_limit: int = DEFAULT_PRESELECT
) -> PlanningReport:
    """Score only the baselines that need no model (`single`, `clauses`) on `dataset`'s test requests."""
    catalog, test, _ = load_dataset(dataset)
    requests = test[:limit] if limit else test
    baselines = {name: Scores() for name in NO_MODEL_BASELINES}
    kept = 0
    for request in requests:
        tools = preselect(request.text, catalog, preselect_limit)
        kept += set(request.nodes) <= set(tools.names)
        for name, row in _no_model_baselines(request, tools).items():
            baselines[name].per_request.append(row)
    return PlanningReport(
        dataset=dataset,
        model=None,
        requests=len(requests),
        planner=None,
        baselines={name: scores.finish() for name, scores in baselines.items()},
        preselect_limit=preselect_limit,
        gold_tools_kept_rate=round(kept / len(requests), 4) if requests else 0.0,
    )
