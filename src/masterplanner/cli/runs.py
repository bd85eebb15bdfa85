"""`masterplanner run` and `masterplanner runs list|show|pending|answer|audit|resume|retry|cancel`.

Every command goes through the run service (`masterplanner.service.RunService`).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from ..event_text import clock, status_word
from ..usage import counted, failed_note, money
from .answering import TerminalAnswerer, how_to_answer
from .common import app, console, load_settings, number, whole_number
from .live import EventLines, LiveTree, event_line, print_summary, team_lines, wants_live_view
from .terminal import json_text, shown, visible

if TYPE_CHECKING:
    from ..service import Lease, RunRecord, RunService
    from ..settings import Settings

runs_app = typer.Typer(help="List, inspect, answer, resume, retry and cancel runs.", no_args_is_help=True)
app.add_typer(runs_app, name="runs")

_EXIT = {"succeeded": 0, "failed": 1, "cancelled": 1}
RunId = Annotated[str, typer.Argument(metavar="RUN_ID", help="The run's id (a unique prefix is enough).")]
T = TypeVar("T")


def _debug() -> bool:
    return "--debug" in sys.argv


def _service(settings: Settings) -> RunService:
    from ..service import RunService

    return RunService(settings, debug=_debug())


def _call(service: RunService, work: Callable[[RunService], Awaitable[T]]) -> T:
    """Run one service call to its end in this process, then release the service."""

    async def call() -> T:
        try:
            return await work(service)
        finally:
            service.close()

    return asyncio.run(call())


@app.command(short_help="Plan a task, review the plan, then run it.")
def run(
    task: Annotated[str, typer.Argument(metavar="TASK", help="The task to do.")],
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Model spec (default: the model setting).")
    ] = None,
    yes: Annotated[
        bool,
        typer.Option("--yes", "-y", help="Approve the plan, tool calls and storing the team without asking."),
    ] = False,
    workspace: Annotated[
        str | None,
        typer.Option("--workspace", help="Folder the step agents read and write (default: a new one)."),
    ] = None,
    max_parallel: Annotated[
        int, typer.Option("--max-parallel", parser=whole_number(), help="Steps running at once (1-64).")
    ] = 4,
    rounds: Annotated[
        int,
        typer.Option("--rounds", parser=whole_number(), help="Critique-and-revise rounds per prompt (0-5)."),
    ] = 1,
    step_timeout: Annotated[
        float,
        typer.Option(
            "--step-timeout",
            parser=number,
            help="Seconds one step attempt may take (waits for a person's answer not counted).",
        ),
    ] = 600.0,
    max_calls: Annotated[
        int, typer.Option("--max-calls", parser=whole_number(), help="Budget: model calls for the whole run.")
    ] = 200,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", parser=whole_number(), help="Budget: tokens for the whole run.")
    ] = 2_000_000,
    max_seconds: Annotated[
        float, typer.Option("--max-seconds", parser=number, help="Budget: seconds of execution.")
    ] = 3600.0,
    max_cost: Annotated[
        float | None,
        typer.Option(
            "--max-cost",
            parser=number,
            help="Budget: US dollars the run's model calls may cost (default: none).",
        ),
    ] = None,
    max_replans: Annotated[
        int,
        typer.Option(
            "--max-replans", parser=whole_number(), help="Replans of failed steps allowed in the run (0-10)."
        ),
    ] = 2,
    check_outputs: Annotated[
        bool,
        typer.Option(
            "--check-outputs",
            help="Check each step's output against its expected output; a shortfall is replanned.",
        ),
    ] = False,
    team: Annotated[
        bool | None,
        typer.Option(
            "--team/--no-team",
            help="Give step agents the team tools: messages, questions, notes "
            "(default: on, off for the embedded model).",
        ),
    ] = None,
    detach: Annotated[
        bool,
        typer.Option(
            "--detach",
            help="Queue the run for workers (`masterplanner worker`) and return at once, printing its id.",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the run report as JSON.")] = False,
) -> None:
    """Plan TASK, show the plan for review (approve, reject or edit), then execute it.

    Steps run as soon as their dependencies finish, up to --max-parallel at once. Whenever the
    run needs a person (the review, a tool call under policy `ask`, an agent's question), it
    opens a request: this terminal asks, and `masterplanner runs answer` from another shell
    answers too; with no terminal input the run waits for such an answer. A step that fails all
    its attempts is replanned (it and its dependents, up to --max-replans times; the new steps
    are a request like the plan). Every model response and tool result is checkpointed: after
    a crash, `masterplanner runs resume RUN_ID` continues where it stopped, and a run that
    failed goes on from where it failed with `masterplanner runs retry RUN_ID`. Exit code 0 when
    the run succeeded, 1 when it failed, was rejected or cancelled, 2 for a usage or
    configuration error. With --detach the run is queued for the workers sharing the database
    and the command exits 0 once it is recorded; follow it with `runs show`, answer it with
    `runs answer`.
    """
    from ..service import RunOptions

    _check_options(max_parallel=max_parallel, prompt_rounds=rounds, max_replans=max_replans)
    _check_seconds(step_timeout_s=step_timeout)
    _check_budgets(max_calls, max_tokens, max_seconds, max_cost)
    from ..service import answerer_name

    # made by the run only in a folder that exists (the engine refuses a path with a typo above it)
    made = workspace if workspace and not _exists(workspace) else None
    settings = load_settings(model=model)
    service = _service(settings)
    options = RunOptions(
        max_parallel=max_parallel,
        auto_approve=yes,
        step_timeout_s=step_timeout,
        prompt_rounds=rounds,
        max_model_calls=max_calls,
        max_tokens=max_tokens,
        max_wall_s=max_seconds,
        max_cost_usd=max_cost,
        max_replans=max_replans,
        check_outputs=check_outputs,
        team_tools=team,
    )
    try:
        record = asyncio.run(
            service.create(
                task,
                model=settings.model,
                options=options,
                workspace=workspace,
                for_workers=detach,
                by=answerer_name("cli"),
            )
        )
        if made is not None:
            console(stderr=True).print(
                f"workspace {shown(record.workspace)} did not exist: made it, empty", highlight=False
            )
    except BaseException:
        service.close()
        raise
    if detach:
        _detached(service, record, as_json=as_json)
        return
    console(stderr=True).print(
        f"[bold]run {shown(record.id)}[/] · workspace {shown(record.workspace)}",
        highlight=False,
        soft_wrap=True,
    )
    _execute(service, record.id, as_json=as_json)


_OPTION_FLAGS = {
    "max_parallel": "--max-parallel",
    "prompt_rounds": "--rounds",
    "max_replans": "--max-replans",
    "step_timeout_s": "--step-timeout",
}
"""The flag of `run` that sets each of these options (a `RunOptions` field)."""


def _check_options(**values: int) -> None:
    """Refuse a whole-number option flag out of its range (`WHOLE_OPTION_LIMITS`), naming the flag."""
    from ..engine.records import WHOLE_OPTION_LIMITS
    from ..errors import ConfigError

    for key, value in values.items():
        low, high = WHOLE_OPTION_LIMITS[key]
        if not low <= value <= high:
            raise ConfigError(f"{_OPTION_FLAGS[key]} must be between {low} and {high}, got {value}")


def _check_seconds(**values: float) -> None:
    """Refuse a duration flag that is not more than 0 or is past its limit (`SECONDS_OPTION_LIMITS`)."""
    from ..engine.records import SECONDS_OPTION_LIMITS
    from ..errors import ConfigError

    for key, value in values.items():
        most = SECONDS_OPTION_LIMITS[key]
        if not 0 < value <= most:  # NaN too
            raise ConfigError(
                f"{_OPTION_FLAGS[key]} must be more than 0 and at most {most:,g} seconds, got {value:g}"
            )


def _check_budgets(calls: int | None, tokens: int | None, seconds: float | None, cost: float | None) -> None:
    """Refuse a budget flag out of range (`ConfigError`, naming the flag); None is not given."""
    from ..engine.records import BUDGET_LIMITS
    from ..errors import ConfigError

    for key, amount, unit in (("max_wall_s", seconds, ""), ("max_cost_usd", cost, " (US dollars)")):
        if amount is not None and not 0 < amount <= BUDGET_LIMITS[key]:  # NaN too
            raise ConfigError(
                f"{_BUDGET_FLAGS[key]} must be more than 0 and at most {int(BUDGET_LIMITS[key]):,}{unit}, "
                f"got {amount:g}"
            )
    for key, count in (("max_model_calls", calls), ("max_tokens", tokens)):
        if count is not None and not 1 <= count <= BUDGET_LIMITS[key]:
            raise ConfigError(
                f"{_BUDGET_FLAGS[key]} must be from 1 to {int(BUDGET_LIMITS[key]):,}, got {count}"
            )


async def _waiting(service: RunService, record: RunRecord) -> str | None:
    """Why the run waits (`RunService.waiting`), in the terminal's words: what to type."""
    said = await service.waiting(record)
    return None if said is None else said.said("cli")


def _detached(service: RunService, record: RunRecord, *, as_json: bool) -> None:
    """Say where a run queued for workers is, and whether any worker is there to take it."""
    try:
        waiting = asyncio.run(_waiting(service, record))
    finally:
        service.close()
    if as_json:
        typer.echo(json_text({"run_id": record.id, "status": record.status, "workspace": record.workspace}))
    else:
        typer.echo(record.id)
    if waiting is not None:
        console(stderr=True).print(waiting, highlight=False, soft_wrap=True)


def _exists(folder: str) -> bool:
    """Whether `folder` (`~` expanded) exists; a `~name` of no user is the engine's to refuse."""
    try:
        return Path(folder).expanduser().exists()
    except RuntimeError:
        return False


def _execute(service: RunService, run_id: str, *, as_json: bool) -> None:
    started = time.monotonic()
    took: list[float] = []

    async def execute(service: RunService) -> tuple[RunRecord, bool, dict[str, Any]]:
        try:
            return await _execute_with_progress(service, run_id)
        finally:  # the run's time, not the release of the service (sending its trace) after it
            took.append(time.monotonic() - started)

    final, live, report = _call(service, execute)
    if as_json:
        typer.echo(json_text(report))
    elif report.get("output"):
        typer.echo(visible(report["output"], lines=True))
    print_summary(console(stderr=True), report, final, took[0], tree=live)
    raise typer.Exit(_EXIT.get(final.status, 0))


class _Terminal:
    """The CLI as a run's front end.

    It shows the run as its events are appended (a live tree in a terminal, event lines
    otherwise) and, as one answerer among others, asks the person about the run's requests
    one at a time, with the display paused meanwhile.
    """

    def __init__(self, service: RunService, run_id: str, history: list[Any]) -> None:
        from ..service import answerer_name

        self.service = service
        self.run_id = run_id
        self.out = console(stderr=True)
        self.seen = history[-1].seq if history else 0
        self.live = wants_live_view(self.out)
        self.display: EventLines | LiveTree = (
            LiveTree(self.out, run_id, history) if self.live else EventLines(self.out)
        )
        self.running = asyncio.Event()
        self.running.set()
        self.answerer = TerminalAnswerer(
            service, run_id, self.out, by=answerer_name("terminal"), pause=self.pause, resume=self.resume
        )
        self._plan_ids: tuple[str, ...] = ()

    async def flush(self) -> None:
        """Show the events appended since the last flush (and, live, redraw the tree)."""
        fresh = await self.service.events(self.run_id, after=self.seen)
        if fresh:
            self.seen = fresh[-1].seq
        if isinstance(self.display, EventLines):
            self.display.show(fresh)
            return
        steps = await self.service.steps(self.run_id) if fresh or not self._plan_ids else None
        plan = None
        if steps is not None and tuple(step.id for step in steps) != self._plan_ids:
            self._plan_ids = tuple(step.id for step in steps)
            planned = (await self.service.get(self.run_id)).plan
            plan = None if planned is None else planned.to_json_dict()
        usage = await self.service.usage(self.run_id)
        cost = money(usage["cost_usd"], usage["unpriced_calls"])
        self.display.show(fresh, steps=steps, calls=usage["llm_calls"], cost=cost, plan=plan)

    async def follow(self) -> None:
        while True:
            await self.running.wait()
            await self.flush()
            await asyncio.sleep(0.2)

    async def pause(self) -> None:
        self.running.clear()
        await self.flush()
        self.display.pause()

    def resume(self) -> None:
        self.display.resume()
        self.running.set()


async def _execute_with_progress(service: RunService, run_id: str) -> tuple[RunRecord, bool, dict[str, Any]]:
    """Execute the run in this terminal; also resume, beside it, runs left by a crash or a stopping worker.

    Returns the run's final record, whether it was shown as a live tree, and its report.
    """
    from ..errors import RunStoppedError

    terminal = _Terminal(service, run_id, await service.events(run_id))
    follower = asyncio.ensure_future(terminal.follow())
    answerer = asyncio.ensure_future(terminal.answerer.watch())
    crashed = [other for other in await service.abandoned_runs() if other != run_id]
    for other in crashed:
        lease = await service.lease(other)
        worker = None if lease is None else lease.handed_over_by
        why = (
            "interrupted by a crash" if worker is None else f"left by worker {shown(worker)} when it stopped"
        )
        terminal.out.print(f"resuming run {shown(other)}, {why}, beside this one", highlight=False)

    def waiting(lease: Lease) -> None:
        terminal.out.print(
            f"run {shown(run_id)} was being executed by {shown(lease.owner)}, last heard from "
            f"{lease.age_s:.1f} s ago: waiting up to {lease.left_s:.1f} s for it to be heard from again "
            "or for its lease to lapse",
            highlight=False,
            soft_wrap=True,
        )

    stop: BaseException | None = None
    try:
        results = await asyncio.gather(
            service.execute(run_id, on_wait=waiting),
            *(service.execute(other) for other in crashed),
            return_exceptions=True,
        )
    except BaseException as error:
        stop = error
        raise
    finally:
        # stopped first: a question cut off by Ctrl-C resumed the display, which drew the tree
        # again below "interrupted"
        for task in (answerer, follower):
            task.cancel()
        await asyncio.gather(answerer, follower, return_exceptions=True)
        if stop is not None:  # Ctrl-C: no summary follows, the tree stays where the run stopped
            terminal.display.close(keep=True)
            if isinstance(stop, (KeyboardInterrupt, asyncio.CancelledError)):
                terminal.out.print(_resume_hint(run_id), highlight=False, soft_wrap=True)
    stopped = isinstance(results[0], BaseException)
    if not stopped:
        await terminal.flush()
    terminal.display.close(keep=stopped)
    terminal.answerer.detach()
    from ..redaction import redacted

    for other, result in zip(crashed, results[1:], strict=True):
        # a run not resumed says why without a key its error quotes, as the `error:` line does
        if isinstance(result, BaseException):
            status = f"not resumed: {redacted(str(result))}"
        else:
            status = status_word(result.status)
        terminal.out.print(f"run {shown(other)}: {shown(status)}", highlight=False, soft_wrap=True)
    if isinstance(results[0], BaseException):
        if isinstance(results[0], RunStoppedError):  # its database failed: the run waits, unfinished
            terminal.out.print(_resume_hint(run_id), highlight=False, soft_wrap=True)
        raise results[0]
    final = results[0]
    if final.error:
        terminal.out.print(f"[red]{shown(final.error)}[/]", highlight=False, soft_wrap=True)
    if final.status == "failed":
        terminal.out.print(_retry_hint(final.id), highlight=False, soft_wrap=True)
    for request in await service.pending(run_id):  # the remember question comes after the run
        await terminal.answerer.take_up(request)
    return final, terminal.live, await service.report(run_id)


@runs_app.command("list", short_help="List runs, newest first.")
def runs_list(
    limit: Annotated[
        int, typer.Option("--limit", parser=whole_number(1, 10_000), help="How many runs to list.")
    ] = 50,
    search: Annotated[
        str | None, typer.Option("--search", help="Only runs whose task holds this text (in any case).")
    ] = None,
    status: Annotated[
        str | None,
        typer.Option(
            "--status",
            help="Only runs with this status: planning, awaiting_approval, running, succeeded, failed, "
            "cancelled.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List runs with their status, newest first (reads only; never resumes or executes anything).

    --search and --status find runs as the web app's search does. An unfinished run that no
    process executes says why: `(queued)` for a worker to take it, or `(stopped)` when the
    process that executed it stopped (`runs resume RUN_ID` goes on).
    """
    from typing import get_args

    from rich.table import Column, Table

    from ..engine.records import RunStatus
    from ..errors import ConfigError

    statuses = get_args(RunStatus)
    if status is not None and status not in statuses:  # the service's error would not name the flag
        raise ConfigError(f"--status must be one of {', '.join(statuses)}, got {status!r}")
    text = (search or "").strip() or None  # blank finds every run, as the web app's search box

    async def read(service: RunService) -> tuple[list[RunRecord], dict[str, str]]:
        records = await service.list_runs(limit, status=status, text=text)
        return records, dict(await service.idle(records))

    records, idle = _call(_service(load_settings()), read)
    if as_json:
        rows = [
            {"run_id": r.id, "status": r.status, "idle": idle.get(r.id)}
            | {"task": r.task, "created_at": r.created_at, "model": r.model}
            for r in records
        ]
        typer.echo(json_text(rows))
        return
    if not records:
        looked_for = [f"status {status}"] if status else []
        looked_for += [f"the search {text!r}"] if text else []
        said = f"no runs match {' and '.join(looked_for)}" if looked_for else "no runs yet"
        console(stderr=True).print(shown(said), highlight=False, soft_wrap=True)
        return
    # ids whole, never cut with "…": they are what `runs show` and `runs resume` take
    table = Table(Column("run", no_wrap=True, min_width=max((len(r.id) for r in records), default=3)))
    for heading in ("status", "created", "task"):
        table.add_column(heading)
    for record in records:
        task = record.task if len(record.task) <= 60 else record.task[:59] + "…"
        created = record.created_at[:19].replace("T", " ")
        # a run nobody executes says so: `queued` for a worker, or `stopped` (`runs resume` goes on)
        status = status_word(record.status) + (f" ({idle[record.id]})" if record.id in idle else "")
        table.add_row(shown(record.id), shown(status), shown(created), shown(task))
    console().print(table, highlight=False)


@runs_app.command("show", short_help="Show a run: plan, steps, events and usage.")
def runs_show(
    run_id: RunId,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    timeline: Annotated[
        bool, typer.Option("--timeline", help="Draw the steps on a time line (where each ran, how long).")
    ] = False,
) -> None:
    """Show a run (reads only; never resumes or executes anything)."""
    from rich.table import Column, Table

    async def read(service: RunService) -> tuple[dict[str, Any], list[Any], str | None]:
        report = await service.report(run_id)
        waiting = await _waiting(service, await service.get(report["run_id"]))
        return report, await service.events(report["run_id"]), waiting

    report, events, waiting = _call(_service(load_settings()), read)
    if as_json:
        typer.echo(
            json_text(report | {"waiting": waiting, "events": [event.to_json_dict() for event in events]})
        )
        return
    out = console()
    retried = report.get("retries") or 0
    status = shown(status_word(report["status"]))
    if retried:
        status += f" · retried {counted(retried, 'time')}"
    out.print(
        f"[bold]run {shown(report['run_id'])}[/] · {status} · {shown(report['task'])}",
        highlight=False,
        soft_wrap=True,
    )
    out.print(f"workspace {shown(report['workspace'])}", highlight=False, soft_wrap=True)
    if waiting is not None:
        out.print(f"[yellow]{shown(waiting)}[/]", highlight=False, soft_wrap=True)
    if timeline:
        from .timeline import timeline_lines

        processes: dict[str, str] = {}
        for event in events:  # where each step started, and any process that resumed it
            if event.kind in ("step_started", "step_resumed") and event.step:
                where = str(event.data.get("process") or "")
                earlier = processes.get(event.step)
                processes[event.step] = (
                    f"{earlier} → {where}" if earlier and event.kind == "step_resumed" else where
                )
        for line in timeline_lines(report["steps"], processes, width=out.width, now=time.time()):
            out.print(line, highlight=False, soft_wrap=True)
        return
    if report["plan"]:  # what each step was told to do, by whom, with which tools, after which steps
        from ..plan import Plan
        from .commands import print_plan_dict

        print_plan_dict(Plan.model_validate(report["plan"]), {})
    table = Table(Column("step", overflow="fold"), "status", "attempts", "started", "finished", "error")

    def add(steps: list[dict[str, Any]], depth: int) -> None:
        for step in steps:
            table.add_row(
                ("  " * depth + "└ " if depth else "") + shown(step["id"]),
                shown(status_word(step["status"])),
                shown(step["attempts"]),
                # local time, as the event lines below give it (it was the stored UTC, sliced)
                shown(clock(step["started_at"] or "")),
                shown(clock(step["finished_at"] or "")),
                shown(step["error"] or ""),
            )
            add(step.get("sub_steps", []), depth + 1)

    add(report["steps"], 0)
    out.print(table, highlight=False)
    out.print(_usage_table(report["usage"]), highlight=False)
    for line in team_lines(report):
        out.print(line, highlight=False, soft_wrap=True)
    for event in events:
        out.print(event_line(event), highlight=False, soft_wrap=True)
    if report["output"]:
        typer.echo(visible(report["output"], lines=True))


def _usage_table(usage: dict[str, Any]) -> Any:
    """Model calls, tokens, seconds and cost per purpose (a step's agent is `step:<id>`), and in all."""
    from rich.table import Table

    table = Table("purpose", "calls", "tokens in", "tokens out", "seconds", "cost")

    def price(entry: dict[str, Any]) -> str:
        return money(entry.get("cost_usd", 0.0), entry.get("unpriced_calls", 0)) or "unknown"

    for purpose, entry in usage["by_purpose"].items():
        table.add_row(
            shown(purpose),
            f"{entry['calls']:,}{failed_note(entry.get('failed_calls', 0))}",
            f"{entry['input_tokens']:,}",
            f"{entry['output_tokens']:,}",
            f"{entry['seconds']:.1f}",
            price(entry),
        )
    seconds = sum(entry["seconds"] for entry in usage["by_purpose"].values())
    table.add_row(
        "all",
        f"{usage['llm_calls']:,}{failed_note(usage.get('failed_calls', 0))}",
        f"{usage['input_tokens']:,}",
        f"{usage['output_tokens']:,}",
        f"{seconds:.1f}",
        price(usage),
        style="bold",
    )
    return table


@runs_app.command("pending", short_help="List the open requests runs wait on.")
def runs_pending(
    run_id: Annotated[
        str | None,
        typer.Argument(
            metavar="RUN_ID", help="Only this run's requests (a unique prefix of its id is enough)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List open requests — plan reviews, tool approvals, agents' questions, storing a team.

    Any process may answer them with `masterplanner runs answer REQUEST`; the run waiting on
    one goes on in whichever process runs it.
    """
    from rich.table import Column, Table

    requests = _call(_service(load_settings()), lambda service: service.pending(run_id))
    if as_json:
        typer.echo(json_text([request.to_json_dict() for request in requests]))
        return
    if not requests:
        console(stderr=True).print("no open requests", highlight=False)
        return
    table = Table(
        Column("request", no_wrap=True), Column("run", overflow="fold"), "kind", "asks", "answer with"
    )
    for request in requests:
        table.add_row(
            shown(request.id),
            shown(request.run_id),
            shown(request.kind),
            shown(request.summary()),
            shown(how_to_answer(request)),
        )
    console().print(table, highlight=False)


@runs_app.command("answer", short_help="Answer a run's open request.")
def runs_answer(
    request_id: Annotated[
        str, typer.Argument(metavar="REQUEST_ID", help="The request's id (from `runs pending`).")
    ],
    approve: Annotated[
        bool, typer.Option("--approve", help="Yes: approve the plan, allow the tool call, store the team.")
    ] = False,
    deny: Annotated[
        bool, typer.Option("--deny", help="No: reject the plan, refuse the tool call, do not store the team.")
    ] = False,
    reason: Annotated[str | None, typer.Option("--reason", help="Why (with --deny).")] = None,
    text: Annotated[str | None, typer.Option("--text", help="The answer to an agent's question.")] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print the answered request as JSON, with taken_before and follow_up_failed (as the API).",
        ),
    ] = False,
) -> None:
    """Answer REQUEST with exactly one of --approve, --deny [--reason R] or --text T.

    Exit code 2, with nothing changed, when the request does not exist, is already answered, or
    its run was cancelled; of two answers given at once exactly one is taken. The same answer
    given again from this host's command line (a script run twice) is no error: it says the
    request was answered so already, and nothing is stored again.
    """
    from ..errors import RequestError
    from ..service import answerer_name

    if sum((approve, deny, text is not None)) != 1:
        raise RequestError("answer with exactly one of --approve, --deny or --text")
    if reason is not None and not deny:
        raise RequestError("--reason goes with --deny")
    answered = _call(
        _service(load_settings()),
        lambda service: service.answer_plainly(
            request_id,
            by=answerer_name("cli"),
            approve=None if text is not None else approve,
            text=text,
            reason=reason,
        ),
    )
    said = f"request {shown(answered.id)} of run {shown(answered.run_id)} answered"
    if answered.taken_before:
        said = (
            f"request {shown(answered.id)} of run {shown(answered.run_id)} was answered so already "
            f"(by {shown(answered.answered_by or '')} at {shown(answered.answered_at or '')}): "
            "taken once, nothing stored again"
        )
    if answered.follow_up_failed:  # sent again, what the answer was for is tried again: it failed again
        said += f", but {shown(answered.follow_up_failed)}"
    if as_json:
        if answered.taken_before or answered.follow_up_failed:
            console(stderr=True).print(said, highlight=False, soft_wrap=True)
        # how it was taken, as the API's answer says it: a script reads the JSON, not stderr
        how = {"taken_before": answered.taken_before, "follow_up_failed": answered.follow_up_failed}
        typer.echo(json_text(answered.to_json_dict() | how))
        return
    console(stderr=True).print(said, highlight=False, soft_wrap=True)


@runs_app.command("remember", short_help="Store the team of a run that succeeded in the registry.")
def runs_remember(run_id: RunId) -> None:
    """Store the agents and the team of a run that succeeded, as a yes to its remember question does.

    For a team that was not stored: with `remember_runs = never`, or when storing it failed at
    the run's end or after a yes. Exit code 2, with nothing changed, when the run did not
    succeed, still asks whether to store its team (answer it with `runs answer`), has a team
    holding what looks like a secret, or has its team stored already.
    """
    from ..service import answerer_name

    cohort = _call(
        _service(load_settings()), lambda service: service.remember(run_id, by=answerer_name("cli"))
    )
    console(stderr=True).print(
        f"run {shown(cohort)}: its team is stored (masterplanner cohorts show {shown(cohort)})",
        highlight=False,
        soft_wrap=True,
    )


@runs_app.command("resume", short_help="Continue an interrupted run from its last checkpoint.")
def runs_resume(
    run_id: RunId,
    as_json: Annotated[bool, typer.Option("--json", help="Print the run report as JSON.")] = False,
) -> None:
    """Continue a run that stopped (crash, kill, Ctrl-C): finished steps are not run again."""
    service = _service(load_settings())
    try:
        record = asyncio.run(service.get(run_id))
    except BaseException:
        service.close()
        raise
    if not record.finished:
        said = f"[bold]resuming run {shown(record.id)}[/] ({shown(status_word(record.status))})"
        console(stderr=True).print(said, highlight=False, soft_wrap=True)
        _execute(service, record.id, as_json=as_json)

    # an ended run: its end is still finished, quietly, if a crash cut it short
    async def finish(service: RunService) -> tuple[RunRecord, dict[str, Any]]:
        final = await service.execute(record.id)
        return final, await service.report(final.id)

    final, report = _call(service, finish)
    said = f"run {shown(final.id)} {shown(final.status)}: there is nothing to resume"
    if final.status == "failed":
        said = f"run {shown(final.id)} failed: there is nothing to resume ({_retry_hint(final.id)})"
    console(stderr=True).print(said, highlight=False, soft_wrap=True)
    if as_json:
        typer.echo(json_text(report))
    raise typer.Exit(_EXIT.get(final.status, 0))


_BUDGET_FLAGS = {
    "max_model_calls": "--max-calls",
    "max_tokens": "--max-tokens",
    "max_cost_usd": "--max-cost",
    "max_wall_s": "--max-seconds",
}
"""The flag of `run` and `runs retry` that sets each budget (a `RunOptions` field)."""


def _resume_hint(run_id: str) -> str:
    run = shown(run_id)
    return f"run {run} stopped; to go on from where it stopped: masterplanner runs resume {run}"


def _retry_hint(run_id: str) -> str:
    return f"to run it again from where it failed: masterplanner runs retry {shown(run_id)}"


@runs_app.command("retry", short_help="Run a failed run again from where it failed.")
def runs_retry(
    run_id: RunId,
    max_calls: Annotated[
        int | None,
        typer.Option("--max-calls", parser=whole_number(), help="New budget: model calls for the whole run."),
    ] = None,
    max_tokens: Annotated[
        int | None,
        typer.Option("--max-tokens", parser=whole_number(), help="New budget: tokens for the whole run."),
    ] = None,
    max_seconds: Annotated[
        float | None,
        typer.Option("--max-seconds", parser=number, help="New budget: seconds of execution from now."),
    ] = None,
    max_cost: Annotated[
        float | None,
        typer.Option("--max-cost", parser=number, help="New budget: US dollars for the whole run."),
    ] = None,
    rounds: Annotated[
        int | None,
        typer.Option(
            "--rounds", parser=whole_number(), help="Critique-and-revise rounds per prompt from now (0-5)."
        ),
    ] = None,
    detach: Annotated[
        bool,
        typer.Option("--detach", help="Queue it for workers (`masterplanner worker`) and return at once."),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the run report as JSON.")] = False,
) -> None:
    """Run a failed run again from where it failed: its succeeded steps keep their outputs.

    Its failed steps, and those skipped or cancelled because of them, run afresh (with their
    replan budget again); a run that failed before its plan was approved is reviewed again.
    The run's budgets stay unless given here: its model calls, tokens and money count from
    the run's start, its seconds from this retry. A budget the run has used up is refused
    before anything changes. --rounds sets the critique rounds of the prompts written from
    now (a prompt kept from planning under other rounds is written again). The run executes in
    this terminal, or with --detach is queued for the workers sharing the database.
    """
    from ..errors import BudgetExceededError
    from ..service import answerer_name

    _check_budgets(max_calls, max_tokens, max_seconds, max_cost)
    if rounds is not None:
        _check_options(prompt_rounds=rounds)
    service = _service(load_settings())
    try:
        record = asyncio.run(
            service.retry(
                run_id,
                by=answerer_name("cli"),
                for_workers=detach,
                max_model_calls=max_calls,
                max_tokens=max_tokens,
                max_wall_s=max_seconds,
                max_cost_usd=max_cost,
                prompt_rounds=rounds,
            )
        )
    except BudgetExceededError as refused:
        service.close()
        flag = _BUDGET_FLAGS.get(refused.budget or "")
        raise BudgetExceededError(f"{refused} ({flag})" if flag else str(refused)) from None
    except BaseException:
        service.close()
        raise
    if detach:
        _detached(service, record, as_json=as_json)
        return
    console(stderr=True).print(
        f"[bold]retrying run {shown(record.id)}[/] ({shown(status_word(record.status))})",
        highlight=False,
        soft_wrap=True,
    )
    _execute(service, record.id, as_json=as_json)


@runs_app.command("audit", short_help="Who approved, edited, answered or cancelled what, and when.")
def runs_audit(
    run_id: RunId,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """The run's audit log: each answered request and cancel, who (front end@host:pid) and when.

    What people typed is shown with anything shaped like a credential removed.
    """
    entries = _call(_service(load_settings()), lambda service: service.audit(run_id))
    if as_json:
        typer.echo(json_text([entry.to_json_dict() for entry in entries]))
        return
    out = console()
    if not entries:
        out.print("nobody has answered or cancelled anything in this run")
        return
    for entry in entries:
        where = f" · step {shown(entry.step)}" if entry.step else ""
        request = f" · request {shown(entry.request)}" if entry.request else ""
        when = entry.at[:19].replace("T", " ")
        out.print(
            f"{shown(when)} · {shown(entry.by)}{where} · {shown(entry.action)}{request}",
            highlight=False,
            soft_wrap=True,
        )


@runs_app.command("cancel", short_help="Stop a run.")
def runs_cancel(
    run_id: RunId,
    wait: Annotated[
        float, typer.Option("--wait", parser=number, help="Seconds to wait for running steps to stop.")
    ] = 15.0,
) -> None:
    """Cancel a run: running steps stop promptly, no new step starts, its open requests close."""
    from ..errors import ConfigError
    from ..service import answerer_name

    if not 0 <= wait <= 3600:  # nan and inf too
        raise ConfigError(f"--wait must be from 0 to 3,600 seconds, got {wait:g}")
    by = answerer_name("cli")
    err = console(stderr=True)

    async def cancel(service: RunService) -> tuple[RunRecord, str | None]:
        with err.status(f"asking run {shown(run_id)} to stop; waiting up to {wait:g} s for it to stop"):
            record = await service.cancel(run_id, wait_s=wait, by=by)
        return record, None if record.finished else await _waiting(service, record)

    record, why = _call(_service(load_settings()), cancel)
    err.print(f"run {shown(record.id)} {shown(record.status)}", highlight=False)
    if why is not None:
        err.print(shown(why), highlight=False, soft_wrap=True)
    raise typer.Exit(0 if record.status == "cancelled" else 1)
