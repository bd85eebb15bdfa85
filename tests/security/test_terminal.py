"""Terminal injection: text from models, tools and stores is shown, never obeyed by the terminal.

Each attack is printed through the CLI's own console: escape sequences, C1 controls, BEL,
backspace and carriage returns, bidi controls and rich markup come out as visible text. A
scripted run then carries the same payloads through every place the CLI prints model, tool and
stored text, and the captured stdout and stderr hold none of the raw characters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from masterplanner.cli.app import console
from masterplanner.cli.terminal import json_text, shown, visible

pytestmark = pytest.mark.security

# (attack, the text as a model or tool sends it, exactly what the terminal receives)
ATTACKS = [
    ("OSC 52 clipboard write (BEL)", "\x1b]52;c;SGVsbG8=\x07", r"\x1b]52;c;SGVsbG8=\x07"),
    ("OSC 52 clipboard write (ST)", "\x1b]52;c;SGVsbG8=\x1b\\", r"\x1b]52;c;SGVsbG8=\x1b" + "\\"),
    ("OSC 0 window title", "\x1b]0;pwned\x07", r"\x1b]0;pwned\x07"),
    (
        "OSC 8 hyperlink",
        "\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\",
        r"\x1b]8;;https://evil.example\x1b\click\x1b]8;;\x1b" + "\\",
    ),
    ("CSI clear screen", "\x1b[2J\x1b[H", r"\x1b[2J\x1b[H"),
    ("CSI cursor up and erase line", "ok\x1b[1A\x1b[2Kfaked", r"ok\x1b[1A\x1b[2Kfaked"),
    ("CSI SGR colours", "\x1b[31mred\x1b[0m", r"\x1b[31mred\x1b[0m"),
    ("8-bit CSI (C1 0x9b)", "\x9b2J\x9b31m", r"\x9b2J\x9b31m"),
    ("8-bit OSC and ST (C1 0x9d, 0x9c)", "\x9d0;pwned\x9c", r"\x9d0;pwned\x9c"),
    ("DCS (ESC P) and 8-bit DCS (0x90)", "\x1bPq#0\x1b\\\x90x\x9c", r"\x1bPq#0\x1b\\x90x\x9c"),
    ("BEL", "ding\x07", r"ding\x07"),
    (
        "backspace overwrite",
        "rm -rf /\x08\x08\x08\x08\x08\x08\x08\x08ls",
        r"rm -rf /\x08\x08\x08\x08\x08\x08\x08\x08ls",
    ),
    ("carriage-return overwrite", "evil command\rsafe", r"evil command\rsafe"),
    ("NUL and DEL", "a\x00b\x7fc", r"a\x00b\x7fc"),
    ("bidi override U+202E", "invoice\u202efdp.exe", r"invoice\u202efdp.exe"),
    ("bidi isolates U+2066-U+2069", "\u2066a\u2067b\u2068c\u2069", r"\u2066a\u2067b\u2068c\u2069"),
    ("bidi marks U+200E/U+200F/U+061C", "\u200ex\u200fy\u061cz", r"\u200ex\u200fy\u061cz"),
    ("invisible tag characters (U+E0041…)", "hi\U000e0041\U000e0042", r"hi\U000e0041\U000e0042"),
    ("line and paragraph separators", "a\u2028b\u2029c", r"a\u2028b\u2029c"),
    ("lone surrogate (crashes a UTF-8 write)", "a\ud800b", r"a\ud800b"),
    (
        "newline in a one-line field (fake log line)",
        "ok\n08:00:00 run_succeeded",
        r"ok\n08:00:00 run_succeeded",
    ),
    ("rich markup style", "[bold red]alarm[/]", "[bold red]alarm[/]"),
    ("rich markup link", "[link=https://evil.example]docs[/link]", "[link=https://evil.example]docs[/link]"),
    ("rich markup unbalanced close (MarkupError)", "[/] [/nope]", "[/] [/nope]"),
    ("rich markup escaped by backslashes", "\\[bold]x\\\\\\", "\\[bold]x\\\\\\"),
    ("rich emoji code", ":thumbs_up: :pile_of_poo:", ":thumbs_up: :pile_of_poo:"),
]
RAW = "\x1b\x9b\x9c\x9d\x90\x07\x08\r\x00\x7f\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u2028\u2029"


def _assert_clean(output: str) -> None:
    """No character in `output` that a terminal would act on instead of showing."""
    hidden = sorted(
        {
            f"U+{ord(char):04X}"
            for char in output
            if char not in "\n\t" and unicodedata.category(char) in ("Cc", "Cf", "Cs", "Zl", "Zp")
        }
    )
    assert hidden == [], hidden
    assert not any(char in output for char in RAW)


def _printed(markup: str) -> str:
    """What the CLI's console writes for `markup` (no terminal: the characters themselves)."""
    out = console()
    with out.capture() as capture:
        out.print(markup, highlight=False, soft_wrap=True)
    return capture.get()


