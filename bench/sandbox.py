"""Sandbox benchmark: start-to-exit of a trivial `code_execution` vs a bare subprocess, same run.

    python bench/sandbox.py [--repeat 30] [--json]

Both run `/usr/bin/python3 -I -c pass`: the anchor as a plain subprocess, ours through the
whole jail (as root the private mount namespace, the workspace lent and handed back, setpriv;
prlimit, bwrap, seccomp, the budget watchdog). Figure: p50 milliseconds added by the jail.
Target: <= 25 ms.

Second figure: what the watchdog costs while a program runs — the host process's CPU time
during 2 s of a sandbox running 6 processes (`sleep`), as a share of one core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from masterplanner.sandbox import run_in_sandbox, sandbox_problems

ARGV = ["/usr/bin/python3", "-I", "-c", "pass"]


async def bare() -> float:
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(*ARGV)
    await process.wait()
    return time.perf_counter() - started


async def jailed(workspace: Path) -> float:
    started = time.perf_counter()
    result = await run_in_sandbox(ARGV, workspace)
    if result.exit_code != 0:
        raise SystemExit(f"sandboxed run failed: {result.stderr}")
    return time.perf_counter() - started


async def watchdog_cost(workspace: Path) -> float:
    """Host CPU seconds per wall second while a 6-process sandbox sleeps for 2 s."""
    cpu = time.process_time()
    sleepers = ["/usr/bin/bash", "-c", "for i in 1 2 3 4; do sleep 2 & done; wait"]
    result = await run_in_sandbox(sleepers, workspace)
    if result.exit_code != 0:
        raise SystemExit(f"sandboxed run failed: {result.stderr}")
    return (time.process_time() - cpu) / result.seconds


async def measure(repeat: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        workspace = Path(folder)
        await bare()
        await jailed(workspace)
        anchor, ours = [], []
        for _ in range(repeat):  # interleaved, so both see the same machine load
            anchor.append(await bare())
            ours.append(await jailed(workspace))
        cost = statistics.median([await watchdog_cost(workspace) for _ in range(3)])
    p50_anchor = statistics.median(anchor) * 1000
    p50_ours = statistics.median(ours) * 1000
    return {
        "bare_p50_ms": round(p50_anchor, 2),
        "sandboxed_p50_ms": round(p50_ours, 2),
        "added_p50_ms": round(p50_ours - p50_anchor, 2),
        "ratio": round(p50_ours / p50_anchor, 3),
        "host_cpu_while_running_pct": round(cost * 100, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if sandbox_problems():
        raise SystemExit("the sandbox cannot start: " + "; ".join(sandbox_problems()))
    figures = asyncio.run(measure(args.repeat))
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(
        f"trivial program p50: bare {figures['bare_p50_ms']} ms, sandboxed {figures['sandboxed_p50_ms']} ms "
        f"-> {figures['added_p50_ms']} ms added (ratio {figures['ratio']}; target <= 25 ms added)\n"
        f"while a 6-process sandbox runs: the host (watchdog included) uses "
        f"{figures['host_cpu_while_running_pct']} % of a core"
    )


if __name__ == "__main__":
    main()
