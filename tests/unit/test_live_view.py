"""The live view of `masterplanner run` in a pseudo-terminal, and its parts: tree lines, summary, files."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pexpect
import pytest
from rich.console import Console
from rich.tree import Tree

from _deep_folders import deep_folders
from masterplanner.cli.live import (
    RunView,
    event_line,
    one_line,
    print_summary,
    step_line,
    summary_line,
    written_files,
)
from masterplanner.engine import Event, RunRecord, StepRecord

OSC52 = "\x1b]52;c;SGVsbG8=\x07"
OSC52_SHOWN = r"\x1b]52;c;SGVsbG8=\x07"
# CSI sequences (colours, cursor moves, line erases) and the other escapes rich writes
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[()][0-9A-B]|\r")


def _plain(raw: str) -> str:
    return _ANSI.sub("", raw)


def _step(step_id: str, title: str, tools: list[str], *deps: str) -> dict[str, Any]:
    return {
        "id": step_id,
        "title": title,
        "instruction": f"Do {step_id}.",
        "agent_role": "worker",
        "tools": tools,
        "depends_on": list(deps),
        "expected_output": f"{step_id} done",
    }


def _tool(step_id: str, name: str, delay_s: float = 0.0, **args: str) -> dict[str, Any]:
    """A scripted reply of step `step_id`'s agent: one call of tool `name`."""
    return {"purpose": f"step:{step_id}", "delay_s": delay_s, "tool_calls": [{"name": name, "args": args}]}


def _three_steps(write_script: Callable[..., Path]) -> Path:
    """`draft` writes notes/draft.md then `publish` writes out.txt; `check` fails a read meanwhile."""
    steps = [
        _step("draft", "draft the notes", ["write_file"]),
        _step("publish", "publish them", ["write_file"], "draft"),
        _step("check", "check " + OSC52 + " it", ["read_file"]),
    ]
    return write_script(
        [
            {"purpose": "planner", "output": {"steps": steps}},
            _tool("draft", "write_file", 0.8, path="notes/draft.md", content="x"),
            {"purpose": "step:draft", "output": "drafted", "delay_s": 0.5},
            _tool("publish", "write_file", 0.3, path="out.txt", content="y"),
            {"purpose": "step:publish", "output": "published", "delay_s": 0.3},
            # the tool's error names the path: its escape must be shown, never sent to the terminal
            _tool("check", "read_file", path="r" + OSC52),
            {"purpose": "step:check", "output": "checked", "delay_s": 1.0},
            {"purpose": "*", "repeat": True},
        ]
    )


def _spawn(*args: str) -> pexpect.spawn:
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40"}
    for name in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "CI"):
        env.pop(name, None)
    return pexpect.spawn(
        sys.executable,
        ["-m", "masterplanner", *args],
        env=env,
        dimensions=(40, 120),
        encoding="utf-8",
        timeout=90,
    )


def _finish(child: pexpect.spawn) -> tuple[str, int]:
    child.expect(pexpect.EOF)
    child.close()
    return str(child.before), int(child.exitstatus if child.exitstatus is not None else -1)


