"""How `masterplanner run` shows a run: a live tree in a terminal, event lines otherwise, a summary.

When stderr is a terminal, a `rich.live.Live` tree shows each step of the plan with its status,
its elapsed time, the tool it is calling and its latest notice (a retry, an approval, an error),
under a header with the run's phase (while planning, which part: finding similar teams, planning
the steps, writing prompts, reviewing them), elapsed time and model calls so far. It is redrawn from the
run's stored events, steps and usage, and taken off the screen while the person is asked
something. Otherwise each event is printed as one plain line, as `runs show` prints them. Either
way the run ends with a summary: status, time, model calls and tokens, cost when known, and the
files the run wrote in its workspace.

Every text here that a model, a tool, a plan or a store gave goes through `terminal.shown`.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..event_text import Part, budget_wait, clock, event_detail, planning_stage, retry_wait, status_word
from ..tools.workspace import walk_files
from ..usage import counted, failed_note, money
from .terminal import shown, visible

if TYPE_CHECKING:
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text
    from rich.tree import Tree

    from ..service import Event, RunRecord, StepRecord

__all__ = [
    "EventLines",
    "LiveTree",
    "RunView",
    "duration",
    "event_line",
    "one_line",
    "print_summary",
    "step_line",
    "steps_tree",
    "summary_line",
    "team_lines",
    "wants_live_view",
    "written_files",
]

_SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
# status: (symbol, style, word); a running step's symbol is the spinner's current frame
_LOOK = {
    "pending": ("·", "dim", status_word("pending")),
    "running": ("", "yellow", "running"),
    "succeeded": ("✓", "green", "succeeded"),
    "failed": ("✗", "red", "failed"),
    "skipped": ("-", "dim", "skipped"),
    "cancelled": ("■", "red", "cancelled"),
    "replaced": ("↻", "yellow", "replaced"),
    "expanded": ("▾", "cyan", "expanded"),
    "interrupted": ("■", "red", "interrupted"),  # the header's, when this process stops early
}
_PHASES = {
    "run_created": "planning",
    "plan_ready": "planned",
    "approval_requested": "awaiting approval",
    "approved": "running",
    "rejected": "rejected",
    "run_succeeded": "succeeded",
    "run_failed": "failed",
    "run_cancelled": "cancelled",
}
_RETRIED_PHASES = {"running": "running", "awaiting_approval": "awaiting approval", "planning": "planning"}
_TEAM_NOTES = {
    "message_sent": "[blue]sent ",
    "message_delivered": "[blue]message ",
    "question_answered": "[blue]answered ",
    "question_closed": "[yellow]question ",
    "note_set": "[blue]note ",
    "replan_requested": "[yellow]",
    "replanned": "[yellow]replaced ",
    "replan_failed": "[red]replan failed ",
    "step_expanded": "[cyan]expanded ",
    "expand_failed": "[yellow]not expanded ",
    "output_checked": "[dim]checked ",
    "step_resumed": "[yellow]resumed ",
}
"""Events shown as a step's latest notice in the live tree: the colour and word they start with."""
_TITLE_CHARS = 48
_FILES_SHOWN = 20
_FILES_SCANNED = 100_000
# version-control folders: no tool may write in them (tools/protected.py), so they are not walked
_NOT_WALKED = frozenset({".git", ".hg", ".svn"})


def wants_live_view(out: Console) -> bool:
    """Whether `out` (the stderr console) is a terminal that can redraw a live view."""
    return sys.stderr.isatty() and out.is_terminal and not out.is_dumb_terminal


# ---- event lines (not a terminal, and `runs show`)


_TONES = {"good": "green", "bad": "red", "warn": "yellow"}


def _markup(parts: list[Part], *, trimmed: bool = False) -> str:
    """An event's detail (`event_text.event_detail`) as markup; `trimmed`: without its leading space."""
    if trimmed and parts:
        parts = [(parts[0][0].lstrip(), parts[0][1]), *parts[1:]]
    return "".join(f"[{_TONES[tone]}]{shown(text)}[/]" if tone else shown(text) for text, tone in parts)


