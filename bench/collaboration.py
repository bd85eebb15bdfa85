"""Collaboration benchmark: how fast a message reaches a running step; what a replan saves.

    python bench/collaboration.py [--runs 6] [--json]

Both parts run through masterplanner's engine with the scripted model (durable: SQLite, every
step a DBOS workflow, every model response checkpointed).

(a) delivery: in each of --runs runs, step `sender` sends 5 messages, one every 100 ms of
    scripted model time, to step `receiver` while `receiver` runs (its agent takes 11 turns, a
    `get_note` call each, every 50 ms of scripted model time and then some; a step agent has
    at most 12 model requests). A message is stored when it is sent and delivered at the receiver's next model
    request, so its latency (stored → delivered, p50 and p95 in ms) has the receiver's turn as
    its natural unit: the anchor is the receiver's median turn, measured in the same run
    (between its successive tool calls). Ratio = p50 latency / median turn; a message that waits
    for exactly the next turn scores ≤ 1. Target: ratio ≤ 1, and every message delivered once.
(b) replan: a chain of 10 steps whose step 7 fails all its attempts. With replanning, steps
    7-10 are replaced by four new steps in the same run; without, the run fails and the whole
    plan runs again as a new run (the way a person recovers without replans). Counted: model
    calls, and finished steps (1-6) executed again. Ratio = calls with replanning / calls of the
    failed run plus the rerun. Target: 0 finished steps executed again.

The registry is left out (`remember_runs = never`, `embedder = none`): bench/registry.py measures it.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from _steps import seconds, step
from masterplanner import Settings
from masterplanner.engine import Engine, RunOptions

CHAIN = 10
FAILING = 7
OPTIONS = RunOptions(auto_approve=True, prompt_rounds=0, retry_backoff_s=0.01, team_tools=True)


def _script(folder: Path, name: str, calls: list[dict[str, Any]]) -> str:
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"calls": [*calls, {"purpose": "*", "repeat": True}]}))
    return f"scripted:{path}"


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


async def _execute(engine: Engine, model: str, task: str, options: RunOptions = OPTIONS) -> str:
    record = engine.create_run(task, model=model, options=options)
    await engine.execute(record.id)
    return record.id


MESSAGES = 5
TURNS = 11


async def delivery(engine: Engine, folder: Path, runs: int) -> dict[str, Any]:
    """(a): latency of messages to a running step, against the step's own turn."""
    latencies: list[float] = []
    turns: list[float] = []
    delivered_events = 0
    for index in range(runs):
        run_id = await _delivery_run(engine, folder, index)
        stored = engine.store.messages.of_run(run_id)
        latencies += [
            (seconds(m.delivered_at) - seconds(m.created_at)) * 1000
            for m in stored
            if m.delivered_at is not None
        ]
        events = engine.store.events(run_id)
        called = [seconds(e.at) for e in events if e.kind == "tool_called" and e.step == "receiver"]
        turns += [(b - a) * 1000 for a, b in itertools.pairwise(called)]
        delivered_events += sum(1 for e in events if e.kind == "message_delivered")
    turn_ms = statistics.median(turns)
    return {
        "messages": runs * MESSAGES,
        "delivered": len(latencies),
        "delivered_events": delivered_events,
        "latency_p50_ms": round(_percentile(latencies, 0.5), 1),
        "latency_p95_ms": round(_percentile(latencies, 0.95), 1),
        "receiver_turn_ms": round(turn_ms, 1),
        "ratio": round(_percentile(latencies, 0.5) / turn_ms, 3),
    }


async def _delivery_run(engine: Engine, folder: Path, index: int) -> str:
    calls: list[dict[str, Any]] = [
        {"purpose": "planner", "output": {"steps": [step("sender"), step("receiver")]}}
    ]
    calls += [
        {
            "purpose": "step:sender",
            "tool_calls": [{"name": "send_message", "args": {"to": "receiver", "content": f"update {n}"}}],
            "delay_s": 0.1,
        }
        for n in range(MESSAGES)
    ]
    calls.append({"purpose": "step:sender", "output": "sent"})
    calls += [
        {
            "purpose": "step:receiver",
            "tool_calls": [{"name": "get_note", "args": {"key": "progress"}}],
            "delay_s": 0.05,
        }
        for _ in range(TURNS)
    ]
    calls.append({"purpose": "step:receiver", "output": "received"})
    run_id = await _execute(engine, _script(folder, f"delivery{index}", calls), f"messages {index}")
    record = engine.store.get_run(run_id)
    if record.status != "succeeded":
        raise SystemExit(f"delivery run {run_id} {record.status}: {record.error}")
    return run_id


