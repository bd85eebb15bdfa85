"""Engine benchmark: orchestration cost and scheduling quality, beside LangGraph in the same job.

    python bench/engine.py [--anchor PATH] [--runs 100] [--json]

Runs `../shared/anchors/langgraph_overhead.py` (LangGraph with its SQLite checkpointer) in a
subprocess first, then the same shapes through masterplanner's engine with the scripted model
(durable: SQLite, every step a DBOS workflow, every model response checkpointed):

(a) chain: ms per step of a chain of zero-delay scripted steps (12-step plans, the plan limit,
    several runs), from the approval to the last step's end; ratio to LangGraph's durable ms/step.
    Each step is a real pydantic-ai agent run, so the cost of one bare agent run with the scripted
    model is measured too (LangGraph's nodes call no agent);
(b) fan-out: 8 independent steps of 0.5 s at --max-parallel 8: makespan / 0.5 s, the makespan
    from the approval to the last step's end (LangGraph's: the graph's invoke);
(c) uneven: A→B→C at 0.1 s each beside D at 0.3 s, E joining C and D: makespan / 0.3 s (the
    anchor's definition), the makespan as in (b); LangGraph's supersteps make E wait for a barrier;
(d) load: N concurrent runs of 5 chained steps at 0.2 s each in one process: all must
    succeed; wall time and peak RSS, and the wall time as a ratio to LangGraph's for the same
    shape (`bench/langgraph_load.py`, in a subprocess of the same job; ideal wall 1.0 s).

With --breakdown, the run store's calls during the chain runs of (a) are timed too and printed as
ms per step (timed in the worker threads they run in, so lock waits are included).
Targets: (a) ratio ≤ 1.0, (b) ≤ 1.05, (c) ≤ 1.05, (d) all succeed and the wall ratio ≤ 1.0.

The registry is left out (`remember_runs = never`, `embedder = none`): it is bench/registry.py's
to measure, and with it runs reuse each other's stored teams (a fan-out run once reused a chain's
team, whose steps the script did not delay, and measured a makespan shorter than its steps).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _steps import seconds, step
from masterplanner import Settings
from masterplanner.engine import Engine, RunOptions

DEFAULT_ANCHOR = Path(__file__).resolve().parents[2] / "shared" / "anchors" / "langgraph_overhead.py"
LOAD_ANCHOR = Path(__file__).resolve().parent / "langgraph_load.py"


def _script(folder: Path, name: str, steps: list[dict[str, Any]], delays: dict[str, float]) -> str:
    calls: list[dict[str, Any]] = [{"purpose": "planner", "output": {"steps": steps}}]
    calls += [
        {"purpose": f"step:{s['id']}", "output": f"{s['id']} done", "delay_s": delays.get(s["id"], 0.0)}
        for s in steps
    ]
    calls.append({"purpose": "*", "repeat": True})
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"calls": calls}))
    return f"scripted:{path}"


async def _run(engine: Engine, model: str, task: str, max_parallel: int = 4) -> dict[str, Any]:
    options = RunOptions(auto_approve=True, prompt_rounds=0, max_parallel=max_parallel)
    record = engine.create_run(task, model=model, options=options)
    final = await engine.execute(record.id)
    if final.status != "succeeded":
        raise SystemExit(f"benchmark run {final.id} {final.status}: {final.error}")
    report = engine.report(final.id)
    report["events"] = engine.store.events(final.id)
    return report


def _makespan(report: dict[str, Any]) -> float:
    """From the approval (the run phase starts) to the last step's end."""
    approved = next(seconds(event.at) for event in report["events"] if event.kind == "approved")
    return max(seconds(step["finished_at"]) for step in report["steps"]) - approved


async def bare_agent_ms(model: str, runs: int = 50) -> float:
    """The same step agent's cost alone: a pydantic-ai agent answering from the scripted model."""
    from pydantic_ai import Agent

    from masterplanner import resolve_model

    scripted = resolve_model(model)
    await Agent(scripted, instructions="You are a worker.").run("Do it.")
    started = time.perf_counter()
    for _ in range(runs):
        await Agent(scripted, instructions="You are a worker.").run("Do it.")
    return (time.perf_counter() - started) * 1000 / runs


_TIMED_STORE_CALLS = ("get_run", "steps", "step_event", "add_usage", "usage_totals", "heartbeat", "events")