def test_a_terminal_shows_a_live_tree_then_the_summary(write_script: Callable[..., Path]) -> None:
    script = _three_steps(write_script)
    child = _spawn("run", "notes and a check", "--model", f"scripted:{script}", "--yes")
    raw, status = _finish(child)
    assert status == 0, raw
    assert "\x1b]" not in raw and "\x07" not in raw  # no OSC reached the terminal
    assert "\x1b[" in raw  # a live view: colours and cursor moves
    screen = _plain(raw)
    run_id, workspace = re.search(r"run (\S+) · workspace (\S+)\n", screen).groups()  # type: ignore[union-attr]
    # the tree, while the steps ran: each step running at some point, publish waiting for draft
    assert re.search(r"draft\s+running\s+\d+\.\d s  draft the notes", screen)
    assert re.search(r"· publish\s+waiting\s+publish them", screen)
    assert re.search(rf"check\s+running\s+\d+\.\d s  check {re.escape(OSC52_SHOWN)} it", screen)
    assert f"  read_file failed: the path 'r{OSC52_SHOWN}'" in screen  # cut at the terminal's edge
    assert re.search(rf"run {run_id} · running · \d+\.\d s · \d+ model calls · \$0\.00\n", screen)
    # the summary the tree collapses to: status and totals, each step's final state, the files
    summary = screen[screen.rindex(f"run {run_id} succeeded") :]
    lines = summary.splitlines()
    assert re.fullmatch(
        rf"run {run_id} succeeded · \d+\.\d s · \d+ model calls · \d+ in / \d+ out tokens · \$0\.00", lines[0]
    )
    assert [line.split()[:3] for line in lines[1:4]] == [
        ["├──", "✓", "draft"],
        ["├──", "✓", "publish"],
        ["└──", "✓", "check"],
    ]
    assert all(re.search(r"succeeded\s+\d+\.\d s  ", line) for line in lines[1:4])
    assert f"check {OSC52_SHOWN} it" in lines[3]
    assert lines[4:] == [f"2 files written in {workspace}:", "  notes/draft.md", "  out.txt"]


def test_the_header_says_which_part_of_planning_is_under_way(write_script: Callable[..., Path]) -> None:
    """Planning showed only "planning" for minutes: the planner, the drafts and the critique looked alike."""
    steps = [_step("a", "do a", ["write_file"]), _step("b", "do b", ["write_file"], "a")]
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": steps}, "delay_s": 1.0},
            {"purpose": "prompt_creator", "output": "You are a worker.", "delay_s": 0.8, "repeat": True},
            {"purpose": "critic", "delay_s": 0.8, "repeat": True},
            {"purpose": "step:a", "output": "a done"},
            {"purpose": "step:b", "output": "b done"},
        ]
    )
    child = _spawn("run", "a then b", "--model", f"scripted:{script}", "--yes")
    raw, status = _finish(child)
    assert status == 0, raw
    screen = _plain(raw)
    for stage in ("planning the steps", "writing prompts (2 of 2)", "reviewing prompts (round 1)"):
        header = rf"run \S+ · planning · {re.escape(stage)} · \d+\.\d s · \d+ model calls?"
        assert re.search(header, screen), stage


def test_each_part_of_planning_reads_in_words_and_leaves_the_header_once_planned() -> None:
    view = RunView("r1")
    view.apply(_event("run_created"))
    said = []
    for data in (
        {"stage": "similar_teams"},
        {"stage": "adapting"},
        {"stage": "steps"},
        {"stage": "prompts", "draft": 2, "of": 5},
        {"stage": "review", "round": 1},
        {"stage": "steps" + OSC52},
    ):
        event = _event("planning_progress", **data)
        view.apply(event)
        header = _text(view.render(1)).splitlines()[0]
        said.append(header[header.index("planning") : header.index(" · 1.0 s")])
        assert _text(one_line(event_line(event))).strip() == f"00:00:00 planning_progress {said[-1][11:]}"
    assert said == [
        "planning · finding similar teams",
        "planning · adapting a stored team",
        "planning · planning the steps",
        "planning · writing prompts (2 of 5)",
        "planning · reviewing prompts (round 1)",
        f"planning · steps{OSC52_SHOWN}",
    ]
    view.apply(_event("plan_ready"))
    assert " · planned · 1.0 s · " in _text(view.render(1)).splitlines()[0]