def event_line(event: Event) -> str:
    r"""One event as one line of markup (newlines in its data are shown as `\n`)."""
    at = shown(clock(event.at))
    step = f" [cyan]{shown(event.step)}[/]" if event.step else ""
    colour = {"run_succeeded": "green", "step_succeeded": "green", "run_failed": "red", "step_failed": "red"}
    kind = f"[{colour[event.kind]}]{event.kind}[/]" if event.kind in colour else shown(event.kind)
    return f"[dim]{at}[/] {kind}{step}{_markup(event_detail(event.kind, event.data))}"


class EventLines:
    """The display when stderr is not a terminal: one plain line per event, nothing redrawn."""

    def __init__(self, out: Console) -> None:
        self.out = out

    def show(self, events: list[Event]) -> None:
        """Print `events`."""
        for event in events:
            self.out.print(event_line(event), highlight=False, soft_wrap=True)

    def pause(self) -> None:
        """Nothing to take off the screen."""

    def resume(self) -> None:
        """Nothing to put back."""

    def close(self, *, keep: bool = False) -> None:
        """Nothing to stop."""


# ---- the live tree


def _seconds(text: str | None) -> float | None:
    """An ISO 8601 time as seconds since the epoch."""
    return datetime.fromisoformat(text).timestamp() if text else None


def duration(seconds: float) -> str:
    """`4.2 s`, `3m 05s`, `1h 02m`."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def one_line(markup: str) -> Text:
    """One line of the tree: never wrapped, cut with an ellipsis at the terminal's edge."""
    from rich.text import Text

    text = Text.from_markup(markup, overflow="ellipsis")
    text.no_wrap = True
    return text


def team_lines(report: dict[str, Any]) -> list[str]:
    """The messages between a run's steps and its notes, as lines of markup (`runs show`)."""
    lines: list[str] = []
    messages = report.get("messages") or []
    if messages:
        lines.append(f"[bold]messages[/] ({len(messages)})")
    for message in messages:
        answer = f" → {shown(message['answer'])}" if message.get("answer") else ""
        how = f"[dim]{shown(message['kind'])}, {shown(message['state'])}[/]"
        lines.append(
            f"  #{message['id']} {shown(message['from'])} → {shown(message['to'])} {how}: "
            f"{shown(message['content'])}{answer}"
        )
    notes = report.get("notes") or []
    if notes:
        lines.append(f"[bold]notes[/] ({len(notes)})")
    for note in notes:
        lines.append(f"  {shown(note['key'])} [dim](by {shown(note['step'])})[/]: {shown(note['value'])}")
    return lines


def step_line(
    step: StepRecord, title: str, id_width: int, *, now: float, activity: str = "", frame: str = "⠋"
) -> Text:
    """A step as one line: symbol, id, status, elapsed time, title, then what it is doing."""
    symbol, style, word = _LOOK.get(step.status, ("?", "", step.status))
    started, finished = _seconds(step.started_at), _seconds(step.finished_at)
    elapsed = ""
    if started is not None and (finished is not None or step.status == "running"):
        elapsed = duration(max(0.0, (finished or now) - started))
    step_id = shown(step.id) + " " * max(0, id_width - len(visible(step.id)))
    cut = title if len(title) <= _TITLE_CHARS else title[: _TITLE_CHARS - 1] + "…"
    return one_line(
        f"[{style}]{frame if step.status == 'running' else symbol}[/] [bold cyan]{step_id}[/] "
        f"[{style}]{word:<9}[/] {elapsed:>7}  {shown(cut)}{activity}"
    )


def _titles(plan: dict[str, Any] | None) -> dict[str, str]:
    return {str(step.get("id")): str(step.get("title", "")) for step in (plan or {}).get("steps", [])}