@pytest.mark.parametrize(("attack", "text", "expected"), ATTACKS, ids=[attack for attack, _, _ in ATTACKS])
def test_every_attack_is_printed_as_visible_text(attack: str, text: str, expected: str) -> None:
    assert visible(text) == expected
    assert _printed(shown(text)) == expected + "\n"
    assert _printed(f"[red]{shown(text)}[/] and after") == expected + " and after\n"
    _assert_clean(_printed(shown(text)))


def test_multi_line_text_keeps_newlines_and_tabs_only() -> None:
    text = "line 1\r\n\tline 2\rover\x1b[2K\nline 3\u202e"
    assert visible(text, lines=True) == "line 1\n\tline 2\\rover\\x1b[2K\nline 3\\u202e"
    assert visible(text) == "line 1\\r\\n\\tline 2\\rover\\x1b[2K\\nline 3\\u202e"


def test_ordinary_text_is_unchanged() -> None:
    text = "Café ☕ 日本語 👩‍👩‍👧 naïve — “quotes” [1] a[0] x[i]"
    assert visible(text) == text
    assert _printed(shown(text)) == text + "\n"


@settings(max_examples=400, deadline=None)
@given(
    st.text(alphabet="\\[]/ab#@=:x \x1b\x9b\u202e\n", max_size=16),
    st.sampled_from(["{}", "[red]{}[/] after", "({})", "{} [dim]x[/]", "a]{}]b", "{}]", "{}{}", "{}bold]"]),
)
def test_shown_prints_exactly_the_visible_text_wherever_it_is_put(text: str, context: str) -> None:
    literal = context.replace("[red]", "").replace("[dim]", "").replace("[/]", "")
    assert _printed(context.replace("{}", shown(text))) == literal.replace("{}", visible(text)) + "\n"


def test_json_output_is_ascii_and_round_trips() -> None:
    payload = {attack: text for attack, text, _ in ATTACKS if "surrogate" not in attack}
    encoded = json_text(payload)
    assert encoded.isascii()
    _assert_clean(encoded)
    assert json.loads(encoded) == payload
    assert '"\\u009b2J\\u009b31m"' in encoded
    assert '"invoice\\u202efdp.exe"' in encoded


# ---- through the command line


def mp(*args: str, stdin: str = "", env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "masterplanner", *args],
        input=stdin,
        capture_output=True,
        text=True,
        errors="surrogateescape",
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        timeout=120,
    )


PAYLOAD = (
    "<\x1b]52;c;SGVsbG8=\x07|\x1b]0;pwned\x07|\x1b[2J|\x9b31m|[bold red]red[/]|"
    "[link=https://evil.example]x[/link]|\u202eevil|\x08\r>"
)
SHOWN = (
    r"<\x1b]52;c;SGVsbG8=\x07|\x1b]0;pwned\x07|\x1b[2J|\x9b31m|[bold red]red[/]|"
    r"[link=https://evil.example]x[/link]|\u202eevil|\x08\r>"
)
ROLE = "role <\x1b]0;pwned\x07|\x9b2J|[bold]b[/]|\u202e>"  # a role is at most 100 characters
ROLE_SHOWN = r"role <\x1b]0;pwned\x07|\x9b2J|[bold]b[/]|\u202e>"