def test_questions_pause_the_tree_and_it_resumes_after_them(write_script: Callable[..., Path]) -> None:
    ask = _step("ask", "ask and delete", ["write_file", "delete_file", "ask_user"])
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [ask, _step("slow", "take a while", [])]}},
            {"purpose": "prompt_creator", "output": "You are a worker.", "repeat": True},
            _tool("ask", "write_file", path="a.txt", content="1"),
            _tool("ask", "delete_file", 0.5, path="a.txt"),  # under policy `ask`: the person approves it
            _tool("ask", "ask_user", question="which colour?"),
            {"purpose": "step:ask", "output": "asked", "delay_s": 0.8},
            {"purpose": "step:slow", "output": "slow done", "delay_s": 1.5},
            {"purpose": "*", "repeat": True},
        ]
    )
    child = _spawn("run", "ask things", "--model", f"scripted:{script}")
    child.expect_exact("approve, reject or edit? [a/r/e]")
    child.sendline("a")
    child.expect_exact("allow this call? [y/N]")
    before_approval = _plain(str(child.before))
    child.sendline("y")
    child.expect_exact("your answer")
    between = _plain(str(child.before))
    child.sendline("blue")
    raw, status = _finish(child)
    assert status == 0, raw
    after = _plain(raw)
    # the tree showed what the step waits for, then made way for the question
    waiting = r"ask\s+running\s+\d+\.\d s  ask and delete  asks to call delete_file\n"
    assert re.search(waiting, before_approval)
    assert "\nstep ask wants to call delete_file\npath: a.txt\n" in before_approval
    # after each answer the tree comes back, and the run goes on to its summary
    assert re.search(r"ask\s+running\s+\d+\.\d s  ask and delete", between)
    assert "\nan agent asks: which colour?\n" in between
    assert re.search(r"run \S+ · running · \d+\.\d s · \d+ model calls · \$0\.00\n", after)
    assert re.search(r"\n└── ✓ slow\s+succeeded\s+\d+\.\d s  take a while\n", after)
    assert re.search(r"\nno files written in \S+\n$", after)
    run_id = re.search(r"run (\S+) succeeded", after).group(1)  # type: ignore[union-attr]
    show = [sys.executable, "-m", "masterplanner", "runs", "show", run_id, "--json"]
    shown = subprocess.run(show, capture_output=True, text=True, check=True)
    events = json.loads(shown.stdout)["events"]
    results = [e["data"].get("result") for e in events if e["kind"] == "tool_result"]
    assert results[1:] == ["deleted a.txt", "blue"]


# ---- the parts


def _event(kind: str, step: str | None = None, **data: Any) -> Event:
    return Event(1, "2026-01-01T00:00:00.000Z", kind, step, data)  # type: ignore[arg-type]