def steps_tree(label: Text, steps: list[StepRecord], titles: dict[str, str], **line: Any) -> Tree:
    """`steps` as the branches of a tree under `label`; `line` goes to `step_line`."""
    from rich.tree import Tree

    from ..engine.records import SUB_STEP

    tree = Tree(label, guide_style="dim")
    width = max((len(visible(step.id)) for step in steps), default=0)
    notes: dict[str, str] = line.pop("notes", {})
    branches: dict[str, Tree] = {}
    for step in steps:
        parent = branches.get(step.id.rpartition(SUB_STEP)[0], tree)  # a sub-step under its step
        shown_line = step_line(step, titles.get(step.id, ""), width, activity=notes.get(step.id, ""), **line)
        branches[step.id] = parent.add(shown_line)
    return tree


@dataclass
class _Activity:
    """What a step is doing now: the tool it is calling, and its latest notice (markup)."""

    tool: str | None = None
    note: str = ""

    def markup(self) -> str:
        calling = f"  [magenta]→ {shown(self.tool)}[/]" if self.tool else ""
        return calling + (f"  {self.note}" if self.note else "")


@dataclass
class RunView:
    """What the live tree shows, kept up to date from the run's events, steps and usage."""

    run_id: str
    phase: str = "starting"
    note: str = ""
    steps: list[StepRecord] = field(default_factory=list)
    titles: dict[str, str] = field(default_factory=dict)
    activity: dict[str, _Activity] = field(default_factory=dict)
    calls: int = 0
    cost: str | None = None
    """What the run's calls cost so far, when known."""
    stage: str = ""
    """Which part of planning is under way (the latest `planning_progress`), shown while planning."""
    waiting: bool = False
    """Whether `note` says a request of the run waits for budget room (the run's next event clears it)."""

    def apply(self, event: Event) -> None:
        """Take in one event: the run's phase, or a step's current tool and latest notice."""
        data = event.data
        if event.step is None:
            self._apply_to_run(event)
            return
        now = self.activity.setdefault(event.step, _Activity())
        tool = shown(data.get("tool"))
        if event.kind == "tool_called":
            now.tool = str(data.get("tool"))
        elif event.kind == "tool_result":
            now.tool = None
            now.note = f"[red]{tool} failed: {shown(data['error'])}[/]" if "error" in data else ""
        elif event.kind == "tool_approval_requested":
            now.note = f"[yellow]asks to call {tool}[/]"
        elif event.kind in ("tool_approved", "tool_denied"):
            verdict = "approved" if event.kind == "tool_approved" else "denied"
            now.note = f"[yellow]{tool} {verdict}[/] [dim](by {shown(data.get('by', ''))})[/]"
        elif event.kind == "request_opened":
            now.note = f"[yellow]asks the person (request {shown(data.get('request', ''))})[/]"
        elif event.kind == "request_answered":
            now.note = f"[dim]answered by {shown(data.get('by', ''))}[/]"
        elif event.kind == "step_retried":
            attempt = shown(data.get("attempt", ""))
            now.note = f"[yellow]attempt {attempt} after: {shown(data.get('error', ''))}[/]"
        elif event.kind == "model_retried":
            now.note = f"[yellow]{shown(retry_wait(data))}[/]"
        elif event.kind == "model_waiting":
            now.note = f"[yellow]{shown(budget_wait(data))}[/]"
        elif event.kind == "step_failed":
            now.tool, now.note = None, f"[red]{shown(data.get('error', ''))}[/]"
        elif event.kind in ("input_summarized", "input_cut"):
            how = "summarised" if event.kind == "input_summarized" else "cut"
            now.note = f"[dim]input from {shown(data.get('dependency', ''))} {how}[/]"
        elif event.kind in ("step_succeeded", "step_started"):
            now.tool, now.note = None, ""
        elif event.kind in _TEAM_NOTES:
            now.note = _TEAM_NOTES[event.kind] + _markup(event_detail(event.kind, data), trimmed=True) + "[/]"

    def _apply_to_run(self, event: Event) -> None:
        data = event.data
        if self.waiting:  # the run's next event: the request that waited for budget room went on
            self.note, self.waiting = "", False
        if event.kind == "model_waiting":  # a request not of a step's (the planner's, say)
            self.note, self.waiting = f"[yellow]{shown(budget_wait(data))}[/]", True
        self.phase = _PHASES.get(event.kind, self.phase)
        if event.kind == "planning_progress":
            self.stage = planning_stage(data)
        elif event.kind in ("run_created", "plan_ready", "run_retried"):
            self.stage = ""
        if event.kind == "plan_ready" and data.get("cautions"):
            self.note = "".join(f"[yellow]caution: {shown(caution)}[/]" for caution in data["cautions"])
        elif event.kind == "plan_ready" and data.get("reuse_failed"):
            self.note = f"[yellow]stored team not reused: {shown(data['reuse_failed'])}[/]"
        if event.kind in ("run_failed", "run_cancelled", "rejected"):
            self.note = f"[red]{shown(data.get('reason', ''))}[/]"
        if event.kind == "run_retried":  # it goes on from where it failed
            self.phase = _RETRIED_PHASES.get(str(data.get("status")), "running")
            self.note = f"[yellow]retry {shown(data.get('retry', ''))}[/]"

    def render(self, elapsed: float) -> Tree:
        """The tree as it is now; `elapsed` is the run's time so far in this process."""
        now = time.time()
        frame = _SPINNER[int(now * 8) % len(_SPINNER)]
        calls = counted(self.calls, "model call") + (f" · {self.cost}" if self.cost else "")
        note = f" · {self.note}" if self.note else ""
        symbol, style, _ = _LOOK.get(self.phase, (frame, "yellow", ""))
        stage = f" · {shown(self.stage)}" if self.phase == "planning" and self.stage else ""
        label = one_line(
            f"[{style}]{symbol or frame}[/] [bold]run {shown(self.run_id)}[/] · {shown(self.phase)}{stage} · "
            f"{duration(elapsed)} · {calls}{note}"
        )
        notes = {step_id: activity.markup() for step_id, activity in self.activity.items()}
        return steps_tree(label, self.steps, self.titles, now=now, frame=frame, notes=notes)


