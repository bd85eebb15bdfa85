"""Idle-worker benchmark: the CPU a `masterplanner worker` with nothing to do takes, by queue poll.

    python bench/idle_worker.py [--polls 0.05,0.2] [--settle 10] [--seconds 20] [--json]

For each poll (`queue_poll_s`) and each set of providers (three queues: no hosted provider's key
set; five: both keys set, values that are never used), a worker starts on a fresh Postgres
database on 127.0.0.1:5432 (dropped afterwards); after --settle seconds its CPU time (user +
system, from /proc) is read over --seconds. Printed: percent of one core, and as a ratio to the
first configuration measured in the same job (the anchor: the first poll with three queues).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from typing import Any

import psycopg

SERVER = "postgresql://postgres@127.0.0.1:5432"
KEYS = {
    "3 queues": {"OPENAI_API_KEY": "", "OPENAI_BASE_URL": "", "ANTHROPIC_API_KEY": ""},
    "5 queues": {"OPENAI_API_KEY": "sk-unused", "OPENAI_BASE_URL": "", "ANTHROPIC_API_KEY": "sk-ant-unused"},
}


def _cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(poll: float, keys: dict[str, str], settle: float, seconds: float) -> float:
    """Percent of one core an idle worker used over `seconds`."""
    name = f"mp_idle_{secrets.token_hex(4)}"
    with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        with tempfile.TemporaryDirectory() as home:
            env = {
                **os.environ,
                **keys,
                "MASTERPLANNER_DATABASE_URL": f"{SERVER}/{name}",
                "MASTERPLANNER_HOME": home,
                "MASTERPLANNER_QUEUE_POLL_S": str(poll),
            }
            worker = subprocess.Popen(
                [sys.executable, "-m", "masterplanner", "worker"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                time.sleep(settle)
                if worker.poll() is not None:
                    raise SystemExit(f"the worker exited with {worker.returncode} before it was measured")
                used, started = _cpu_seconds(worker.pid), time.monotonic()
                time.sleep(seconds)
                used = _cpu_seconds(worker.pid) - used
                return 100 * used / (time.monotonic() - started)
            finally:
                worker.terminate()
                worker.wait(timeout=60)
    finally:
        with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", default="0.05,0.2")
    parser.add_argument("--settle", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for poll in (float(text) for text in args.polls.split(",")):
        for label, keys in KEYS.items():
            rows.append(
                {
                    "poll_s": poll,
                    "queues": label,
                    "cpu_percent": measure(poll, keys, args.settle, args.seconds),
                }
            )
    anchor = rows[0]["cpu_percent"]
    for row in rows:
        row["ratio_to_anchor"] = round(row["cpu_percent"] / anchor, 2) if anchor else None
        row["cpu_percent"] = round(row["cpu_percent"], 1)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for row in rows:
        print(
            f"poll {row['poll_s']:g} s, {row['queues']}: {row['cpu_percent']} % of a core "
            f"({row['ratio_to_anchor']}x the first)"
        )


if __name__ == "__main__":
    main()
