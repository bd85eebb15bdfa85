"""Registry benchmark: retrieval latency, paraphrase recall@5, and model calls saved by reuse.

    python bench/registry.py [--sections latency,recall,reuse] [--sizes 1000,10000,100000]
                             [--queries 200] [--embedders none,local] [--reuse-pairs 30] [--json]
                             [--keep DIR]

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
         reciprocal rank fusion), plus cosine alone as a reference. Also how often the top hit
         is right and clears the reuse threshold (would reuse correctly) and how often it is
         wrong and clears it (would reuse the wrong team), at several thresholds.
         Target: recall@5 >= 0.9 with the hybrid ranking.
reuse    The first N pairs run through the engine with the scripted model (3-step plan, one
         Prompt Creator round): each task, approved, then its paraphrase, in one registry.
         Model calls of the first run vs the repeat, and planner calls in the repeat.
         Target: 0 planner calls and >= 50 % fewer calls in a repeat that reuses.

An embedder that is not installed (`local` needs the extra `embeddings`) is reported as skipped.
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
from masterplanner.registry import AgentSpec, Cohort, RegistryStore, resolve_embedder

PARAPHRASES = Path(__file__).parent / "data" / "registry_paraphrases.jsonl"
THRESHOLDS = (0.5, 0.6, 0.7, 0.8)

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


def measure_recall(embedder_spec: str, pairs: list[dict[str, str]], folder: Path) -> dict[str, Any]:
    try:
        embedder = resolve_embedder(embedder_spec)
        if embedder is not None:
            embedder.embed_sync(["probe"], "query")
    except ConfigError as exc:
        return {"embedder": embedder_spec, "skipped": str(exc)}
    store = RegistryStore(f"sqlite:///{folder / f'recall-{len(os.listdir(folder))}.sqlite'}", embedder)
    for pair in pairs:
        store.put_cohort(_cohort(pair))
    started = time.perf_counter()
    store.similar_cohorts("warm the index up", 5)
    index_s = time.perf_counter() - started
    hits1 = hits5 = 0
    tops: list[tuple[bool, float]] = []
    latencies = []
    for pair in pairs:
        started = time.perf_counter()
        found = store.similar_cohorts(pair["paraphrase"], 5)
        latencies.append((time.perf_counter() - started) * 1000)
        ids = [cohort.id for cohort, _ in found]
        hits1 += bool(ids) and ids[0] == pair["id"]
        hits5 += pair["id"] in ids
        if found:
            tops.append((ids[0] == pair["id"], found[0][1]))
    store.close()
    figures: dict[str, Any] = {
        "embedder": embedder_spec,
        "ranking": "bm25" if embedder is None else "bm25+cosine (rrf)",
        "pairs": len(pairs),
        "recall_at_1": round(hits1 / len(pairs), 3),
        "recall_at_5": round(hits5 / len(pairs), 3),
        "search_p50_ms": round(statistics.median(latencies), 2),
        "index_s": round(index_s, 2),
        "similarity": "cosine" if embedder is not None else "ochiai of word stems",
        "reuse_at_threshold": {
            str(threshold): {
                "right": round(sum(right and sim >= threshold for right, sim in tops) / len(pairs), 3),
                "wrong": round(sum(not right and sim >= threshold for right, sim in tops) / len(pairs), 3),
            }
            for threshold in THRESHOLDS
        },
    }
    if embedder is not None:
        tasks = embedder.embed_sync([pair["task"] for pair in pairs], "document")
        queries = embedder.embed_sync([pair["paraphrase"] for pair in pairs], "query")
        order = np.argsort(-(queries @ tasks.T), axis=1)
        figures["cosine_only_recall_at_5"] = round(
            float(np.mean([n in order[n, :5] for n in range(len(pairs))])), 3
        )
    return figures


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
    from masterplanner.engine import Engine

    engine = Engine(Settings.load())

    async def approve(_run: Any, _catalog: Any) -> dict[str, Any]:
        return {"action": "approve"}

    rows = []
    try:
        for pair in pairs:
            counts = []
            for task in (pair["task"], pair["paraphrase"]):
                run = engine.create_run(task, model=f"scripted:{script}")
                final = await engine.execute(run.id, review=approve)
                if final.status != "succeeded":
                    raise SystemExit(f"reuse bench: run {run.id} {final.status}: {final.error}")
                counts.append(engine.report(run.id)["usage"])
            reused = any(
                e.data.get("reused_cohort") for e in engine.store.events(run.id) if e.kind == "plan_ready"
            )
            rows.append(
                {
                    "id": pair["id"],
                    "first_calls": counts[0]["llm_calls"],
                    "repeat_calls": counts[1]["llm_calls"],
                    "repeat_planner_calls": counts[1]["by_purpose"].get("planner", {}).get("calls", 0),
                    "reused": reused,
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
    parser.add_argument("--embedders", default="none,local")
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
    sys.stdout.flush()


if __name__ == "__main__":
    main()
