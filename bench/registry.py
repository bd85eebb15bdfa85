"""Registry benchmark: retrieval latency, paraphrase recall@5, and model calls saved by reuse.

    python bench/registry.py [--sections latency,recall,reuse,calibrate] [--sizes 1000,10000,100000]
                             [--queries 200] [--embedders none,smollm2,local] [--reuse-pairs 30]
                             [--json] [--keep DIR]

latency  For 1k, 10k and 100k synthetic agents, the same queries through
         `RegistryStore.search_agents` (lexical: FTS5 BM25, the join to the agents table, the
         track-record prior) and, as the anchor in the same run, a bare FTS5
         `MATCH … ORDER BY rank LIMIT 5` on the same index. p50/p95 ms and our p95 over the
         anchor's. Target: p95 <= 10 ms at 100k agents. Building the 100k index takes minutes;
         `--keep DIR` keeps the built databases there and reuses them in later runs.
recall   bench/data/registry_paraphrases.jsonl: 220 tasks written for the project, each with a
         paraphrase. All tasks are stored as cohorts; each paraphrase searches
         (`similar_cohorts`, the ranking a run uses before planning); recall@1 and recall@5 of its
         own task, per embedder (`none` = BM25 alone; any other = BM25 and cosine fused by
         reciprocal rank fusion), plus cosine alone as a reference. The reuse decision as the
         engine makes it (`engine.reuse.reusable_cohort`: the first of the 3 found whose
         similarity clears the threshold) at several thresholds: how often that is the right task
         (would reuse correctly) and how often another (would reuse the wrong team). And each
         paraphrase against every other task: the share of those pairs whose similarity clears
         `reuse_threshold`. Similarity is the embedder's calibrated cosine, or for `none` the
         Ochiai coefficient of word stems. Also the time to embed one new text and the memory the
         loaded embedder adds (resident set).
         Target: recall@5 >= 0.9 with the hybrid ranking.
reuse    The first N pairs run through the engine with the scripted model (3-step plan, one
         Prompt Creator round): each task, approved, then its paraphrase, in one registry.
         Model calls of the first run vs the repeat, and planner calls in the repeat. Whether a
         repeat reused its own task's team or another's, and how many first runs (tasks not seen
         before) reused a stored team: each of those is a wrong reuse.
         Target: 0 planner calls and >= 50 % fewer calls in a repeat that reuses.
calibrate
         The scale of each embedder's cosine against MiniLM's (`local`), on 40 pairs that are not
         the benchmark's: `smollm2.REFERENCE_TASKS` and `REFERENCE_PARAPHRASES` below. Prints the
         `Calibration` that maps its paraphrase median and its 99th percentile for unrelated pairs
         onto MiniLM's (the figures `smollm2.CALIBRATION` holds), and its cosines' own spread.

An embedder that is not installed (`local` needs the packaged MiniLM) is reported as skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from masterplanner.errors import ConfigError
from masterplanner.registry import AgentSpec, Cohort, RegistryStore, TextEmbedder, resolve_embedder
from masterplanner.registry.embedders import Calibration
from masterplanner.registry.smollm2 import REFERENCE_TASKS
from masterplanner.registry.store import lexical_similarity

PARAPHRASES = Path(__file__).parent / "data" / "registry_paraphrases.jsonl"
THRESHOLDS = (0.5, 0.6, 0.7, 0.8)
REUSE_THRESHOLD = 0.6
"""The `reuse_threshold` setting's default."""

