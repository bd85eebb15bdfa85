"""Scale-out benchmark: runs shared by 1, 2 and 4 worker processes over one Postgres database.

    python bench/scale.py [--runs 500] [--steps 5] [--delay 0.05] [--workers 1,2,4]
                          [--concurrency 8] [--json]

Each configuration gets a fresh Postgres database on 127.0.0.1:5432 (dropped afterwards) and
that many `masterplanner worker` processes. --runs runs of a --steps-step chain, every step one
scripted model request of --delay seconds, are queued for the workers from this process
(`Engine.create_run(for_workers=True)`, auto-approved, no critique rounds, no registry), and the
clock runs from the first run queued to the last run ended. Printed per configuration:

- steps/s: steps finished per second of that wall time; ratio = steps/s over the 1-worker
  configuration's, measured in the same job (ideal: the number of workers, on enough cores);
- queue delay: from a step's workflow being put on its provider's queue to a worker taking it
  (DBOS's `created_at` → `started_at_epoch_ms`), p50 and p95 in ms, and p95 as a ratio to the
  queue's poll interval (`queue_poll_s`, the anchor: a step waits about one poll when a worker
  has room).

The one-process figure beside LangGraph is bench/engine.py's (it needs LangGraph installed).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from _steps import seconds, step
from masterplanner import Settings
from masterplanner.engine import Engine, RunOptions

SERVER = "postgresql://postgres@127.0.0.1:5432"
OPTIONS = RunOptions(auto_approve=True, prompt_rounds=0, max_model_calls=1000)


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def _script(folder: Path, steps: int, delay: float) -> str:
    ids = [f"s{n}" for n in range(1, steps + 1)]
    plan = [step(ids[0]), *(step(ids[n], ids[n - 1]) for n in range(1, steps))]
    calls: list[dict[str, Any]] = [{"purpose": "planner", "output": {"steps": plan}, "repeat": True}]
    calls += [
        {"purpose": f"step:{step_id}", "output": step_id, "delay_s": delay, "repeat": True} for step_id in ids
    ]
    calls.append({"purpose": "*", "repeat": True})
    path = folder / "script.json"
    path.write_text(json.dumps({"calls": calls}))
    return f"scripted:{path}"


def _configuration(count: int, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    name = f"mp_scale_{secrets.token_hex(4)}"
    with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = f"{SERVER}/{name}"
    home = folder / f"home-{count}"
    env = {
        **os.environ,
        "MASTERPLANNER_HOME": str(home),
        "MASTERPLANNER_DATABASE_URL": url,
        "MASTERPLANNER_EMBEDDER": "none",
        "MASTERPLANNER_REMEMBER_RUNS": "never",
        "MASTERPLANNER_REUSE_THRESHOLD": "1.01",
        "MASTERPLANNER_WORKER_CONCURRENCY": str(args.concurrency),
    }
    workers: list[subprocess.Popen[bytes]] = []
    engine: Engine | None = None
    try:
        for index in range(count):
            log = (folder / f"worker-{count}-{index}.log").open("w")
            workers.append(
                subprocess.Popen(
                    [sys.executable, "-m", "masterplanner", "worker", "--max-runs", str(args.max_runs)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            )
        os.environ.update({key: value for key, value in env.items() if key.startswith("MASTERPLANNER_")})
        engine = Engine(Settings.load())
        while len([p for p in engine.store.processes.listed() if p.kind == "worker"]) < count:
            time.sleep(0.2)
        model = _script(folder, args.steps, args.delay)
        started = time.time()
        run_ids = [
            engine.create_run(f"chain {n}", model=model, options=OPTIONS, for_workers=True).id
            for n in range(args.runs)
        ]
        queued_s = time.time() - started
        while True:
            runs = engine.store.list_runs(args.runs + 10)
            if all(run.finished for run in runs if run.id in run_ids) and len(runs) >= args.runs:
                break
            time.sleep(0.5)
        statuses = [run.status for run in runs]
        errors = sorted({str(run.error)[:300] for run in runs if run.status != "succeeded"})
        ended = max(seconds(run.updated_at) for run in runs)
        wall = ended - started
        with psycopg.connect(url) as connection:
            rows = connection.execute(
                "SELECT started_at_epoch_ms - created_at FROM dbos.workflow_status "
                "WHERE queue_name LIKE 'steps-%' AND started_at_epoch_ms IS NOT NULL"
            ).fetchall()
        delays = [float(row[0]) for row in rows]
        poll_ms = Settings.load().queue_poll_s * 1000
        return {
            "workers": count,
            "runs": args.runs,
            "succeeded": statuses.count("succeeded"),
            "errors": errors[:3],
            "queued_s": round(queued_s, 2),
            "wall_s": round(wall, 2),
            "steps_per_s": round(args.runs * args.steps / wall, 2),
            "queue_delay_p50_ms": round(statistics.median(delays), 1),
            "queue_delay_p95_ms": round(_percentile(delays, 0.95), 1),
            "queue_delay_p95_per_poll": round(_percentile(delays, 0.95) / poll_ms, 2),
        }
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            try:
                worker.wait(timeout=60)
            except subprocess.TimeoutExpired:
                worker.kill()
        if engine is not None:
            engine.close()
        with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--delay", type=float, default=0.05)
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--max-runs", type=int, default=64, help="runs each worker coordinates at once (its default)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    counts = [int(part) for part in args.workers.split(",")]
    results = []
    with tempfile.TemporaryDirectory(prefix="mp-scale-") as folder:
        for count in counts:
            results.append(_configuration(count, args, Path(folder)))
            print(f"{count} worker(s): done", file=sys.stderr)
    base = results[0]["steps_per_s"]
    for result in results:
        result["scaling_ratio"] = round(result["steps_per_s"] / base, 2)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(
        f"{args.runs} runs x {args.steps} steps ({args.delay * 1000:g} ms scripted), "
        f"{args.concurrency} steps at once per worker, {os.cpu_count()} cores"
    )
    for result in results:
        print(
            f"{result['workers']} worker(s): {result['succeeded']}/{result['runs']} succeeded in "
            f"{result['wall_s']} s · {result['steps_per_s']} steps/s "
            f"(ratio {result['scaling_ratio']} to 1 worker)"
            f" · queue delay p50 {result['queue_delay_p50_ms']} ms, p95 {result['queue_delay_p95_ms']} ms"
            f" ({result['queue_delay_p95_per_poll']} polls)"
        )


if __name__ == "__main__":
    main()
