"""The typer application: thin commands over the library.

Heavy libraries (pydantic-ai, llama.cpp, dbos) are imported inside commands, never at module
level, so `masterplanner --help` starts fast.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from .._version import __version__

if TYPE_CHECKING:
    from collections.abc import Callable

    from rich.console import Console

    from ..doctor import Check
    from ..plan import Plan
    from ..prompting import AgentPrompt
    from ..settings import Settings
    from ..usage import UsageLedger

app = typer.Typer(
    name="masterplanner",
    help="Turn a high-level task into a reviewed, executed plan of cooperating LLM agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@cache
def console(*, stderr: bool = False) -> Console:
    """The rich console for stdout or stderr (rich is imported on first use, not at start-up)."""
    from rich.console import Console

    return Console(stderr=stderr)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"masterplanner {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
    debug: Annotated[
        bool, typer.Option("--debug", help="Show tracebacks and library logs on errors.")
    ] = False,
) -> None:
    """masterplanner: plan, review and run teams of LLM agents. Works offline with the embedded model."""


@app.command(short_help="Check the model, database and sandbox prerequisites.")
def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="Print the checks as JSON.")] = False,
) -> None:
    """Check that everything masterplanner needs is installed and working.

    Covers the embedded model file, llama.cpp, the database and the sandbox prerequisites; each
    problem comes with the command that fixes it. Exit code 0 when every required check passes.
    """
    from ..doctor import run_checks
    from ..settings import Settings

    settings = Settings.load()
    if as_json:
        checks = run_checks(settings)
        typer.echo(json.dumps({"checks": [check.to_dict() for check in checks]}, indent=2))
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
        out.print(f"{status} {check.name:<{width}}  {check.detail}", highlight=False, soft_wrap=True)
        if check.fix and not check.ok:
            out.print(f"         {'':<{width}}  fix: [bold]{check.fix}[/]", highlight=False, soft_wrap=True)
    out.print(f"home {settings.home} · model {settings.model}", style="dim", highlight=False, soft_wrap=True)


@app.command()
def chat(
    prompt: Annotated[str, typer.Argument(help="What to ask the model.")],
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Model spec: local, openai:NAME, scripted:FILE, …")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the answer and usage as JSON.")] = False,
) -> None:
    """Send one prompt to a model and print the answer.

    The answer goes to stdout and its usage (calls, tokens, seconds) to stderr, or both as JSON
    with --json. Works offline with the embedded model (--model local).
    """
    from ..chat import chat as run_chat

    if as_json:
        result = run_chat(prompt, model=model)
        typer.echo(json.dumps(result.to_dict(), indent=2))
        return
    with console(stderr=True).status(f"asking {model or 'the configured model'}…"):
        result = run_chat(prompt, model=model)
    typer.echo(result.output)
    usage = result.usage["by_purpose"].get("chat", {})
    console(stderr=True).print(
        f"[dim]model {result.model} · {usage.get('calls', 0)} call(s) · {usage.get('input_tokens', 0)} in / "
        f"{usage.get('output_tokens', 0)} out tokens · {usage.get('seconds', 0)} s[/]"
    )


@app.command(short_help="Plan a task: steps, tools and dependencies.")
def plan(
    task: Annotated[str, typer.Argument(help="The task to plan.")],
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Model spec (default: the model setting).")
    ] = None,
    tools: Annotated[
        str | None, typer.Option("--tools", help="Comma-separated tools the plan may use (default: all).")
    ] = None,
    prompts: Annotated[
        bool, typer.Option("--prompts", help="Also write, critique and revise each step agent's prompt.")
    ] = False,
    rounds: Annotated[int, typer.Option("--rounds", help="Critique-and-revise rounds per prompt (0-5).")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
) -> None:
    """Break TASK into a dependency graph of steps, each with an agent role and tools.

    The plan is validated (unique ids, known dependencies and tools, no cycles, size limits);
    an invalid proposal goes back to the model for repair, at most twice.
    """
    import asyncio

    from ..errors import ConfigError
    from ..models import resolve_model
    from ..planner import plan as make_plan
    from ..settings import Settings
    from ..tools import builtin_catalog
    from ..usage import UsageLedger

    settings = Settings.load(model=model)
    catalog = builtin_catalog()
    if tools:
        try:
            catalog = catalog.subset(name.strip() for name in tools.split(",") if name.strip())
        except KeyError as exc:
            raise ConfigError(f"--tools: {exc.args[0]}; available: {', '.join(catalog.names)}") from None
    if not 0 <= rounds <= 5:
        raise ConfigError(f"--rounds must be between 0 and 5, got {rounds}")
    chosen = resolve_model(settings.model, settings)
    ledger = UsageLedger()

    async def work(note: Callable[[str], None]) -> tuple[Plan, dict[str, AgentPrompt]]:
        from ..prompting import create_prompts

        note(f"planning with {settings.model}…")
        result = await make_plan(task, catalog, model=chosen, ledger=ledger)
        if not prompts:
            return result, {}
        note(f"writing {len(result.steps)} agent prompts ({rounds} critique round(s) each)…")
        return result, await create_prompts(result, catalog, model=chosen, ledger=ledger, rounds=rounds)

    if as_json:
        from ..prompting import prompts_to_json

        result, agents = asyncio.run(work(lambda _message: None))
        payload = result.to_json_dict() | ({"agents": prompts_to_json(agents)} if prompts else {})
        typer.echo(json.dumps(payload, indent=2))
        return
    with console(stderr=True).status("planning…") as status:
        result, agents = asyncio.run(work(status.update))
    _print_plan(result, agents)
    _print_usage(ledger)


def _print_usage(ledger: UsageLedger) -> None:
    parts = [f"{usage['calls']} {purpose} call(s)" for purpose, usage in ledger.by_purpose().items()]
    total = ledger.totals()
    console(stderr=True).print(
        f"[dim]{' · '.join(parts)} · {total.input_tokens} in / {total.output_tokens} out tokens · "
        f"{total.seconds:.1f} s[/]"
    )


def _print_plan(result: Plan, agents: dict[str, AgentPrompt]) -> None:
    from ..prompting import prompts_to_json

    _print_plan_dict(result, prompts_to_json(agents))


def _print_plan_dict(result: Plan, agents: dict[str, Any], *, stderr: bool = False) -> None:
    """Print the plan as a tree, with each step's prompt from an `agents` JSON map."""
    from rich.markup import escape
    from rich.tree import Tree

    from ..plan import topological_order

    tree = Tree(f"[bold]{escape(result.task)}[/]")
    for step_id in topological_order(result):
        step = result.step(step_id)
        after = (
            f" [dim]after {', '.join(step.depends_on)}[/]" if step.depends_on else " [dim](starts at once)[/]"
        )
        branch = tree.add(f"[bold cyan]{step.id}[/] {escape(step.title)}{after}")
        branch.add(f"[dim]role[/] {escape(step.agent_role)}   [dim]tools[/] {', '.join(step.tools) or '—'}")
        branch.add(escape(step.instruction))
        if step.expected_output:
            branch.add(f"[dim]→ {escape(step.expected_output)}[/]")
        agent = agents.get(step.id) or {}
        if agent.get("prompt"):
            scores = ""
            critique = agent.get("critique")
            if critique:
                scores = (
                    f" [dim](critic: clarity {critique['clarity']}, completeness {critique['completeness']}, "
                    f"tool fit {critique['tool_fit']}, output {critique['output_format']})[/]"
                )
            edited = " [yellow](edited)[/]" if agent.get("edited") else ""
            if agent.get("reused_from"):
                reused = f"reused agent {agent.get('agent_id', '')} from run {agent['reused_from']}"
                edited += f" [green]({escape(reused)})[/]"
            branch.add(f"[bold]prompt[/]{scores}{edited}").add(escape(agent["prompt"]))
    console(stderr=stderr).print(tree)