class LiveTree:
    """The display when stderr is a terminal: the run's tree, redrawn in place about 5 times a second.

    It is given what it shows (events, the steps' states, the model calls so far, the plan's
    titles); the front end reads those through the run service.
    """

    def __init__(self, out: Console, run_id: str, history: list[Event]) -> None:
        self.out = out
        self.view = RunView(run_id)
        self.started = time.monotonic()
        self.live: Live | None = None
        for event in history:
            self.view.apply(event)
        self.resume()

    def show(
        self,
        events: list[Event],
        *,
        steps: list[StepRecord] | None = None,
        calls: int | None = None,
        cost: str | None = None,
        plan: dict[str, Any] | None = None,
    ) -> None:
        """Take in `events` and what changed, and redraw (about 5 times a second, also with no news)."""
        for event in events:
            self.view.apply(event)
        if calls is not None:
            self.view.calls = calls
        if cost is not None:
            self.view.cost = cost
        if steps is not None:
            self.view.steps = steps
        if plan is not None:
            self.view.titles = _titles(plan)
        if self.live is not None:
            self.live.update(self.view.render(time.monotonic() - self.started), refresh=True)

    def pause(self) -> None:
        """Take the tree off the screen, so a question can be asked below what was printed."""
        if self.live is not None:
            self.live.stop()
            self.live = None

    def resume(self) -> None:
        """Put the tree back (a new `Live`: a stopped one keeps its final, uncropped overflow)."""
        from rich.live import Live

        if self.live is None:
            self.live = Live(
                self.view.render(time.monotonic() - self.started),
                console=self.out,
                auto_refresh=False,
                transient=True,
                redirect_stdout=False,
            )
            self.live.start(refresh=True)

    def close(self, *, keep: bool = False) -> None:
        """Take the tree off the screen for good: the summary takes its place.

        With `keep` (the run stopped on an error or Ctrl-C: no summary comes), the steps' last
        states are printed in its place.
        """
        self.pause()
        if keep and self.view.steps:
            self.view.phase = "interrupted"
            self.out.print(self.view.render(time.monotonic() - self.started), highlight=False)