REFERENCE_PARAPHRASES = (
    "Change every column name in data.csv to lower case with underscores and remove columns that have "
    "no values",
    "Write a brief memo that groups the help-desk requests from the last three months by which product "
    "they concern",
    "Make a shell script that copies my home directory onto the external disk each night as a backup",
    "Write a short note thanking everyone who gave their time at the charity race",
    "Draw a line graph of each day's temperature from weather.csv",
    "Go through the codebase and collect every TODO note with the file and line number where it appears",
    "Render the restaurant's menu in Italian",
    "Tell a short story for children at bedtime about a dragon that fears darkness",
    "Put three tools for managing projects side by side in a table comparing cost and functionality",
    "Add a CI workflow on GitHub that runs the linter whenever a pull request is opened",
    "Prepare presentation slides that walk the staff through how new hires will be onboarded",
    "Pull out all the telephone numbers in contacts.txt and save them as CSV",
    "Describe how TCP differs from UDP in terms a newcomer can follow",
    "Remind me every Sunday morning to give the plants water",
    "Scale every PNG in the assets/ folder down to a width of 800 px",
    "Add tests for how the shopping basket computes discounts",
    "Look into how the printing press came about and summarise it on a single page",
    "Make a spreadsheet that tracks the costs of renovating a small house",
    "Find the pages on our company site whose links are broken with a 404",
    "Come up with a logo concept for a café named Morning Ritual",
    "Combine the two lists of customers and drop anyone listed in both",
    "Write an application letter for an entry-level data analyst job",
    "Work out the middle house price for each neighbourhood using listings.json",
    "Rewrite the login handler so its database calls are asynchronous",
    "Come up with questions to ask candidates for a product designer role",
    "Turn the cup measurements in the recipe into grams",
    "Watch how full the server's disk is and raise an alert above 90%",
    "Write the shop text describing a leather wallet made by hand",
    "Make a revision schedule for the end-of-year history and biology exams",
    "Work out whether the customer reviews in reviews.csv are positive or negative",
    "Organise a three-day walking trip in the Scottish Highlands and list what to pack",
    "Compose a haiku on falling leaves in autumn",
    "Track down and fix the memory leak in the worker that processes images",
    "Turn my notes from today's board meeting into formal minutes",
    "Work out the interest a savings account at 3% earns over five years",
    "Collect the book titles and prices listed on the store's first page",
    "Document the command-line weather tool in a README file",
    "Sort the holiday photos into albums by the city they were taken in",
    "Put together a training schedule for a novice runner preparing for a 10 km race",
    "Review who has which permissions in the admin panel and flag accounts with more access than they need",
)
"""A paraphrase of each of `smollm2.REFERENCE_TASKS`, in order, written for calibration (not from the
benchmark's pairs)."""

WORDS = (
    "read write csv json report chart plot summary totals monthly weekly sales revenue customers orders "
    "invoice email draft reply translate french german spanish poem haiku story outline review code python "
    "test bug fix refactor deploy docker server database query index schema migrate backup restore search "
    "web page scrape extract table clean merge join filter sort rank score classify label image resize crop "
    "caption slide deck agenda meeting notes calendar schedule remind plan budget forecast risk audit "
    "compliance policy contract legal clause research paper cite abstract dataset model train evaluate"
).split()
ROLES = ("analyst", "writer", "translator", "engineer", "researcher", "planner", "reviewer", "designer")
VOCABULARY = [*WORDS, *(f"term{n}" for n in range(20000))]
"""The domain words plus a long tail, drawn with Zipf-like weights as real text is."""
WEIGHTS = [1 / (rank + 1) for rank in range(len(VOCABULARY))]


def _draw(rng: random.Random, count: int) -> list[str]:
    return rng.choices(VOCABULARY, weights=WEIGHTS, k=count)


def synthetic(count: int, seed: int = 7) -> list[AgentSpec]:
    rng = random.Random(seed)
    agents = []
    for n in range(count):
        topic = _draw(rng, 6)
        agents.append(
            AgentSpec.model_validate(
                {
                    "id": f"a{n}",
                    "name": f"{topic[0]} {topic[1]} agent",
                    "role": f"{rng.choice(ROLES)} for {topic[2]}",
                    "description": " ".join(_draw(rng, 12)),
                    "system_prompt": "You " + " ".join(_draw(rng, 25)) + ".",
                    "keywords": topic[3:],
                }
            )
        )
    return agents


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ---- latency


def measure_latency(size: int, queries: list[str], folder: Path) -> dict[str, float]:
    path = folder / f"registry-{size}.sqlite"
    built = path.exists()
    store = RegistryStore(f"sqlite:///{path}")
    if not built:
        store.put_agents(synthetic(size))
    for query in queries[:10]:
        store.search_agents(query)
    ours = []
    for query in queries:
        started = time.perf_counter()
        store.search_agents(query)
        ours.append((time.perf_counter() - started) * 1000)
    bare_db = sqlite3.connect(str(folder / f"registry-{size}.sqlite"))
    bare = []
    for query in queries:
        match = " OR ".join(f'"{term}"' for term in query.split())
        started = time.perf_counter()
        bare_db.execute(
            "SELECT agent_id FROM mp_agents_fts WHERE mp_agents_fts MATCH ? ORDER BY rank LIMIT 5", (match,)
        ).fetchall()
        bare.append((time.perf_counter() - started) * 1000)
    bare_db.close()
    store.close()
    return {
        "agents": size,
        "p50_ms": round(statistics.median(ours), 3),
        "p95_ms": round(percentile(ours, 0.95), 3),
        "anchor_p50_ms": round(statistics.median(bare), 3),
        "anchor_p95_ms": round(percentile(bare, 0.95), 3),
        "p95_ratio_to_anchor": round(percentile(ours, 0.95) / max(percentile(bare, 0.95), 1e-6), 3),
    }