def _text(renderable: Any, width: int = 160) -> str:
    console = Console(width=width, record=True, color_system=None, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def test_the_tree_shows_each_steps_status_tool_and_latest_notice() -> None:
    started = "2026-01-01T00:00:00.000Z"
    running = datetime.fromtimestamp(time.time() - 3.2, UTC).isoformat()
    view = RunView(
        "r1",
        steps=[
            StepRecord("fetch", "succeeded", started_at=started, finished_at="2026-01-01T00:00:02.500Z"),
            StepRecord("write", "running", started_at=running),
            StepRecord("retry", "running", started_at=running),
            StepRecord("later", "pending"),
            StepRecord("gone", "skipped", error="a dependency failed"),
            StepRecord("stop", "cancelled"),
            StepRecord("bad", "failed", started_at=started, finished_at="2026-01-01T00:01:05.000Z"),
        ],
        titles={"fetch": "fetch " + OSC52, "write": "[bold]write[/]", "retry": "x" * 60},
    )
    for event in [
        _event("approved"),
        _event("tool_called", "write", tool="write_file", arguments={}),
        _event("tool_approval_requested", "retry", tool="delete_file", arguments={}),
        _event("tool_denied", "retry", tool="delete_file", by="person"),
        _event("step_retried", "retry", attempt=2, error="bad " + OSC52),
        _event("step_failed", "bad", error="it broke"),
    ]:
        view.apply(event)
    text = _text(view.render(12.34))
    assert "\x1b" not in text and "\x07" not in text
    lines = text.splitlines()
    assert re.fullmatch(r". run r1 · running · 12\.3 s · 0 model calls", lines[0])
    assert lines[1] == f"├── ✓ fetch succeeded   2.5 s  fetch {OSC52_SHOWN}"
    assert re.fullmatch(r"├── . write running     3\.\d s  \[bold\]write\[/\]  → write_file", lines[2])
    assert re.fullmatch(
        rf"├── . retry running     3\.\d s  x{{47}}…  attempt 2 after: bad {re.escape(OSC52_SHOWN)}", lines[3]
    )
    assert lines[4:] == [
        "├── · later waiting            ",
        "├── - gone  skipped            ",
        "├── ■ stop  cancelled          ",
        "└── ✗ bad   failed     1m 05s    it broke",
    ]
    view.apply(_event("tool_result", "write", tool="write_file", result="ok"))
    view.apply(_event("run_failed", reason="out of " + OSC52))
    text = _text(view.render(3725))
    assert text.splitlines()[0] == f"✗ run r1 · failed · 1h 02m · 0 model calls · out of {OSC52_SHOWN}"
    assert "→ write_file" not in text


def test_a_step_resumed_in_another_process_says_where() -> None:
    view = RunView("r1", steps=[StepRecord("fetch", "running", started_at="2026-01-01T00:00:00.000Z")])
    resumed = _event("step_resumed", "fetch", process="w2-" + OSC52)
    view.apply(resumed)
    assert _text(view.render(1)).splitlines()[1].endswith(f"resumed in w2-{OSC52_SHOWN}")
    assert _text(one_line(event_line(resumed))).strip() == f"00:00:00 step_resumed fetch in w2-{OSC52_SHOWN}"


def test_a_stored_team_not_reused_is_said_in_the_header() -> None:
    # with --yes there is no review: the header is where a person sees the team was planned afresh
    view = RunView("r1", steps=[StepRecord("a", "pending")])
    view.apply(_event("plan_ready", steps=["a"], reuse_failed="cohort r0 could not be adapted: " + OSC52))
    view.apply(_event("approved"))
    assert (
        _text(view.render(1))
        .splitlines()[0]
        .endswith(f"0 model calls · stored team not reused: cohort r0 could not be adapted: {OSC52_SHOWN}")
    )


def test_a_retried_run_runs_again_and_its_steps_lose_their_old_failure() -> None:
    view = RunView("r1", steps=[StepRecord("fetch", "pending")])
    view.apply(_event("step_failed", "fetch", error="provider down"))
    view.apply(_event("run_failed", reason="step fetch failed: provider down"))
    assert view.phase == "failed" and "provider down" in _text(view.render(1)).splitlines()[1]
    retried = _event("run_retried", retry=1, status="running", steps=["fetch"], by="cli@h:1" + OSC52)
    view.apply(retried)
    view.apply(_event("step_started", "fetch"))
    lines = _text(view.render(1)).splitlines()
    assert " · running · " in lines[0] and lines[0].endswith("retry 1")
    assert "provider down" not in lines[1]
    assert _text(one_line(event_line(retried))).strip() == (
        f"00:00:00 run_retried retry 1: fetch (by cli@h:1{OSC52_SHOWN})"
    )


def test_a_request_waiting_for_budget_room_says_what_it_waits_for() -> None:
    """A request waiting for the requests in flight to be counted said nothing: a step stood still."""
    running = datetime.fromtimestamp(time.time() - 1, UTC).isoformat()
    view = RunView("r1", steps=[StepRecord("fetch", "running", started_at=running)])
    waiting = _event("model_waiting", "fetch", purpose="step:fetch", budget="max_tokens", in_flight=2)
    view.apply(waiting)
    assert (
        _text(view.render(1))
        .splitlines()[1]
        .endswith("step:fetch waits for room in the token budget: 2 model requests in flight to be counted")
    )
    assert _text(one_line(event_line(waiting))).strip() == (
        "00:00:00 model_waiting fetch step:fetch waits for room in the token budget: "
        "2 model requests in flight to be counted"
    )
    view.apply(_event("model_waiting", purpose="planner" + OSC52, budget="max_cost_usd", in_flight=1))
    run_line = _text(view.render(1)).splitlines()[0]
    assert run_line.endswith(
        f"· planner{OSC52_SHOWN} waits for room in the money budget: 1 model request in flight to be counted"
    )
    view.apply(_event("plan_ready"))  # the planner's request went on
    assert "waits" not in _text(view.render(1)).splitlines()[0]


def test_a_run_a_worker_refused_says_which_and_why() -> None:
    refused = _event("run_refused", process="w1", reason="model file /m.gguf: no such file " + OSC52)
    assert _text(one_line(event_line(refused))).strip() == (
        f"00:00:00 run_refused by w1: model file /m.gguf: no such file {OSC52_SHOWN}"
    )


def test_what_the_registry_did_not_keep_says_why() -> None:
    kept = _event("team_not_stored", reason="the task holds what looks like a secret " + OSC52)
    assert _text(one_line(event_line(kept))).strip() == (
        f"00:00:00 team_not_stored the task holds what looks like a secret {OSC52_SHOWN}"
    )
    episode = _event("episode_not_kept", reason="that looks like a secret")
    assert (
        _text(one_line(event_line(episode))).strip() == "00:00:00 episode_not_kept that looks like a secret"
    )
    declined = _event("team_not_stored", request="q1")  # the person said no: nothing more to say
    assert _text(one_line(event_line(declined))).strip() == "00:00:00 team_not_stored"


def test_a_replaced_step_and_an_expanded_one_with_its_sub_steps_under_it() -> None:
    view = RunView(
        "r2",
        steps=[
            StepRecord("a", "replaced", error="it broke"),
            StepRecord("b", "expanded"),
            StepRecord("a2", "pending"),
            StepRecord("b--x", "pending"),
        ],
        titles={"a2": "do a again", "b--x": "part of b"},
    )
    view.apply(_event("replanned", "a", retired=["a"], steps=["a2"], by="auto", n=1))
    lines = _text(view.render(1.0)).splitlines()
    assert lines[1:] == [
        "├── ↻ a    replaced             replaced into a2 (by auto)",
        "├── ▾ b    expanded           ",
        "│   └── · b--x waiting            part of b",
        "└── · a2   waiting            do a again",
    ]


def test_a_tree_line_is_cut_never_wrapped() -> None:
    line = step_line(StepRecord("a", "pending"), "t" * 40, 1, now=0, activity="  " + "n" * 200)
    tree = Tree(one_line("root " + "r" * 100))
    tree.add(line)
    assert _text(tree, width=80).splitlines() == [
        "root " + "r" * 74 + "…",
        "└── · a waiting            " + "t" * 40 + "  " + "n" * 10 + "…",
    ]


def test_written_files_lists_changed_regular_files_sorted_and_capped(tmp_path: Path) -> None:
    old = tmp_path / "old.txt"
    old.write_text("before the run")
    os.utime(old, (1_000, 1_000))
    since = time.time() - 5
    for index in range(23):
        path = tmp_path / ("sub" if index % 2 else "") / f"f{index:02d}.txt"
        path.parent.mkdir(exist_ok=True)
        path.write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "f00.txt")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref")
    names, count, stopped = written_files(tmp_path, since)
    assert count == 23 and not stopped
    assert names == sorted(names) and len(names) == 20
    assert names[:3] == ["f00.txt", "f02.txt", "f04.txt"]
    assert "sub/f01.txt" in names and "old.txt" not in names and "link" not in names
    assert written_files(tmp_path / "missing", since) == ([], 0, False)