# ---- the summary


def written_files(workspace: Path, since: float) -> tuple[list[str], int, bool]:
    """The workspace's regular files changed at or after `since`: relative paths, sorted.

    Returns the first 20, how many there are, and whether the walk stopped early (a huge
    workspace). Symbolic links are not followed and version-control folders are not walked.
    (`os.walk` recursed: a step's program that nested a thousand folders made the summary of a
    run that succeeded a `RecursionError`.)
    The files this process writes its own output to (`run … > out.txt 2> err.txt` in the
    workspace) are not the run's.
    """
    found: list[str] = []
    scanned = 0
    own = set()
    for stream in (1, 2):
        with contextlib.suppress(OSError):
            mine = os.fstat(stream)
            own.add((mine.st_dev, mine.st_ino))
    for entry in walk_files(workspace, enters=lambda name: name not in _NOT_WALKED):
        scanned += 1
        if scanned > _FILES_SCANNED:
            return sorted(found)[:_FILES_SHOWN], len(found), True
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        changed = stat.S_ISREG(info.st_mode) and info.st_mtime >= since
        if changed and (info.st_dev, info.st_ino) not in own:
            found.append(Path(entry.path).relative_to(workspace).as_posix())
    return sorted(found)[:_FILES_SHOWN], len(found), False


def summary_line(report: dict[str, Any], seconds: float) -> str:
    """`run ID succeeded · 4.2 s · 11 model calls · 463 in / 59 out tokens · $0.00`, as markup."""
    status = report["status"]
    colour = "green" if status == "succeeded" else "red"
    usage = report["usage"]
    parts = [
        f"[bold {colour}]run {shown(report['run_id'])} {shown(status_word(status))}[/]",
        duration(seconds),
        counted(usage["llm_calls"], "model call") + failed_note(usage.get("failed_calls", 0)),
        f"{usage['input_tokens']:,} in / {usage['output_tokens']:,} out tokens",
    ]
    price = money(usage.get("cost_usd", 0.0), usage.get("unpriced_calls", 0))
    return " · ".join([*parts, price] if price else parts)


def _files_lines(report: dict[str, Any]) -> list[str]:
    workspace = Path(report["workspace"])
    since = _seconds(report["created_at"]) or 0.0
    try:
        names, count, stopped = written_files(workspace, since)
    except OSError:
        return []
    where = shown(report["workspace"])
    if not count:
        return [f"no files written in {where}"]
    lines = [f"{counted(count, 'file')} written in {where}:"]
    lines += [f"  {shown(name)}" for name in names]
    if count > len(names):
        lines.append(f"  [dim]and {count - len(names):,} more[/]")
    if stopped:
        lines.append(f"  [dim](stopped looking after {_FILES_SCANNED:,} files)[/]")
    return lines


def print_summary(
    out: Console, report: dict[str, Any], run: RunRecord, seconds: float, *, tree: bool
) -> None:
    """Print how the run ended; with `tree`, its steps' final states hang under the first line."""
    first = summary_line(report, seconds)
    if tree and report["steps"]:
        from ..engine.records import flat_steps
        from ..service import StepRecord

        steps = [StepRecord(**step) for step in flat_steps(report["steps"])]
        notes = {
            step.id: f"  [red]{shown(step.error)}[/]"
            for step in steps
            if step.error and step.status in ("failed", "skipped", "cancelled")
        }
        from rich.text import Text

        label = Text.from_markup(first)  # wrapped, never cut: its cost is at its end
        out.print(
            steps_tree(label, steps, _titles(report["plan"]), now=time.time(), notes=notes),
            highlight=False,
        )
    else:
        out.print(first, highlight=False, soft_wrap=True)
    for line in _files_lines(report):
        out.print(line, highlight=False, soft_wrap=True)