# ---- recall


def load_pairs() -> list[dict[str, str]]:
    return [json.loads(line) for line in PARAPHRASES.read_text(encoding="utf-8").splitlines() if line.strip()]


def _cohort(pair: dict[str, str]) -> Cohort:
    plan = {"task": pair["task"], "steps": []}
    return Cohort.model_validate({"id": pair["id"], "task": pair["task"], "plan": plan, "run_id": pair["id"]})


def _resident_mb() -> float:
    """This process's resident set in MB (Linux; 0 elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _load(embedder_spec: str) -> tuple[TextEmbedder | None, dict[str, Any]]:
    """The embedder, loaded by a first embedding: what loading took and added to memory."""
    before = _resident_mb()
    started = time.perf_counter()
    embedder = resolve_embedder(embedder_spec)
    if embedder is None:
        return None, {}
    embedder.embed_sync(["probe"], "query")
    load = {"load_s": round(time.perf_counter() - started, 2), "rss_added_mb": round(_resident_mb() - before)}
    one = []
    for n in range(10):
        started = time.perf_counter()
        embedder.embed_sync([f"Read sales{n}.csv and total the revenue by month"], "query")
        one.append((time.perf_counter() - started) * 1000)
    return embedder, {**load, "embed_one_p50_ms": round(statistics.median(one), 1)}


def _similarities(
    embedder: TextEmbedder | None, pairs: list[dict[str, str]]
) -> tuple[np.ndarray, np.ndarray]:
    """Paraphrase x task: the similarity `reuse_threshold` is compared with, and the cosine (none: empty)."""
    if embedder is None:
        lexical = [[lexical_similarity(p["paraphrase"], t["task"]) for t in pairs] for p in pairs]
        return np.array(lexical), np.zeros((0, 0))
    tasks = embedder.embed_sync([pair["task"] for pair in pairs], "document")
    queries = embedder.embed_sync([pair["paraphrase"] for pair in pairs], "query")
    cosines = queries @ tasks.T
    return np.vectorize(embedder.similarity)(cosines), cosines


def _reuse_decision(found: list[tuple[Cohort, float]], threshold: float) -> str | None:
    """The cohort the engine would reuse (`reusable_cohort`, every stored team runnable): its id."""
    return next((cohort.id for cohort, similarity in found if similarity >= threshold), None)


def measure_recall(embedder_spec: str, pairs: list[dict[str, str]], folder: Path) -> dict[str, Any]:
    try:
        embedder, load = _load(embedder_spec)
    except ConfigError as exc:
        return {"embedder": embedder_spec, "skipped": str(exc)}
    store = RegistryStore(f"sqlite:///{folder / f'recall-{len(os.listdir(folder))}.sqlite'}", embedder)
    for pair in pairs:
        store.put_cohort(_cohort(pair))
    started = time.perf_counter()
    store.similar_cohorts("warm the index up", 5)
    index_s = time.perf_counter() - started
    hits1 = hits5 = 0
    decisions: dict[float, list[str | None]] = {threshold: [] for threshold in THRESHOLDS}
    latencies = []
    for pair in pairs:
        started = time.perf_counter()
        found = store.similar_cohorts(pair["paraphrase"], 5)
        latencies.append((time.perf_counter() - started) * 1000)
        ids = [cohort.id for cohort, _ in found]
        hits1 += bool(ids) and ids[0] == pair["id"]
        hits5 += pair["id"] in ids
        for threshold in THRESHOLDS:
            decisions[threshold].append(_reuse_decision(found[:3], threshold))
    store.close()
    count = len(pairs)
    similarity, cosines = _similarities(embedder, pairs)
    others = similarity[~np.eye(count, dtype=bool)]
    own = np.diag(similarity)
    figures: dict[str, Any] = {
        "embedder": embedder_spec,
        "ranking": "bm25" if embedder is None else "bm25+cosine (rrf)",
        "pairs": count,
        "recall_at_1": round(hits1 / count, 3),
        "recall_at_5": round(hits5 / count, 3),
        "search_p50_ms": round(statistics.median(latencies), 2),
        "index_s": round(index_s, 2),
        **load,
        "similarity": "ochiai of word stems"
        if embedder is None
        else "cosine"
        if embedder.similarity == Calibration()
        else f"calibrated cosine ({embedder.similarity.scale} x + {embedder.similarity.offset})",
        "reuse_at_threshold": {
            str(threshold): {
                "right": round(sum(d == p["id"] for d, p in zip(chosen, pairs, strict=True)) / count, 3),
                "wrong": round(
                    sum(d is not None and d != p["id"] for d, p in zip(chosen, pairs, strict=True)) / count, 3
                ),
            }
            for threshold, chosen in decisions.items()
        },
        "own_similarity_p10_p50": [round(float(np.percentile(own, q)), 3) for q in (10, 50)],
        "other_similarity_p99_p999_max": [
            round(float(value), 3) for value in (*np.percentile(others, [99, 99.9]), others.max())
        ],
        "other_pairs_clearing_reuse_threshold": round(float(np.mean(others >= REUSE_THRESHOLD)), 5),
        "paraphrases_with_another_task_clearing": round(
            float(np.mean((similarity - np.diag(np.full(count, np.inf)) >= REUSE_THRESHOLD).any(axis=1))), 3
        ),
    }
    if embedder is not None:
        order = np.argsort(-cosines, axis=1)
        hits = [n in order[n, :5] for n in range(count)]
        figures["cosine_only_recall_at_5"] = round(float(np.mean(hits)), 3)
    return figures


# ---- calibration


def measure_calibration(embedder_spec: str) -> dict[str, Any]:
    """The linear map of this embedder's cosines onto MiniLM's, fitted on the reference pairs."""
    try:
        reference = resolve_embedder("local")
        embedder = resolve_embedder(embedder_spec)
    except ConfigError as exc:
        return {"embedder": embedder_spec, "skipped": str(exc)}
    if embedder is None or reference is None:
        return {"embedder": embedder_spec, "skipped": "no vectors"}

    def spread(model: TextEmbedder) -> tuple[float, float]:
        tasks = model.embed_sync(list(REFERENCE_TASKS), "document")
        cosines = model.embed_sync(list(REFERENCE_PARAPHRASES), "query") @ tasks.T
        others = cosines[~np.eye(len(REFERENCE_TASKS), dtype=bool)]
        return float(np.median(np.diag(cosines))), float(np.percentile(others, 99))

    own, other = spread(embedder)
    target_own, target_other = spread(reference)
    scale = (target_own - target_other) / (own - other)
    return {
        "embedder": embedder_spec,
        "paraphrase_median": round(own, 4),
        "unrelated_p99": round(other, 4),
        "minilm_paraphrase_median": round(target_own, 4),
        "minilm_unrelated_p99": round(target_other, 4),
        "scale": round(scale, 4),
        "offset": round(target_other - scale * other, 4),
    }


# ---- reuse


def _script(folder: Path) -> Path:
    steps = [
        {
            "id": name,
            "title": f"{name} the material",
            "instruction": f"{name.capitalize()} what the task needs.",
            "agent_role": role,
            "tools": [],
            "depends_on": deps,
            "expected_output": f"the {name} result",
        }
        for name, role, deps in (
            ("gather", "researcher", []),
            ("analyse", "analyst", ["gather"]),
            ("write", "writer", ["analyse"]),
        )
    ]
    calls = [
        {"purpose": "planner", "output": {"steps": steps}, "repeat": True},
        {"purpose": "prompt_creator", "output": "You are careful. Do your step well.", "repeat": True},
        *(
            {"purpose": f"step:{name}", "output": f"{name} done", "repeat": True}
            for name in ("gather", "analyse", "write")
        ),
        {"purpose": "*", "repeat": True},
    ]
    path = folder / "script.json"
    path.write_text(json.dumps({"calls": calls}))
    return path


async def _reuse_runs(pairs: list[dict[str, str]], script: Path) -> list[dict[str, Any]]:
    from masterplanner import Settings
    from masterplanner.engine import Engine, RunOptions

    engine = Engine(Settings.load())

    def reused_cohort(run_id: str) -> str | None:
        ready = [e.data for e in engine.store.events(run_id) if e.kind == "plan_ready"]
        return ready[-1].get("reused_cohort") if ready else None

    rows = []
    runs: dict[str, str] = {}  # run id -> the pair's id, with "'" for its paraphrase
    try:
        for pair in pairs:
            counts, run_ids = [], []
            for task in (pair["task"], pair["paraphrase"]):
                run = engine.create_run(
                    task, model=f"scripted:{script}", options=RunOptions(auto_approve=True)
                )
                final = await engine.execute(run.id)
                if final.status != "succeeded":
                    raise SystemExit(f"reuse bench: run {run.id} {final.status}: {final.error}")
                counts.append(engine.report(run.id)["usage"])
                runs[run.id] = pair["id"] + ("'" if run_ids else "")
                run_ids.append(run.id)
            # a cohort's id is the id of the run that stored it
            first_reused, repeat_reused = (reused_cohort(run_id) for run_id in run_ids)
            rows.append(
                {
                    "id": pair["id"],
                    "first_calls": counts[0]["llm_calls"],
                    "repeat_calls": counts[1]["llm_calls"],
                    "repeat_planner_calls": counts[1]["by_purpose"].get("planner", {}).get("calls", 0),
                    "reused": repeat_reused is not None,
                    "reused_own": repeat_reused is not None and repeat_reused in run_ids[:1],
                    "first_reused": first_reused,
                    "wrong_reuses": [
                        f"{runs[run_id]} reused {runs[cohort]}"
                        for run_id, cohort in zip(run_ids, (first_reused, repeat_reused), strict=True)
                        if cohort is not None and cohort != run_ids[0]
                    ],
                }
            )
    finally:
        engine.close()
    return rows


def measure_reuse(embedder_spec: str, pairs: list[dict[str, str]], folder: Path) -> dict[str, Any]:
    try:
        resolve_embedder(embedder_spec)
    except ConfigError as exc:
        return {"embedder": embedder_spec, "skipped": str(exc)}
    home = folder / f"reuse-{embedder_spec.replace(':', '_').replace('/', '_')}"
    home.mkdir()
    os.environ["MASTERPLANNER_HOME"] = str(home)
    os.environ["MASTERPLANNER_EMBEDDER"] = embedder_spec
    rows = asyncio.run(_reuse_runs(pairs, _script(folder)))
    reused = [row for row in rows if row["reused"]]
    first = sum(row["first_calls"] for row in rows)
    return {
        "embedder": embedder_spec,
        "pairs": len(rows),
        "reused": len(reused),
        # the team of the same task's first run, or of another task (a wrong reuse)
        "reused_own_team": sum(row["reused_own"] for row in reused),
        # a first run is a task not seen before: reusing a stored team there is reusing another task's
        "first_runs_reusing_a_team": sum(row["first_reused"] is not None for row in rows),
        "wrong_reuses": [text for row in rows for text in row["wrong_reuses"]],
        "first_run_calls_mean": round(first / len(rows), 2),
        "repeat_calls_mean": round(sum(row["repeat_calls"] for row in rows) / len(rows), 2),
        "reused_repeat_calls_mean": round(sum(r["repeat_calls"] for r in reused) / len(reused), 2)
        if reused
        else None,
        "reused_repeat_planner_calls": sum(r["repeat_planner_calls"] for r in reused),
        "calls_saved_when_reused": round(
            1 - sum(r["repeat_calls"] for r in reused) / sum(r["first_calls"] for r in reused), 3
        )
        if reused
        else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sections", default="latency,recall,reuse")
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--embedders", default="none,smollm2,local")
    parser.add_argument("--reuse-pairs", type=int, default=30)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", type=Path, help="keep the latency databases here and reuse them")
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    embedders = args.embedders.split(",")
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        if "latency" in sections:
            rng = random.Random(11)
            queries = [" ".join(_draw(rng, rng.randint(3, 7))) for _ in range(args.queries)]
            kept = args.keep or folder
            kept.mkdir(parents=True, exist_ok=True)
            figures["latency"] = [measure_latency(int(size), queries, kept) for size in args.sizes.split(",")]
        pairs = load_pairs()
        if "recall" in sections:
            figures["recall"] = [measure_recall(spec, pairs, folder) for spec in embedders]
        if "reuse" in sections:
            figures["reuse"] = [measure_reuse(spec, pairs[: args.reuse_pairs], folder) for spec in embedders]
        if "calibrate" in sections:
            figures["calibrate"] = [measure_calibration(spec) for spec in embedders if spec != "none"]
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    for row in figures.get("latency", []):
        print(
            f"latency {row['agents']:>7} agents: p50 {row['p50_ms']} ms, p95 {row['p95_ms']} ms "
            f"(bare FTS5 p95 {row['anchor_p95_ms']} ms; ratio {row['p95_ratio_to_anchor']}); "
            "target p95 <= 10 ms at 100k"
        )
    for row in figures.get("recall", []):
        print(f"recall  {row['embedder']}: " + json.dumps({k: v for k, v in row.items() if k != "embedder"}))
    for row in figures.get("reuse", []):
        print(f"reuse   {row['embedder']}: " + json.dumps({k: v for k, v in row.items() if k != "embedder"}))
    for row in figures.get("calibrate", []):
        print(f"scale   {row['embedder']}: " + json.dumps({k: v for k, v in row.items() if k != "embedder"}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
