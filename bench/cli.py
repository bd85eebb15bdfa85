"""CLI command cost: wall and CPU time of the commands that read runs or the registry, beside anchors.

    python bench/cli.py [--repeat N] [--runs N] [--json]

Each command runs in a fresh process on a home of its own (made here, with `--runs` runs in its
database, none executing, and as many agents and teams in its registry, with three memories),
`--repeat` times; the figures are medians. The registry's commands run with the default
embedder setting (smollm2), as a user's would. Anchors, measured in the
same run the same way: `python -c pass` (the interpreter's start-up) and
`python -c "import sqlalchemy"` (what reading the run store needs at the least). Ratios are to
the sqlalchemy anchor: machines here are noisy, so compare ratios across runs, not seconds.

Why: a `runs list` that imported the engine (pydantic-ai, DBOS, the models) took 4 s of CPU on
a loaded machine, and a `runs cancel` landed 14 s late; `agents list` imported NumPy,
pydantic-ai and the embedder's code to read the database.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one process running `args` to its end."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def median_of(args: list[str], env: dict[str, str], repeat: int) -> tuple[float, float]:
    times = [timed(args, env) for _ in range(repeat)]
    return statistics.median(wall for wall, _ in times), statistics.median(cpu for _, cpu in times)


def make_runs(home: Path, count: int) -> list[str]:
    """`count` runs in the home's database, created and left for workers (nothing executes them)."""
    os.environ["MASTERPLANNER_HOME"] = str(home)
    from masterplanner import Settings
    from masterplanner.engine import Engine

    script = home.parent / "script.json"
    script.write_text(json.dumps({"calls": [{"purpose": "*", "repeat": True}]}))
    engine = Engine(Settings.load())
    try:
        return [
            engine.create_run(f"task {number}", model=f"scripted:{script}", for_workers=True).id
            for number in range(count)
        ]
    finally:
        engine.close()


def fill_registry(home: Path, count: int) -> str:
    """`count` agents and teams and three memories in the home's registry; the first agent's id."""
    from masterplanner import Settings
    from masterplanner.registry import AgentSpec, Cohort, open_registry
    from masterplanner.registry.memory import MemoryStore

    os.environ["MASTERPLANNER_HOME"] = str(home)
    registry = open_registry(Settings.load(embedder="none"))  # nothing is embedded here
    try:
        for number in range(count):
            registry.put_agent(
                AgentSpec(
                    id=f"agent-{number}",
                    name=f"writer {number}",
                    role="report writer",
                    description=f"Writes report number {number} from the monthly figures.",
                    system_prompt="You write short, exact reports.",
                )
            )
            task = f"Write report {number} on the monthly figures"
            plan = {"task": task, "steps": []}
            registry.put_cohort(Cohort.model_validate({"id": f"team-{number}", "task": task, "plan": plan}))
        memory = MemoryStore(registry, ttl_days=30, max_items=100)
        for fact in ("Reports go to reports/", "Figures are in EUR", "The month starts on the 1st"):
            memory.remember(fact, source="bench")
    finally:
        registry.close()
    return "agent-0"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--runs", type=int, default=50, help="runs in the database (default 50)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="mp-bench-cli-") as folder:
        home = Path(folder) / "home"
        runs = make_runs(home, max(args.runs, args.repeat))
        agent = fill_registry(home, args.runs)
        env = {**os.environ, "MASTERPLANNER_HOME": str(home), "COLUMNS": "200"}
        env.pop("MASTERPLANNER_EMBEDDER", None)  # the default: smollm2
        mp = [sys.executable, "-m", "masterplanner"]
        anchors = {
            "python -c pass": median_of([sys.executable, "-c", "pass"], env, args.repeat),
            "python -c 'import sqlalchemy'": median_of(
                [sys.executable, "-c", "import sqlalchemy"], env, args.repeat
            ),
        }
        figures = {
            "--help": median_of([*mp, "--help"], env, args.repeat),
            "runs list": median_of([*mp, "runs", "list"], env, args.repeat),
            "runs show RUN": median_of([*mp, "runs", "show", runs[0]], env, args.repeat),
            "agents list": median_of([*mp, "agents", "list"], env, args.repeat),
            "agents show AGENT": median_of([*mp, "agents", "show", agent], env, args.repeat),
            "cohorts list": median_of([*mp, "cohorts", "list"], env, args.repeat),
            "memory list": median_of([*mp, "memory", "list"], env, args.repeat),
        }
        cancels = [
            timed([*mp, "runs", "cancel", run_id, "--wait", "0"], env) for run_id in runs[-args.repeat :]
        ]
        figures["runs cancel RUN"] = (
            statistics.median(wall for wall, _ in cancels),
            statistics.median(cpu for _, cpu in cancels),
        )

    anchor_wall, anchor_cpu = anchors["python -c 'import sqlalchemy'"]
    if args.json:
        print(
            json.dumps(
                {
                    name: {
                        "wall_s": round(wall, 3),
                        "cpu_s": round(cpu, 3),
                        "wall_ratio": round(wall / anchor_wall, 2),
                        "cpu_ratio": round(cpu / anchor_cpu, 2),
                    }
                    for name, (wall, cpu) in {**anchors, **figures}.items()
                }
            )
        )
        return
    print(f"{'command':<32} {'wall s':>8} {'cpu s':>8} {'wall/anchor':>12} {'cpu/anchor':>11}")
    for name, (wall, cpu) in {**anchors, **figures}.items():
        print(f"{name:<32} {wall:8.3f} {cpu:8.3f} {wall / anchor_wall:12.2f} {cpu / anchor_cpu:11.2f}")
    print("(anchor: python -c 'import sqlalchemy')")


if __name__ == "__main__":
    main()