def test_written_files_walks_folders_nested_deeper_than_python_recurses(tmp_path: Path) -> None:
    since = time.time() - 5
    with deep_folders(tmp_path, "f.txt", "x") as depth:
        names, count, stopped = written_files(tmp_path, since)
    assert (count, stopped, names[0].count("/"), names[0].endswith("/f.txt")) == (1, False, depth, True)


def _report(status: str, workspace: Path, created_at: str, **usage: int) -> dict[str, Any]:
    return {
        "run_id": "r1",
        "status": status,
        "workspace": str(workspace),
        "created_at": created_at,
        "plan": {"steps": [{"id": "a", "title": "do " + OSC52}]},
        "steps": [StepRecord("a", status, error="it broke" if status == "failed" else None).to_json_dict()],
        "usage": {"llm_calls": 1, "input_tokens": 1234, "output_tokens": 5, "by_purpose": {}} | usage,
    }


@pytest.mark.parametrize(
    ("spent", "price"),
    [
        ({"cost_usd": 0.0, "unpriced_calls": 0}, "$0.00"),
        ({"cost_usd": 0.01234, "unpriced_calls": 0}, "$0.0123"),
        ({"cost_usd": 2.5, "unpriced_calls": 3}, "$2.50 + 3 calls of unknown price"),
        ({"cost_usd": 0.0, "unpriced_calls": 1}, "1 call of unknown price"),  # it said nothing
        ({"cost_usd": 0.5, "unpriced_calls": 1}, "$0.5000 + 1 call of unknown price"),  # "1 calls"
        ({"cost_usd": 0.00003, "unpriced_calls": 0}, "under $0.0001"),  # "$0.0000" read as free
    ],
)
def test_the_cost_is_shown_when_known(spent: dict[str, Any], price: str | None) -> None:
    report = _report("succeeded", Path("/w"), "2026-01-01T00:00:00.000Z")
    report["usage"] |= spent
    line = summary_line(report, 4.25)
    expected = "[bold green]run r1 succeeded[/] · 4.2 s · 1 model call · 1,234 in / 5 out tokens"
    assert line == (f"{expected} · {price}" if price else expected)