eval_app = typer.Typer(help="Evaluate masterplanner against benchmark data.", no_args_is_help=True)
app.add_typer(eval_app, name="eval")


@eval_app.command("planning", short_help="Score the Master Planner and a baseline on UltraTool or TMDB.")
def eval_planning(
    dataset: Annotated[str, typer.Option("--dataset", help="ultratool or tmdb.")],
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="Only the first N test requests.")
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Model spec (default: the model setting).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    per_request: Annotated[
        bool, typer.Option("--per-request", help="Include every request's scores.")
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

    The benchmark data is read from MASTERPLANNER_BENCHMARKS (default ../shared/benchmarks). A
    baseline planner (one plain prompt, no grammar, no repair) runs on the same model beside it.
    """
    import asyncio

    from rich.progress import Progress, TimeElapsedColumn

    from ..evaluation import Scores, evaluate_planning
    from ..models import resolve_model
    from ..settings import Settings

    settings = Settings.load(model=model)
    chosen = resolve_model(settings.model, settings)
    title = f"{dataset} with {settings.model}"
    with Progress(
        *Progress.get_default_columns(), TimeElapsedColumn(), console=console(stderr=True)
    ) as progress:
        bar = progress.add_task(title, total=None)

        def show(done: int, total: int, so_far: Scores) -> None:
            figures = f" · node F1 {so_far.node_f1:.3f} · valid {so_far.valid_rate:.0%}" if done else ""
            progress.update(bar, completed=done, total=total, description=title + figures)

        report = asyncio.run(
            evaluate_planning(
                dataset,
                model=chosen,
                model_spec=settings.model,
                limit=limit,
                results=results,
                progress=show,
            )
        )
    if as_json:
        typer.echo(json.dumps(report.to_json_dict(per_request=per_request), indent=2))
        return
    from rich.table import Table

    table = Table(title=f"{report.dataset}: {report.requests} requests, model {report.model}")
    table.add_column("planner")
    for column in ("node F1", "link F1", "accuracy", "valid", "p50 latency (s)"):
        table.add_column(column, justify="right")
    for name, scores in (("masterplanner", report.planner), ("baseline", report.baseline)):
        table.add_row(
            name,
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


from . import registry as _registry  # noqa: E402, F401  (registers `agents` and `cohorts`)
from . import runs as _runs  # noqa: E402, F401  (registers `run` and `runs`; it imports `app` from here)
