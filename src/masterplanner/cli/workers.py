"""`masterplanner worker` (queued runs and steps from the shared database) and `masterplanner workers`."""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Annotated, Any

import typer

from .common import app, console, load_settings, number, whole_number
from .terminal import json_text, shown, visible

__all__ = ["worker", "workers"]


@app.command(short_help="Execute queued runs and steps until stopped (SIGTERM or Ctrl-C).")
def worker(
    concurrency: Annotated[
        int | None,
        typer.Option(
            "--concurrency",
            parser=whole_number(),
            help="Steps this worker runs at once (default: the worker_concurrency setting).",
        ),
    ] = None,
    queues: Annotated[
        str | None,
        typer.Option(
            "--queues",
            help="Providers whose runs and steps it takes, comma-separated (anthropic, local, ollama, "
            "openai, scripted; default: each whose API key is set here).",
        ),
    ] = None,
    max_runs: Annotated[
        int, typer.Option("--max-runs", parser=whole_number(), help="Runs it coordinates at once (1-10000).")
    ] = 64,
    grace: Annotated[
        float,
        typer.Option(
            "--grace",
            parser=number,
            help="Seconds its ended runs' bookkeeping and running steps get, together, to finish "
            "when it is stopped.",
        ),
    ] = 30.0,
) -> None:
    """Take steps from the step queues and runs queued for workers, until SIGTERM or Ctrl-C.

    Several workers, on one machine or many, share a database (MASTERPLANNER_DATABASE_URL=
    postgresql://…): runs started with `masterplanner run --detach` (or the web app) are claimed
    by one of them, and their steps may execute on any. A worker takes the runs and steps of the
    providers it can call: by default each whose API key is set in its environment. A worker that
    dies is noticed by its lease lapsing (run_lease_s); the runs it coordinated are taken over and
    the steps it was running are handed to the others, which replay them from their last
    checkpoint. On SIGTERM it takes no new run or step, hands its runs over, and lets running
    steps finish within --grace seconds of the signal.
    """
    from ..errors import ConfigError
    from ..service import RunService

    if not 1 <= max_runs <= 10_000:
        raise ConfigError(f"--max-runs must be between 1 and 10000, got {max_runs}")
    if not 0 <= grace <= 3600:  # nan and inf too
        raise ConfigError(f"--grace must be from 0 to 3,600 seconds, got {grace:g}")
    if concurrency is not None and not 1 <= concurrency <= 1000:
        raise ConfigError(f"--concurrency must be between 1 and 1000, got {concurrency}")
    # each named once, in the order given (`scripted,scripted` listened to one queue twice)
    named = [] if queues is None else [name.strip() for name in queues.split(",") if name.strip()]
    providers = None if queues is None else list(dict.fromkeys(named))
    if providers is not None and not providers:
        raise ConfigError("--queues names no provider")
    from ..logs import configure_logging, log

    settings = load_settings(**({} if concurrency is None else {"worker_concurrency": concurrency}))
    configure_logging(settings.log_format, printable=visible)
    service = RunService(settings, debug="--debug" in sys.argv)

    def note(message: str, **fields: Any) -> None:
        log("worker", message, **fields)

    async def work() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        summary = await service.work(stop, providers=providers, max_runs=max_runs, grace_s=grace, note=note)
        note(
            f"stopped: {_runs(len(summary.runs))} ended here, {len(summary.handed_over)} handed over",
            event="worker_stopped",
            runs_ended=len(summary.runs),
            handed_over=len(summary.handed_over),
        )

    try:
        asyncio.run(work())
    finally:
        service.close()


@app.command(short_help="List the workers and other processes executing runs.")
def workers(
    all_: Annotated[bool, typer.Option("--all", help="Include processes that stopped or died.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the processes executing workflows on this database: workers first, then runs' own processes."""
    from ..service import RunService

    service = RunService(load_settings())
    try:
        processes = asyncio.run(service.processes(include_dead=all_))
    finally:
        service.close()
    if as_json:
        typer.echo(json_text([process.to_json_dict() for process in processes]))
        return
    out = console()
    if not processes:
        out.print("no live workers or processes" + ("" if all_ else " (--all lists stopped ones)"))
        return
    for process in processes:
        state = "alive" if process.alive else ("stopped" if process.stopped else "dead")
        queues = f" · {', '.join(process.queues)}" if process.queues else ""
        concurrency = f" · {process.concurrency} at once" if process.concurrency else ""
        out.print(
            f"{shown(process.id)} · {process.kind} · {state} · heard from {process.age_s:.1f} s ago"
            f"{queues}{concurrency}",
            highlight=False,
            soft_wrap=True,
        )


def _runs(count: int) -> str:
    return "1 run" if count == 1 else f"{count} runs"