def _script(write_script: Callable[..., Path]) -> Path:
    step = {
        "id": "a",
        "title": "title " + PAYLOAD,
        "instruction": "instruction " + PAYLOAD + "\nsecond line",
        "agent_role": ROLE,
        "tools": ["delete_file", "ask_user", "read_file", "remember"],
        "depends_on": [],
        "expected_output": "expected " + PAYLOAD,
    }
    calls: list[dict[str, Any]] = [
        {"purpose": "planner", "output": {"steps": [step]}},
        {"purpose": "prompt_creator", "output": "prompt " + PAYLOAD, "repeat": True},
        # delete_file is under policy `ask`, but a path with control characters is refused before
        # anyone is asked: the refusal (it names the path) is shown in the event line
        {"purpose": "step:a", "tool_calls": [{"name": "delete_file", "args": {"path": "del" + PAYLOAD}}]},
        {"purpose": "step:a", "tool_calls": [{"name": "ask_user", "args": {"question": "ask" + PAYLOAD}}]},
        # the tool's error (it names the path) is shown in the event line
        {"purpose": "step:a", "tool_calls": [{"name": "read_file", "args": {"path": "r" + PAYLOAD}}]},
        # remember is put under `ask` for this run: its arguments are put to the person
        {"purpose": "step:a", "tool_calls": [{"name": "remember", "args": {"fact": "fact " + PAYLOAD}}]},
        {"purpose": "step:a", "output": "output " + PAYLOAD + "\nline 2\tend"},
        {
            "purpose": "feedback",
            "output": {"lessons": [{"step": "a", "lesson": "Quote quantities precisely " + PAYLOAD}]},
        },
        {"purpose": "*", "repeat": True},
    ]
    return write_script(calls)


def test_a_scripted_run_prints_every_payload_visibly(write_script: Callable[..., Path]) -> None:
    script = _script(write_script)
    task = "task " + PAYLOAD
    result = mp(
        "run",
        task,
        "--model",
        f"scripted:{script}",
        stdin="a\nmy answer\ny\n",
        env={"MASTERPLANNER_TOOL_POLICIES": '{"remember": "ask"}'},
    )
    assert result.returncode == 0, result.stderr
    _assert_clean(result.stdout + result.stderr)
    assert result.stdout.strip() == "output " + SHOWN + "\nline 2\tend"
    err = result.stderr
    assert f"\ntask {SHOWN}\n" in err  # the plan tree's root
    assert f"a title {SHOWN} (starts at once)\n" in err
    assert f"role {ROLE_SHOWN}   tools delete_file, ask_user, read_file, remember\n" in err
    assert f"instruction {SHOWN}\n" in err
    assert f"→ expected {SHOWN}\n" in err
    assert f"prompt {SHOWN}\n" in err
    assert r" tool_result a delete_file the path 'del<\x1b]52;c;SGVsbG8=\x07|" in err
    assert f"step a wants to call remember\nfact: fact {SHOWN}\n" in err
    assert f"an agent asks: ask{SHOWN}\n" in err
    assert r" tool_result a read_file the path 'r<\x1b]52;c;SGVsbG8=\x07|" in err

    run_id = json.loads(mp("runs", "list", "--json").stdout)[0]["run_id"]
    shown_run = mp("runs", "show", run_id)
    _assert_clean(shown_run.stdout + shown_run.stderr)
    assert f"run {run_id} · succeeded · task {SHOWN}\n" in shown_run.stdout
    assert shown_run.stdout.endswith(f"output {SHOWN}\nline 2\tend\n")

    feedback = mp("feedback", run_id, "--rating", "1", "--model", f"scripted:{script}")
    assert feedback.returncode == 0, feedback.stderr
    _assert_clean(feedback.stdout + feedback.stderr)
    agent_id = json.loads(mp("agents", "list", "--json").stdout)[0]["id"]
    lesson = "Quote quantities precisely " + SHOWN.replace("\\r>", " >")  # lessons fold white space
    assert f"lesson for {agent_id}: {lesson}\n" in feedback.stderr

    agent = mp("agents", "show", agent_id)
    _assert_clean(agent.stdout + agent.stderr)
    assert f"role {ROLE_SHOWN}   tools" in agent.stdout
    assert f"\nprompt {SHOWN}\n" in agent.stdout
    assert f"\nlesson {lesson}\n" in agent.stdout

    for listing in (
        ["runs", "list"],
        ["agents", "list"],
        ["agents", "search", "role"],
        ["cohorts", "list"],
        ["cohorts", "show", run_id],
        ["memory", "list"],
    ):
        listed = mp(*listing)
        assert listed.returncode == 0, (listing, listed.stderr)
        _assert_clean(listed.stdout + listed.stderr)
    memories = mp("memory", "list").stdout
    assert r"fact <\x1b]52;c;SGVsbG8=\x07|\x1b]0;pwned\x07|\x1b[2J|\x9b31m|[bold red]red[/]|" in memories

    as_json = mp("runs", "show", run_id, "--json")
    assert as_json.stdout.isascii()
    _assert_clean(as_json.stdout)
    report = json.loads(as_json.stdout)
    assert report["output"] == "output " + PAYLOAD + "\nline 2\tend"
    assert report["plan"]["steps"][0]["title"] == "title " + PAYLOAD


