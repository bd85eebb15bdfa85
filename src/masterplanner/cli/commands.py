"""The commands that are not about runs or the registry: doctor, chat, plan, eval.

Heavy libraries (pydantic-ai, llama.cpp, dbos) are imported inside commands, never at module
level, so `masterplanner --help` starts fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..usage import counted
from .common import app, console, load_settings, whole_number
from .terminal import json_text, shown, visible

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..doctor import Check
    from ..engine.catalogs import RunCatalog
    from ..plan import Plan
    from ..prompting import AgentPrompt
    from ..settings import Settings
    from ..usage import UsageLedger


@app.command(short_help="Check the model, database and sandbox prerequisites.")
def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="Print the checks as JSON.")] = False,
) -> None:
    """Check that everything masterplanner needs is installed and working.

    Covers the embedded model file, llama.cpp, the database, the sandbox prerequisites and the
    configured MCP servers (their tools listed as a run lists them); each problem comes with the
    command that fixes it. Exit code 0 when every required check passes.
    """
    from ..doctor import run_checks

    settings = load_settings()
    if as_json:
        checks = run_checks(settings)
        typer.echo(json_text({"checks": [check.to_dict() for check in checks]}))
    else:
        with console(stderr=True).status("checking…") as status:
            checks = run_checks(settings, on_start=lambda name: status.update(f"checking {name}…"))
        _print_checks(checks, settings)
    if not all(check.ok for check in checks if check.required):
        raise typer.Exit(1)


def _print_checks(checks: list[Check], settings: Settings) -> None:
    out = console()
    width = max(len(check.name) for check in checks)
    for check in checks:
        if check.ok:
            status = "[green]ok      [/]"
        elif check.required:
            status = "[red]missing [/]"
        else:
            status = "[yellow]optional[/]"
        name = shown(f"{check.name:<{width}}")
        out.print(f"{status} {name}  {shown(check.detail)}", highlight=False, soft_wrap=True)
        if check.fix and not check.ok:
            out.print(
                f"         {'':<{width}}  fix: [bold]{shown(check.fix)}[/]", highlight=False, soft_wrap=True
            )
    out.print(
        f"home {shown(settings.home)} · model {shown(settings.model)}",
        style="dim",
        highlight=False,
        soft_wrap=True,
    )


@app.command()
def chat(
    prompt: Annotated[str, typer.Argument(metavar="PROMPT", help="What to ask the model.")],
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Model spec: local, openai:NAME, scripted:FILE, …")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the answer and usage as JSON.")] = False,
) -> None:
    """Send one prompt to a model and print the answer.

    The answer goes to stdout and its usage (calls, tokens, seconds) to stderr, or both as JSON
    with --json. Works offline with the embedded model (--model local).
    """
    from ..chatting import chat as run_chat

    settings = load_settings(model=model)  # warns about a settings file it did not read
    if as_json:
        result = run_chat(prompt, model=model, settings=settings)
        typer.echo(json_text(result.to_dict()))
        return
    with console(stderr=True).status(f"asking {shown(model or 'the configured model')}…"):
        result = run_chat(prompt, model=model, settings=settings)
    typer.echo(visible(result.output, lines=True))
    usage = result.usage["by_purpose"].get("chat", {})
    console(stderr=True).print(
        f"[dim]model {shown(result.model)} · {counted(usage.get('calls', 0), 'call')} · "
        f"{usage.get('input_tokens', 0)} in / {usage.get('output_tokens', 0)} out tokens · "
        f"{usage.get('seconds', 0)} s[/]",
        highlight=False,
        soft_wrap=True,
    )


@app.command(short_help="Plan a task: steps, tools and dependencies.")
def plan(
    task: Annotated[str, typer.Argument(metavar="TASK", help="The task to plan.")],
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Model spec (default: the model setting).")
    ] = None,
    tools: Annotated[
        str | None,
        typer.Option("--tools", help="Comma-separated tools the plan may use (default: all available here)."),
    ] = None,
    prompts: Annotated[
        bool, typer.Option("--prompts", help="Also write, critique and revise each step agent's prompt.")
    ] = False,
    rounds: Annotated[
        int,
        typer.Option("--rounds", parser=whole_number(), help="Critique-and-revise rounds per prompt (0-5)."),
    ] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
) -> None:
    """Break TASK into a dependency graph of steps, each with an agent role and tools.

    It plans with the tools a run could use here (those the settings make available, and the
    MCP servers' tools), as `run` does.

    The plan is validated (unique ids, known dependencies and tools, no cycles, size limits);
    an invalid proposal goes back to the model for repair, at most twice.
    """
    import asyncio

    from ..errors import ConfigError
    from ..models import resolve_model_or_setting
    from ..planner import plan as make_plan
    from ..prompting import MAX_ROUNDS
    from ..usage import UsageLedger

    settings = load_settings(model=model)
    catalog = _planning_tools(settings, tools)
    if not 0 <= rounds <= MAX_ROUNDS:
        raise ConfigError(f"--rounds must be between 0 and {MAX_ROUNDS}, got {rounds}")
    chosen = resolve_model_or_setting(None, settings)
    ledger = UsageLedger()

    async def work(note: Callable[[str], None]) -> tuple[Plan, dict[str, AgentPrompt]]:
        from ..prompting import create_prompts

        note(f"planning with {shown(settings.model)}…")
        result = await make_plan(task, catalog, model=chosen, ledger=ledger)
        if not prompts:
            return result, {}
        note(f"writing {len(result.steps)} agent prompts ({counted(rounds, 'critique round')} each)…")
        return result, await create_prompts(result, catalog, model=chosen, ledger=ledger, rounds=rounds)

    if as_json:
        from ..prompting import prompts_to_json

        result, agents = asyncio.run(work(lambda _message: None))
        payload = result.to_json_dict() | ({"agents": prompts_to_json(agents)} if prompts else {})
        typer.echo(json_text(payload))
        return
    with console(stderr=True).status("planning…") as status:
        result, agents = asyncio.run(work(status.update))
    _print_plan(result, agents)
    _print_usage(ledger)


def _planning_tools(settings: Settings, wanted: str | None) -> RunCatalog:
    """The tools `plan` plans with: a run's here (its MCP servers' too), or those of `--tools` among them.

    Before, `plan` offered every shipped tool whatever the settings: it showed plans with
    `web_search` or `http_request` that `run` would refuse here, and none with the MCP tools.
    """
    import asyncio

    from ..engine.catalogs import RunCatalog, run_catalog, tool_context, with_mcp_tools
    from ..errors import ConfigError

    catalog = (
        asyncio.run(with_mcp_tools(settings, tool_context(settings)))[0]
        if settings.mcp_servers
        else run_catalog(settings)
    )
    if not wanted:
        return catalog
    names = list(dict.fromkeys(name.strip() for name in wanted.split(",") if name.strip()))
    unknown = [name for name in names if name not in catalog]
    for name in unknown:
        if name in catalog.missing:  # a shipped tool the settings leave out: say which enables it
            raise ConfigError(f"--tools: {name!r} is not available here: {catalog.missing[name]}")
    if unknown:  # a misspelling, or a tool no configured server offers
        available = ", ".join(catalog.names)
        raise ConfigError(f"--tools: unknown tools: {', '.join(unknown)}; available: {available}")
    chosen = (tool for tool in catalog if tool.name in names)
    # only the chosen tools: one left out is unknown to the plan, not "not offered by its server"
    return RunCatalog(chosen, missing={})


def _print_usage(ledger: UsageLedger) -> None:
    parts = [
        counted(int(usage["calls"]), f"{purpose} call") for purpose, usage in ledger.by_purpose().items()
    ]
    total = ledger.totals()
    console(stderr=True).print(
        f"[dim]{' · '.join(parts)} · {total.input_tokens} in / {total.output_tokens} out tokens · "
        f"{total.seconds:.1f} s[/]"
    )


def _print_plan(result: Plan, agents: dict[str, AgentPrompt]) -> None:
    from ..prompting import prompts_to_json

    print_plan_dict(result, prompts_to_json(agents))


def print_plan_dict(result: Plan, agents: dict[str, Any], *, stderr: bool = False) -> None:
    """Print the plan as a tree, with each step's prompt from an `agents` JSON map.

    Every field is the model's or the person's text: all of it goes through `shown`.
    """
    from rich.tree import Tree

    from ..plan import topological_order

    tree = Tree(f"[bold]{shown(result.task)}[/]")
    for step_id in topological_order(result):
        step = result.step(step_id)
        after = (
            f" [dim]after {shown(', '.join(step.depends_on))}[/]"
            if step.depends_on
            else " [dim](starts at once)[/]"
        )
        if step.expand:
            after += " [magenta](planned as a sub-plan when ready)[/]"
        branch = tree.add(f"[bold cyan]{shown(step.id)}[/] {shown(step.title)}{after}")
        tools = shown(", ".join(step.tools) or "—")
        branch.add(f"[dim]role[/] {shown(step.agent_role)}   [dim]tools[/] {tools}")
        branch.add(shown(step.instruction, lines=True))
        if step.expected_output:
            branch.add(f"[dim]→ {shown(step.expected_output, lines=True)}[/]")
        agent = agents.get(step.id) or {}
        if agent.get("prompt"):
            branch.add(f"[bold]prompt[/]{_agent_notes(agent)}").add(shown(agent["prompt"], lines=True))
    console(stderr=stderr).print(tree, highlight=False)


def _agent_notes(agent: dict[str, Any]) -> str:
    """The critic's scores, `(edited)`, a reused person's prompt, where a reused agent came from."""
    notes = ""
    critique = agent.get("critique")
    if critique:
        from ..review import critique_note

        notes += f" [dim]({shown(critique_note(critique))})[/]"
    if agent.get("edited"):
        notes += " [yellow](edited)[/]"
    if agent.get("agent_id") and agent.get("reused_from") is not None:
        from ..review import reused_agent_origin

        notes += f" [green]({shown('reused agent ' + reused_agent_origin(agent))})[/]"
    elif agent.get("prompt_by_person") and not agent.get("edited"):
        notes += " [yellow](written by a person)[/]"
    return notes


eval_app = typer.Typer(help="Evaluate masterplanner against benchmark data.", no_args_is_help=True)
app.add_typer(eval_app, name="eval")


@eval_app.command("planning", short_help="Score the Master Planner and baselines on UltraTool or TMDB.")
def eval_planning(
    dataset: Annotated[str, typer.Option("--dataset", help="ultratool or tmdb.")],
    limit: Annotated[
        int | None, typer.Option("--limit", parser=whole_number(1), help="Only the first N test requests.")
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Model spec (default: the model setting).")
    ] = None,
    baselines_only: Annotated[
        bool,
        typer.Option(
            "--baselines-only", help="Score only the baselines that need no model (single, clauses)."
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    per_request: Annotated[
        bool, typer.Option("--per-request", help="With --json: include every request's scores.")
    ] = False,
    results: Annotated[
        Path | None,
        typer.Option(
            "--results",
            help="Append each request's scores to this JSON-lines file as it finishes; "
            "run again with the same file to continue a stopped evaluation.",
        ),
    ] = None,
) -> None:
    """Plan each test request of a benchmark and score node F1, link F1, accuracy, valid rate, latency.

    The benchmark data is read from MASTERPLANNER_BENCHMARKS (default ../shared/benchmarks).
    Three baselines are scored beside the planner on the same pre-selected tools: the design
    notes' planner (one plain prompt to the same model, no grammar, no repair), `single` (the
    task as one step with its best-matching tool) and `clauses` (a chain of one step per clause
    of the task, each with its best-matching tool). The last two need no model: with
    --baselines-only nothing else runs.
    """
    from ..errors import ConfigError
    from ..evaluation import PlanningReport

    if per_request and not as_json:  # taken and doing nothing, it looked like a report cut short
        raise ConfigError(
            "--per-request has no use without --json: it adds every request's scores to the JSON report"
        )
    report: PlanningReport
    if baselines_only:
        from ..evaluation import evaluate_baselines

        for flag, given in (("--model", model), ("--results", results)):
            if given is not None:
                raise ConfigError(f"{flag} has no use with --baselines-only, which runs no model")
        report = evaluate_baselines(dataset, limit=limit)
    else:
        report = _evaluate_with_model(dataset, model, limit, results)
    if as_json:
        typer.echo(json_text(report.to_json_dict(per_request=per_request)))
        return
    _print_planning_report(report)


_BASELINE_NAMES = {
    "design_notes": "baseline (design notes)",
    "single": "single step",
    "clauses": "clause chain",
}


def _evaluate_with_model(dataset: str, model: str | None, limit: int | None, results: Path | None) -> Any:
    """`evaluate_planning` with a progress bar on stderr."""
    import asyncio

    from rich.progress import Progress, TimeElapsedColumn

    from ..evaluation import Scores, evaluate_planning
    from ..models import resolve_model_or_setting

    settings = load_settings(model=model)
    chosen = resolve_model_or_setting(None, settings)
    title = shown(f"{dataset} with {settings.model}")
    with Progress(
        *Progress.get_default_columns(), TimeElapsedColumn(), console=console(stderr=True)
    ) as progress:
        bar = progress.add_task(title, total=None)

        def show(done: int, total: int, so_far: Scores) -> None:
            figures = f" · node F1 {so_far.node_f1:.3f} · valid {so_far.valid_rate:.0%}" if done else ""
            progress.update(bar, completed=done, total=total, description=title + figures)

        return asyncio.run(
            evaluate_planning(
                dataset,
                model=chosen,
                model_spec=settings.model,
                limit=limit,
                results=results,
                progress=show,
            )
        )


def _print_planning_report(report: Any) -> None:
    from rich.table import Table

    model = f"model {report.model}" if report.model else "no model"
    table = Table(title=shown(f"{report.dataset}: {report.requests} requests, {model}"))
    table.add_column("planner")
    for column in ("node F1", "link F1", "accuracy", "valid", "p50 latency (s)"):
        table.add_column(column, justify="right")
    for name, scores in report.rows():
        table.add_row(
            _BASELINE_NAMES.get(name, name),
            f"{scores.node_f1:.3f}",
            f"{scores.link_f1:.3f}",
            f"{scores.accuracy:.3f}",
            f"{scores.valid_rate:.3f}",
            f"{scores.p50_latency_s:.2f}",
        )
    console().print(table)
    console().print(
        f"gold tools kept by pre-selection (top {report.preselect_limit}): {report.gold_tools_kept_rate:.1%}"
    )


@eval_app.command("tasks", short_help="Run the everyday-task suite end to end and score each task pass/fail.")
def eval_tasks(
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Model spec (default: the model setting).")
    ] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", parser=whole_number(1), help="Only the first N tasks.")
    ] = None,
    category: Annotated[
        str | None,
        typer.Option(
            "--category", help="Only one category: write, summarize, translate, csv, files, script, two-part."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    per_task: Annotated[
        bool, typer.Option("--per-task", help="With --json: include every task's checks, plan and usage.")
    ] = False,
    results: Annotated[
        Path | None,
        typer.Option(
            "--results",
            help="Append each task's outcome to this JSON-lines file as it finishes; "
            "run again with the same file to continue a stopped evaluation.",
        ),
    ] = None,
    suite: Annotated[
        Path | None, typer.Option("--suite", help="Another task suite file (default: the shipped one).")
    ] = None,
    keep: Annotated[
        Path | None,
        typer.Option(
            "--keep", help="Keep the runs' database and workspaces in this folder (default: deleted)."
        ),
    ] = None,
) -> None:
    """Run each everyday task (write, summarize, translate, csv, files, script, two-part) as a real run.

    Every task gets a fresh workspace with its seed files and a plan approved automatically;
    the runs share a home of their own with nothing remembered, so no task reuses another's
    team. A task passes when its run succeeded, its plan makes sense (valid; roles of 1-3
    words; short, distinct titles; no repeated instruction; no more steps than actions + 1;
    a dependency where one step uses another's result) and its files pass the suite's checks.
    Prints the pass rate overall and per category, and each failed task's failed checks.
    """
    import asyncio

    from rich.progress import Progress, TaskID, TimeElapsedColumn

    from ..errors import ConfigError
    from ..evaluation.tasks import evaluate_tasks

    if per_task and not as_json:  # before a task runs: a whole evaluation's wait for nothing
        raise ConfigError(
            "--per-task has no use without --json: it adds every task's checks, plan and usage "
            "to the JSON report"
        )
    settings = load_settings(model=model)
    title = shown(f"everyday tasks with {settings.model}")
    # The bar starts with the first task, not before: a refusal (an unknown category, a missing
    # suite, a results file of another evaluation) showed under a bar as if the evaluation ran.
    progress = Progress(*Progress.get_default_columns(), TimeElapsedColumn(), console=console(stderr=True))
    bars: list[TaskID] = []

    def show(done: int, total: int, passed: int, task_id: str | None) -> None:
        if not bars:
            progress.start()
            bars.append(progress.add_task(title, total=None))
        figures = f" · {passed}/{done} passed" if done else ""
        running = f" · running {task_id}" if task_id else ""
        progress.update(bars[0], completed=done, total=total, description=title + figures + shown(running))

    try:
        report = asyncio.run(
            evaluate_tasks(
                settings,
                model_spec=settings.model,
                suite=suite,
                category=category,
                limit=limit,
                results=results,
                keep=keep,
                progress=show,
            )
        )
    finally:
        if bars:
            progress.stop()
    if as_json:
        typer.echo(json_text(report.to_json_dict(per_task=per_task)))
        return
    _print_tasks_report(report)


def _print_tasks_report(report: Any) -> None:
    from rich.table import Table

    out = console()
    table = Table(title=shown(f"everyday tasks: {len(report.records)}, model {report.model}"))
    table.add_column("category")
    for column in ("tasks", "passed", "pass rate"):
        table.add_column(column, justify="right")
    for category, figures in report.by_category().items():
        table.add_row(category, str(figures["tasks"]), str(figures["passed"]), f"{figures['pass_rate']:.0%}")
    table.add_row(
        "all", str(len(report.records)), str(report.passed), f"{report.pass_rate:.0%}", style="bold"
    )
    out.print(table)
    failed = report.failed_checks()
    if failed:
        counts = ", ".join(f"{kind} {count}" for kind, count in failed.items())
        out.print(f"tasks failing each kind of check: {shown(counts)}", highlight=False, soft_wrap=True)
    for failure in report.failures():
        out.print(f"[bold red]✗ {shown(failure['id'])}[/] ({shown(failure['category'])})", highlight=False)
        for check in failure["failed"]:
            detail = check["detail"] if len(check["detail"]) <= 200 else check["detail"][:199] + "…"
            line = f"{check['check']}: {detail}" if detail else check["check"]
            out.print(f"    {shown(line)}", highlight=False, soft_wrap=True)