def _time_store_calls(seconds: dict[str, float]) -> None:
    """Add each timed `RunStore` call's duration to `seconds` (for --breakdown)."""
    from masterplanner.engine.store import RunStore

    for name in _TIMED_STORE_CALLS:
        call = getattr(RunStore, name)

        def timed(*args: Any, _call: Any = call, _name: str = name, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return _call(*args, **kwargs)
            finally:
                seconds[_name] = seconds.get(_name, 0.0) + time.perf_counter() - started

        setattr(RunStore, name, timed)


async def measure(folder: Path, concurrent_runs: int, breakdown: bool = False) -> dict[str, Any]:
    engine = Engine(Settings.load(home=folder / "home", remember_runs="never", embedder="none"))
    store_seconds: dict[str, float] = {}
    try:
        chain = [step("s1")] + [step(f"s{n}", f"s{n - 1}") for n in range(2, 13)]
        chain_model = _script(folder, "chain", chain, {})
        await _run(engine, chain_model, "warm-up")
        if breakdown:
            _time_store_calls(store_seconds)
        per_step = []
        for index in range(5):
            report = await _run(engine, chain_model, f"chain {index}")
            approved = next(e.at for e in report["events"] if e.kind == "approved")
            last = max(seconds(step["finished_at"]) for step in report["steps"])
            per_step.append((last - seconds(approved)) * 1000 / len(chain))
        if breakdown:
            chain_seconds = dict(store_seconds)
            store_seconds.clear()

        agent_ms = await bare_agent_ms(_script(folder, "bare", [step("x")], {}))

        fan = [step(f"f{n}") for n in range(8)]
        fan_report = await _run(engine, _script(folder, "fan", fan, {s["id"]: 0.5 for s in fan}), "fan", 8)

        uneven = [step("a"), step("b", "a"), step("c", "b"), step("d"), step("e", "c", "d")]
        delays = {"a": 0.1, "b": 0.1, "c": 0.1, "d": 0.3}
        uneven_report = await _run(engine, _script(folder, "uneven", uneven, delays), "uneven")

        five = [step("s1")] + [step(f"s{n}", f"s{n - 1}") for n in range(2, 6)]
        five_model = _script(folder, "five", five, {s["id"]: 0.2 for s in five})
        started = time.perf_counter()
        results = await asyncio.gather(
            *(_run(engine, five_model, f"load {n}") for n in range(concurrent_runs)), return_exceptions=True
        )
        load_wall = time.perf_counter() - started
        succeeded = sum(
            1 for result in results if isinstance(result, dict) and result["status"] == "succeeded"
        )
    finally:
        engine.close()
    return {
        "chain_ms_per_step": round(statistics.median(per_step), 3),
        "bare_agent_ms": round(agent_ms, 3),
        "fanout_ratio": round(_makespan(fan_report) / 0.5, 3),
        "uneven_ratio": round(_makespan(uneven_report) / 0.3, 3),
        "load_runs": concurrent_runs,
        "load_succeeded": succeeded,
        "load_wall_s": round(load_wall, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    } | (
        {"store_ms_per_chain_step": {k: round(v * 1000 / (5 * 12), 3) for k, v in chain_seconds.items()}}
        if breakdown
        else {}
    )


def anchor(path: Path, *args: str) -> dict[str, Any]:
    result = subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise SystemExit(f"anchor {path} failed: {result.stderr.strip()[-500:]}")
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--anchor", type=Path, default=Path(os.environ.get("MASTERPLANNER_ANCHOR", DEFAULT_ANCHOR))
    )
    parser.add_argument("--runs", type=int, default=100, help="concurrent runs for the load figure")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--breakdown", action="store_true", help="time the run store's calls in (a)")
    args = parser.parse_args()
    lang = anchor(args.anchor) | anchor(LOAD_ANCHOR, str(args.runs))
    with tempfile.TemporaryDirectory() as folder:
        ours = asyncio.run(measure(Path(folder), args.runs, args.breakdown))
    figures = {
        "ours": ours,
        "langgraph": lang,
        "chain_ratio_to_langgraph_durable": round(
            ours["chain_ms_per_step"] / lang["chain_ms_per_step_durable"], 3
        ),
        "load_ratio_to_langgraph": round(ours["load_wall_s"] / lang["load_wall_s"], 3),
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(
        f"(a) chain: {ours['chain_ms_per_step']} ms/step vs LangGraph durable "
        f"{lang['chain_ms_per_step_durable']} ms/step -> ratio {figures['chain_ratio_to_langgraph_durable']} "
        "(target <= 1.0)"
    )
    print(
        f"    of which a bare pydantic-ai agent run with the scripted model alone costs "
        f"{ours['bare_agent_ms']} ms "
        f"(ratio {round(ours['bare_agent_ms'] / lang['chain_ms_per_step_durable'], 3)} by itself)"
    )
    print(
        f"(b) fan-out 8 x 0.5 s: makespan/0.5 s = {ours['fanout_ratio']} (LangGraph {lang['fanout_ratio']})"
    )
    print(f"(c) uneven DAG: makespan/0.3 s = {ours['uneven_ratio']} (LangGraph {lang['uneven_ratio']})")
    print(
        f"(d) {ours['load_runs']} concurrent runs x 5 steps x 0.2 s: {ours['load_succeeded']} succeeded in "
        f"{ours['load_wall_s']} s, peak RSS {ours['peak_rss_mb']} MB; LangGraph {lang['load_wall_s']} s "
        f"-> ratio {figures['load_ratio_to_langgraph']} (target <= 1.0)"
    )
    for name, ms in sorted(ours.get("store_ms_per_chain_step", {}).items(), key=lambda item: -item[1]):
        print(f"    (a) run store {name}: {ms} ms per step (planning's calls included)")


if __name__ == "__main__":
    main()
