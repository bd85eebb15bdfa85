"""Sandbox benchmark: start-to-exit of a trivial `code_execution` vs a bare subprocess, same run.

    python bench/sandbox.py [--repeat 30] [--json]

Both run `/usr/bin/python3 -I -c pass`: the anchor as a plain subprocess, ours through the
whole jail (prlimit, as root the private mount namespace and setpriv, bwrap, seccomp). Figure:
p50 milliseconds added by the jail. Target: <= 25 ms.
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


async def measure(repeat: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        workspace = Path(folder)
        await bare()
        await jailed(workspace)
        anchor, ours = [], []
        for _ in range(repeat):  # interleaved, so both see the same machine load
            anchor.append(await bare())
            ours.append(await jailed(workspace))
    p50_anchor = statistics.median(anchor) * 1000
    p50_ours = statistics.median(ours) * 1000
    return {
        "bare_p50_ms": round(p50_anchor, 2),
        "sandboxed_p50_ms": round(p50_ours, 2),
        "added_p50_ms": round(p50_ours - p50_anchor, 2),
        "ratio": round(p50_ours / p50_anchor, 3),
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
        f"-> {figures['added_p50_ms']} ms added (ratio {figures['ratio']}; target <= 25 ms added)"
    )


if __name__ == "__main__":
    main()