def test_chat_and_plan_print_model_text_visibly(write_script: Callable[..., Path]) -> None:
    chat_script = write_script([{"purpose": "chat", "output": PAYLOAD + "\n\tsecond line"}])
    chat = mp("chat", "hi", "--model", f"scripted:{chat_script}")
    assert chat.returncode == 0, chat.stderr
    _assert_clean(chat.stdout + chat.stderr)
    assert chat.stdout == SHOWN + "\n\tsecond line\n"
    chat_json = mp("chat", "hi", "--model", f"scripted:{chat_script}", "--json")
    assert chat_json.stdout.isascii()
    assert json.loads(chat_json.stdout)["output"] == PAYLOAD + "\n\tsecond line"

    step = {"id": "a", "title": PAYLOAD, "instruction": PAYLOAD, "agent_role": ROLE, "tools": []}
    plan_script = write_script([{"purpose": "planner", "output": {"steps": [step]}}])
    plan = mp("plan", "plan " + PAYLOAD, "--model", f"scripted:{plan_script}")
    assert plan.returncode == 0, plan.stderr
    _assert_clean(plan.stdout + plan.stderr)
    assert plan.stdout.splitlines()[:2] == [f"plan {SHOWN}", f"└── a {SHOWN} (starts at once)"]


def test_error_lines_are_one_sanitised_line(write_script: Callable[..., Path]) -> None:
    # a planner that keeps proposing an invalid plan: the error quotes the model's step ids
    bad = {"id": "x\x1b]0;pwned\x07[/]", "title": "t", "instruction": "i", "agent_role": "r", "tools": []}
    script = write_script([{"purpose": "planner", "output": {"steps": [bad, bad]}, "repeat": True}])
    result = mp("plan", "t", "--model", f"scripted:{script}")
    assert result.returncode == 2
    _assert_clean(result.stderr)
    [line] = result.stderr.splitlines()
    assert line.startswith("error: no valid plan after 2 repairs: ")
    assert r"x\x1b]0;pwned\x07[/]" in line

    tools = mp("plan", "t", "--model", f"scripted:{script}", "--tools", "[/]\x1b]0;pwned\x07\nsecond")
    assert tools.returncode == 2
    assert tools.stderr.startswith(r"error: --tools: unknown tools: [/]\x1b]0;pwned\x07\nsecond; available: ")
    assert len(tools.stderr.splitlines()) == 1
    assert "Traceback" not in tools.stderr

    debug = mp("--debug", "plan", "t", "--model", f"scripted:{script}", "--tools", "\x1b]0;pwned\x07")
    assert debug.returncode == 2
    _assert_clean(debug.stderr)
    assert "Traceback (most recent call last):" in debug.stderr
    assert debug.stderr.splitlines()[-1].startswith(r"error: --tools: unknown tools: \x1b]0;pwned\x07;")
