"""`masterplanner run` and `masterplanner runs list|show|resume|cancel`."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from .app import app, console, load_settings
from .live import EventLines, LiveTree, event_line, print_summary, wants_live_view
from .terminal import json_text, shown, visible

if TYPE_CHECKING:
    from ..engine import Decision, Engine, RunRecord
    from ..settings import Settings
    from ..tools import Catalog

runs_app = typer.Typer(help="List, inspect, resume and cancel runs.", no_args_is_help=True)
app.add_typer(runs_app, name="runs")

_EXIT = {"succeeded": 0, "failed": 1, "cancelled": 1}
RunId = Annotated[str, typer.Argument(help="The run's id (a unique prefix is enough).")]
T = TypeVar("T")


def _debug() -> bool:
    return "--debug" in sys.argv


def _engine(settings: Settings) -> Engine:
    from ..engine import Engine

    return Engine(settings, debug=_debug())


@app.command(short_help="Plan a task, review the plan, then run it.")
def run(
    task: Annotated[str, typer.Argument(help="The task to do.")],
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Model spec (default: the model setting).")
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Approve the plan without asking.")] = False,
    workspace: Annotated[
        Path | None,
        typer.Option("--workspace", help="Folder the step agents read and write (default: a new one)."),
    ] = None,
    max_parallel: Annotated[int, typer.Option("--max-parallel", help="Steps running at once (1-64).")] = 4,
    rounds: Annotated[int, typer.Option("--rounds", help="Critique-and-revise rounds per prompt (0-5).")] = 1,
    step_timeout: Annotated[
        float, typer.Option("--step-timeout", help="Seconds one step attempt may take.")
    ] = 600.0,
    max_calls: Annotated[
        int, typer.Option("--max-calls", help="Budget: model calls for the whole run.")
    ] = 200,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", help="Budget: tokens for the whole run.")
    ] = 2_000_000,
    max_seconds: Annotated[
        float, typer.Option("--max-seconds", help="Budget: seconds of execution.")
    ] = 3600.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the run report as JSON.")] = False,
) -> None:
    """Plan TASK, show the plan for review (approve, reject or edit), then execute it.

    Steps run as soon as their dependencies finish, up to --max-parallel at once. Every model
    response and tool result is checkpointed: after a crash, `masterplanner runs resume RUN_ID`
    continues where it stopped. Exit code 0 when the run succeeded, 1 when it failed, was
    rejected or cancelled, 2 for a usage or configuration error.
    """
    from ..engine import RunOptions
    from ..errors import ConfigError

    if not 1 <= max_parallel <= 64:
        raise ConfigError(f"--max-parallel must be between 1 and 64, got {max_parallel}")
    if not 0 <= rounds <= 5:
        raise ConfigError(f"--rounds must be between 0 and 5, got {rounds}")
    for name, value in (("--step-timeout", step_timeout), ("--max-seconds", max_seconds)):
        if value <= 0:
            raise ConfigError(f"{name} must be positive, got {value:g}")
    for name, count in (("--max-calls", max_calls), ("--max-tokens", max_tokens)):
        if count < 1:
            raise ConfigError(f"{name} must be at least 1, got {count}")
    settings = load_settings(model=model)
    engine = _engine(settings)
    options = RunOptions(
        max_parallel=max_parallel,
        auto_approve=yes,
        step_timeout_s=step_timeout,
        prompt_rounds=rounds,
        max_model_calls=max_calls,
        max_tokens=max_tokens,
        max_wall_s=max_seconds,
        tool_policies=dict(settings.tool_policies),
    )
    record = engine.create_run(task, model=settings.model, options=options, workspace=workspace)
    console(stderr=True).print(
        f"[bold]run {shown(record.id)}[/] · workspace {shown(record.workspace)}",
        highlight=False,
        soft_wrap=True,
    )
    _execute(engine, record.id, as_json=as_json)


def _execute(engine: Engine, run_id: str, *, as_json: bool) -> None:
    started = time.monotonic()
    final, live = asyncio.run(_execute_with_progress(engine, run_id))
    report = engine.report(final.id)
    if as_json:
        typer.echo(json_text(report))
    elif report.get("output"):
        typer.echo(visible(report["output"], lines=True))
    print_summary(console(stderr=True), report, final, time.monotonic() - started, tree=live)
    raise typer.Exit(_EXIT.get(final.status, 0))


class _Terminal:
    """The CLI as a run's front end.

    It shows the run as its events are appended (a live tree in a terminal, event lines
    otherwise), and asks the person (plan review, tool approvals, agents' questions) one
    question at a time, with the display paused meanwhile.
    """

    def __init__(self, engine: Engine, run_id: str) -> None:
        self.engine = engine
        self.run_id = run_id
        self.out = console(stderr=True)
        history = engine.store.events(run_id)
        self.seen = history[-1].seq if history else 0
        self.live = wants_live_view(self.out)
        self.display: EventLines | LiveTree = (
            LiveTree(self.out, engine.store, run_id, history) if self.live else EventLines(self.out)
        )
        self.running = asyncio.Event()
        self.running.set()
        self.asking = asyncio.Lock()

    def flush(self) -> None:
        """Show the events appended since the last flush (and, live, redraw the tree)."""
        fresh = self.engine.store.events(self.run_id, after=self.seen)
        if fresh:
            self.seen = fresh[-1].seq
        self.display.show(fresh)

    async def follow(self) -> None:
        while True:
            await self.running.wait()
            self.flush()
            await asyncio.sleep(0.2)

    async def _ask(self, question: Callable[..., T], *args: Any) -> T:
        # Steps run in parallel: their questions wait for each other, never share the terminal.
        async with self.asking:
            self.running.clear()
            try:
                self.flush()
                self.display.pause()
                answer = await asyncio.to_thread(question, *args)
                self.display.resume()
                return answer
            finally:
                self.running.set()

    async def review(self, run: RunRecord, catalog: Catalog) -> Decision:
        return await self._ask(_review_in_terminal, run, catalog)

    async def approve(self, step_id: str, tool: str, arguments: dict[str, Any]) -> bool:
        return await self._ask(_approve_in_terminal, step_id, tool, arguments)

    async def answer(self, question: str) -> str:
        return await self._ask(_answer_in_terminal, question)

    async def remember(self, run: RunRecord) -> bool:
        return await self._ask(_remember_in_terminal, run)


async def _execute_with_progress(engine: Engine, run_id: str) -> tuple[RunRecord, bool]:
    """Execute the run in this terminal; also resume, beside it, runs left behind by a crash.

    Returns the run's final record, and whether it was shown as a live tree.
    """
    terminal = _Terminal(engine, run_id)
    follower = asyncio.ensure_future(terminal.follow())
    crashed = [other for other in engine.store.crashed_runs() if other != run_id]
    for other in crashed:
        terminal.out.print(
            f"resuming run {shown(other)}, interrupted by a crash, beside this one", highlight=False
        )
    try:
        results = await asyncio.gather(
            engine.execute(
                run_id,
                review=terminal.review,
                approve_tool=terminal.approve,
                ask_person=terminal.answer,
                confirm_remember=terminal.remember,
            ),
            *(engine.execute(other) for other in crashed),
            return_exceptions=True,
        )
    except BaseException:  # Ctrl-C: no summary follows, the tree stays where the run stopped
        terminal.display.close(keep=True)
        raise
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
    stopped = isinstance(results[0], BaseException)
    if not stopped:
        terminal.flush()
    terminal.display.close(keep=stopped)
    for other, result in zip(crashed, results[1:], strict=True):
        status = result.status if not isinstance(result, BaseException) else f"not resumed: {result}"
        terminal.out.print(f"run {shown(other)}: {shown(status)}", highlight=False, soft_wrap=True)
    if isinstance(results[0], BaseException):
        raise results[0]
    final = results[0]
    if final.error:
        terminal.out.print(f"[red]{shown(final.error)}[/]", highlight=False, soft_wrap=True)
    return final, terminal.live


def _approve_in_terminal(step_id: str, tool: str, arguments: dict[str, Any]) -> bool:
    """Ask whether a tool call under policy `ask` may run; closed input means no."""
    out = console(stderr=True)
    out.print(f"[bold]step {shown(step_id)} wants to call {shown(tool)}[/]", highlight=False, soft_wrap=True)
    for key, value in arguments.items():
        out.print(f"[dim]{shown(key)}:[/] {shown(value, lines=True)}", highlight=False, soft_wrap=True)
    try:
        answer = typer.prompt("allow this call? [y/n]", default="n", err=True)
    except (typer.Abort, EOFError):
        return False
    return answer.strip().lower() in ("y", "yes")


def _answer_in_terminal(question: str) -> str:
    """Put an agent's question to the person; closed input gives an empty answer."""
    console(stderr=True).print(
        f"[bold]an agent asks:[/] {shown(question, lines=True)}", highlight=False, soft_wrap=True
    )
    try:
        return str(typer.prompt("your answer", default="", err=True, show_default=False))
    except (typer.Abort, EOFError):
        return ""


def _remember_in_terminal(run: RunRecord) -> bool:
    """Ask whether to store a succeeded run's team in the registry; closed input means no."""
    steps = len((run.plan or {}).get("steps", []))
    try:
        return bool(
            typer.confirm(
                f"store this run's team ({steps} agents) in the registry for similar tasks?",
                default=True,
                err=True,
            )
        )
    except (typer.Abort, EOFError):
        return False


def _review_in_terminal(run: RunRecord, catalog: Catalog) -> Decision:
    """Show the plan and prompts; ask to approve, reject or edit (edits reopen until they validate).

    An editor that fails is a `ConfigError`: the run keeps awaiting approval, its plan unchanged.
    """
    from ..errors import ConfigError, PlanError
    from ..plan import Plan
    from ..review import edit_in_editor, parse_review_yaml, render_review_yaml, with_errors_on_top
    from .app import _print_plan_dict

    plan = Plan.model_validate(run.plan)
    agents = run.agents or {}
    policies = dict(run.options.tool_policies)
    decision: Decision = {"action": "approve", "by": "person"}
    while True:
        _print_plan_dict(plan, agents, stderr=True)
        try:
            answer = typer.prompt("approve, reject or edit? [a/r/e]", default="a", err=True).strip().lower()
        except (typer.Abort, EOFError):
            raise ConfigError(
                f"no review decision for run {run.id} (input closed); answer in a terminal, pass --yes, "
                f"or resume later with `masterplanner runs resume {run.id}`"
            ) from None
        if answer in ("a", "approve", "y", "yes"):
            return decision
        if answer in ("r", "reject", "n", "no"):
            return {"action": "reject", "reason": "rejected at review"}
        if answer not in ("e", "edit"):
            console(stderr=True).print("answer a, r or e")
            continue
        text = render_review_yaml(plan, agents, policies)
        while True:
            try:
                edited = edit_in_editor(text, extension=".yaml")
            except ConfigError as exc:
                raise ConfigError(
                    f"{exc}; the plan is unchanged and run {run.id} still awaits approval "
                    f"(`masterplanner runs resume {run.id}` to review it again)"
                ) from None
            try:
                edit = parse_review_yaml(edited, catalog, agents)
            except PlanError as exc:
                console(stderr=True).print(
                    f"[red]the edit is invalid:[/] {shown('; '.join(exc.problems))}",
                    highlight=False,
                    soft_wrap=True,
                )
                text = with_errors_on_top(edited, exc)
                continue
            plan, agents, policies = edit.plan, edit.agents, edit.tool_policies
            decision = {
                "action": "approve",
                "by": "person",
                "plan": plan.to_json_dict(),
                "agents": agents,
                "tool_policies": policies,
            }
            break


@runs_app.command("list", short_help="List runs, newest first.")
def runs_list(
    limit: Annotated[int, typer.Option("--limit", help="How many runs to list.")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List runs with their status (reads only; never resumes or executes anything)."""
    from rich.table import Table

    engine = _engine(load_settings())
    records = engine.store.list_runs(limit)
    if as_json:
        rows = [
            {"run_id": r.id, "status": r.status, "task": r.task, "created_at": r.created_at, "model": r.model}
            for r in records
        ]
        typer.echo(json_text(rows))
        return
    table = Table("run", "status", "created", "task")
    for record in records:
        task = record.task if len(record.task) <= 60 else record.task[:59] + "…"
        created = record.created_at[:19].replace("T", " ")
        table.add_row(shown(record.id), shown(record.status), shown(created), shown(task))
    console().print(table, highlight=False)


@runs_app.command("show", short_help="Show a run: plan, steps, events and usage.")
def runs_show(
    run_id: RunId,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show a run (reads only; never resumes or executes anything)."""
    from rich.table import Table

    engine = _engine(load_settings())
    report = engine.report(run_id)
    events = engine.store.events(report["run_id"])
    if as_json:
        typer.echo(json_text(report | {"events": [event.to_json_dict() for event in events]}))
        return
    out = console()
    out.print(
        f"[bold]run {shown(report['run_id'])}[/] · {shown(report['status'])} · {shown(report['task'])}",
        highlight=False,
        soft_wrap=True,
    )
    table = Table("step", "status", "attempts", "started", "finished", "error")
    for step in report["steps"]:
        table.add_row(
            shown(step["id"]),
            shown(step["status"]),
            shown(step["attempts"]),
            shown((step["started_at"] or "")[11:23]),
            shown((step["finished_at"] or "")[11:23]),
            shown(step["error"] or ""),
        )
    out.print(table, highlight=False)
    for event in events:
        out.print(event_line(event), highlight=False, soft_wrap=True)
    if report["output"]:
        typer.echo(visible(report["output"], lines=True))


@runs_app.command("resume", short_help="Continue an interrupted run from its last checkpoint.")
def runs_resume(
    run_id: RunId,
    as_json: Annotated[bool, typer.Option("--json", help="Print the run report as JSON.")] = False,
) -> None:
    """Continue a run that stopped (crash, kill, Ctrl-C): finished steps are not run again."""
    engine = _engine(load_settings())
    record = engine.store.get_run(run_id)
    console(stderr=True).print(
        f"[bold]resuming run {shown(record.id)}[/] ({shown(record.status)})", highlight=False, soft_wrap=True
    )
    _execute(engine, record.id, as_json=as_json)


@runs_app.command("cancel", short_help="Stop a run.")
def runs_cancel(
    run_id: RunId,
    wait: Annotated[float, typer.Option("--wait", help="Seconds to wait for running steps to stop.")] = 15.0,
) -> None:
    """Cancel a run: running steps stop promptly and no new step starts."""
    engine = _engine(load_settings())
    record = engine.request_cancel(run_id)
    deadline = time.monotonic() + wait
    while record.status != "cancelled" and not record.finished and time.monotonic() < deadline:
        time.sleep(0.2)
        record = engine.store.get_run(record.id)
    console(stderr=True).print(f"run {shown(record.id)} {shown(record.status)}", highlight=False)
    raise typer.Exit(0 if record.status == "cancelled" else 1)