def _failed_run_summary(workspace: Path, *, width: int, tree: bool) -> list[str]:
    """The summary lines of a failed run of 75 s in `workspace`, printed `width` columns wide."""
    created = "2000-01-01T00:00:00.000Z"
    report = _report("failed", workspace, created, llm_calls=2)
    run = RunRecord("r1", "t", "failed", "openai:gpt", str(workspace), created, created)
    console = Console(width=width, record=True, color_system=None, file=io.StringIO())
    print_summary(console, report, run, 75.0, tree=tree)
    return console.export_text().splitlines()


@pytest.mark.parametrize("tree", [True, False])
def test_the_summary_lists_the_files_and_hangs_the_steps_under_it(tmp_path: Path, tree: bool) -> None:
    for index in range(25):
        (tmp_path / f"{OSC52}{index:02d}.txt").write_text("x")
    lines = _failed_run_summary(tmp_path, width=200, tree=tree)
    first = "run r1 failed · 1m 15s · 2 model calls · 1,234 in / 5 out tokens · $0.00"
    steps = [f"└── ✗ a failed             do {OSC52_SHOWN}  it broke"] if tree else []
    files = [f"  {OSC52_SHOWN}{index:02d}.txt" for index in range(20)]
    assert lines == [first, *steps, f"25 files written in {tmp_path}:", *files, "  and 5 more"]