def _chain_calls(*, fail: bool) -> list[dict[str, Any]]:
    chain = [step("s1")] + [step(f"s{n}", f"s{n - 1}") for n in range(2, CHAIN + 1)]
    calls: list[dict[str, Any]] = [{"purpose": "planner", "output": {"steps": chain}}]
    for n in range(1, CHAIN + 1):
        if n == FAILING and fail:
            garbage = {"tool_calls": [{"name": "no_such_tool", "args": {}}], "repeat": True}
            calls.append({"purpose": f"step:s{n}"} | garbage)
        else:
            calls.append({"purpose": f"step:s{n}", "output": f"s{n} done"})
    return calls


async def replanning(engine: Engine, folder: Path) -> dict[str, Any]:
    """(b): one run that replans steps 7-10, against a failed run and a rerun of the whole plan."""
    new = [f"r{n}" for n in range(FAILING, CHAIN + 1)]
    replacement = [step(new[0], f"s{FAILING - 1}")] + [step(b, a) for a, b in itertools.pairwise(new)]
    calls = _chain_calls(fail=True)
    calls.append({"purpose": "replanner", "output": {"steps": replacement}})
    calls += [{"purpose": f"step:{step_id}", "output": f"{step_id} done"} for step_id in new]
    replanned = await _execute(engine, _script(folder, "replan", calls), "chain with a replan")

    no_replans = RunOptions(**{**OPTIONS.to_json_dict(), "max_replans": 0})
    failed = await _execute(engine, _script(folder, "fail", _chain_calls(fail=True)), "chain", no_replans)
    rerun = await _execute(engine, _script(folder, "rerun", _chain_calls(fail=False)), "chain again")

    def counted(run_id: str) -> tuple[str, int, list[str]]:
        record = engine.store.get_run(run_id)
        started = [e.step or "" for e in engine.store.events(run_id) if e.kind == "step_started"]
        return record.status, int(engine.report(run_id)["usage"]["llm_calls"]), started

    status, calls_replanned, started = counted(replanned)
    failed_status, calls_failed, started_failed = counted(failed)
    rerun_status, calls_rerun, started_rerun = counted(rerun)
    finished = {f"s{n}" for n in range(1, FAILING)}
    if (status, failed_status, rerun_status) != ("succeeded", "failed", "succeeded"):
        raise SystemExit(f"replan runs ended {status}, {failed_status}, {rerun_status}")
    again_with = sum(started.count(s) - 1 for s in finished)
    again_without = sum(1 for s in started_rerun if s in finished) + sum(
        started_failed.count(s) - 1 for s in finished
    )
    return {
        "calls_with_replanning": calls_replanned,
        "calls_failed_run_and_rerun": calls_failed + calls_rerun,
        "finished_steps_run_again_with_replanning": again_with,
        "finished_steps_run_again_by_rerun": again_without,
        "ratio": round(calls_replanned / (calls_failed + calls_rerun), 3),
    }


async def measure(folder: Path, runs: int) -> dict[str, Any]:
    engine = Engine(Settings.load(home=folder / "home", remember_runs="never", embedder="none"))
    try:
        return {"delivery": await delivery(engine, folder, runs), "replan": await replanning(engine, folder)}
    finally:
        engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=6, help="delivery runs (5 messages each)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        result = asyncio.run(measure(Path(folder), args.runs))
    if args.json:
        print(json.dumps(result))
        return
    delivered, replan = result["delivery"], result["replan"]
    print(
        f"(a) delivery to a running step: {delivered['delivered']}/{delivered['messages']} delivered "
        f"({delivered['delivered_events']} message_delivered events); latency p50 "
        f"{delivered['latency_p50_ms']} ms, p95 {delivered['latency_p95_ms']} ms; the receiver's turn "
        f"{delivered['receiver_turn_ms']} ms; ratio p50/turn {delivered['ratio']} (target ≤ 1)"
    )
    print(
        f"(b) step {FAILING} of {CHAIN} fails: {replan['calls_with_replanning']} model calls "
        "with replanning, "
        f"{replan['calls_failed_run_and_rerun']} for the failed run and a rerun (ratio {replan['ratio']}); "
        f"finished steps run again: {replan['finished_steps_run_again_with_replanning']} with replanning "
        f"(target 0), {replan['finished_steps_run_again_by_rerun']} by the rerun"
    )


if __name__ == "__main__":
    main()
