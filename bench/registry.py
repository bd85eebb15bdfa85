"""Registry benchmark: lexical retrieval latency at 1k, 10k and 100k synthetic agents.

    python bench/registry.py [--sizes 1000,10000,100000] [--queries 200] [--json]

For each size, the same queries run through `RegistryStore.search_agents` (FTS5 BM25, the join
to the agents table, the track-record prior) and, as the anchor in the same run, through a bare
FTS5 `MATCH … ORDER BY rank LIMIT 5` on the same index. Figures: p50 and p95 milliseconds and
the ratio of our p95 to the anchor's. Target: p95 <= 10 ms at 100k agents (lexical).
Not measured yet: recall@5 on a paraphrase set and the reuse figures (issue 6 continues).
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from masterplanner.registry import AgentSpec, RegistryStore

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


def measure(size: int, queries: list[str], folder: Path) -> dict[str, float]:
    url = f"sqlite:///{folder / f'registry-{size}.sqlite'}"
    store = RegistryStore(url)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rng = random.Random(11)
    queries = [" ".join(_draw(rng, rng.randint(3, 7))) for _ in range(args.queries)]
    with tempfile.TemporaryDirectory() as folder:
        figures = [measure(int(size), queries, Path(folder)) for size in args.sizes.split(",")]
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    for row in figures:
        print(
            f"{row['agents']:>7} agents: p50 {row['p50_ms']} ms, p95 {row['p95_ms']} ms "
            f"(bare FTS5 p95 {row['anchor_p95_ms']} ms; ratio {row['p95_ratio_to_anchor']}); "
            "target p95 <= 10 ms at 100k"
        )


if __name__ == "__main__":
    main()