def test_ctrl_c_leaves_the_tree_where_the_run_stopped(write_script: Callable[..., Path]) -> None:
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [_step("long", "take long", [])]}},
            {"purpose": "step:long", "output": "never", "delay_s": 60},
            {"purpose": "*", "repeat": True},
        ]
    )
    child = _spawn("run", "something long", "--model", f"scripted:{script}", "--yes")
    child.expect_exact("running  ")  # the step's status (the header's is followed by " · ")
    child.sendintr()
    raw, status = _finish(child)
    assert status == 130
    assert "\x1b[?25h" in raw  # the cursor is shown again
    # what follows the live view's end (it shows the cursor; the exit shows it once more)
    last = _plain("".join(raw.split("\x1b[?25h")[-2:])).strip().splitlines()
    assert re.fullmatch(r"■ run \S+ · interrupted · \d+\.\d s · \d+ model calls · \$0\.00", last[-4])
    assert re.fullmatch(r"└── . long running\s+\d+\.\d s  take long", last[-3])
    # then how to go on, and that the command was stopped
    assert re.fullmatch(
        r"run (\S+) stopped; to go on from where it stopped: masterplanner runs resume \1", last[-2]
    )
    assert last[-1] == "interrupted"


def test_ctrl_c_at_a_tool_question_draws_the_tree_once_before_the_resume_hint(
    write_script: Callable[..., Path],
) -> None:
    """The question, cut off, resumed the live view: the tree was drawn again below "interrupted"."""
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [_step("calc", "do calc", ["code_execution"])]}},
            {
                "purpose": "step:calc",
                "tool_calls": [{"name": "code_execution", "args": {"code": "print(2)"}}],
            },
            {"purpose": "*", "repeat": True},
        ]
    )
    child = _spawn("run", "something", "--model", f"scripted:{script}", "--rounds", "0")
    child.expect_exact("[a/r/e]")
    child.sendline("a")
    child.expect_exact("allow this call? [y/N]")
    child.sendintr()
    raw, status = _finish(child)
    assert status == 130
    after = _plain(raw.split("masterplanner runs resume")[-1])
    assert after.split("\n", 1)[1].strip() == "interrupted"  # the hint's line ends; nothing after
    assert _plain(raw).count("· interrupted ·") == 1


def test_ctrl_c_at_the_review_question_leaves_the_cursor_shown(write_script: Callable[..., Path]) -> None:
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [_step("a", "do a", [])]}},
            {"purpose": "*", "repeat": True},
        ]
    )
    child = _spawn("run", "something", "--model", f"scripted:{script}", "--rounds", "0")
    child.expect_exact("[a/r/e]")
    child.sendintr()
    raw, status = _finish(child)
    assert status == 130
    # the last word on the cursor shows it (a spinner beside the question had hidden it)
    assert raw.rfind("\x1b[?25h") > raw.rfind("\x1b[?25l")


@pytest.mark.parametrize("tree", [True, False])
def test_a_summary_wider_than_the_terminal_wraps_and_keeps_its_cost(tmp_path: Path, tree: bool) -> None:
    lines = _failed_run_summary(tmp_path, width=50, tree=tree)
    whole = "run r1 failed · 1m 15s · 2 model calls · 1,234 in / 5 out tokens · $0.00"
    if tree:  # the tree's label wraps at the width; only its step lines are cut
        assert lines[:3] == [
            "run r1 failed · 1m 15s · 2 model calls · 1,234 in ",
            "/ 5 out tokens · $0.00",
            f"└── ✗ a failed             do {OSC52_SHOWN[:-3]}…",
        ]
    else:  # one line the terminal wraps
        assert lines[:1] == [whole]
    assert lines[-1] == f"no files written in {tmp_path}"


@pytest.mark.parametrize(
    ("prompts", "said"),
    [
        (0, "resuming planning (its plan was made before)"),
        (1, "resuming planning (its plan and 1 of its prompts were made before)"),
        (3, "resuming planning (its plan and 3 of its prompts were made before)"),
    ],
)
def test_resumed_planning_says_what_was_made_before(prompts: int, said: str) -> None:
    from masterplanner.event_text import planning_stage

    assert planning_stage({"stage": "resumed", "prompts": prompts}) == said
