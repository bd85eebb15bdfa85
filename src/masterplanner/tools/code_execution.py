"""`code_execution`: run Python, bash, JavaScript or SQL in the sandbox, in the run's workspace.

SQL is one SQLite query over the workspace's CSV files, each a table (`sql_runner.py`, which runs
in the sandbox under the system Python like a Python program).
"""

from __future__ import annotations

from dataclasses import replace
from importlib.resources import files
from pathlib import PurePosixPath
from typing import Literal

from ..errors import ToolError
from ..redaction import without_cut_secret
from ..sandbox import SandboxLimits, SandboxResult, run_in_sandbox
from .protected import protected_component, protection_notice
from .workspace import Workspace, invalid_text

__all__ = ["INTERPRETERS", "MAX_CODE_CHARS", "Language", "execute_code", "format_result", "succeeded_output"]

Language = Literal["python", "bash", "javascript", "sql"]
INTERPRETERS: dict[str, list[str]] = {
    "python": ["/usr/bin/python3", "-I", "-c"],
    "bash": ["/usr/bin/bash", "-c"],
    "javascript": ["/usr/bin/node", "-e"],
    "sql": ["/usr/bin/python3", "-I", "-c", files(__package__).joinpath("sql_runner.py").read_text()],
}
"""System interpreters: the sandbox user cannot read the invoking user's home (pyenv, venvs).
The code is the last argument: the program itself, or for `sql` the query its runner takes."""
MAX_CODE_CHARS = 100_000
MAX_TIMEOUT_S = 120


async def execute_code(
    workspace: Workspace,
    language: str,
    code: str,
    stdin: str = "",
    timeout_s: float = 30,
    limits: SandboxLimits | None = None,
    max_growth_bytes: int | None = None,
) -> SandboxResult:
    """Run `code` sandboxed with the workspace as its working directory; `ToolError` for bad arguments.

    `max_growth_bytes` is how much the workspace may still grow (what is left of the run's
    allowance; the result's `workspace_growth_bytes` is what this execution used of it).
    """
    if language not in INTERPRETERS:
        raise ToolError(f"language must be one of {', '.join(INTERPRETERS)}, got {language!r}")
    if not code.strip():
        raise ToolError("code is empty")
    if len(code) > MAX_CODE_CHARS:
        raise ToolError(f"code is {len(code):,} characters; the limit is {MAX_CODE_CHARS:,}")
    if not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise ToolError(f"timeout_s must be between 0 and {MAX_TIMEOUT_S}, got {timeout_s:g}")
    for name, text in (("code", code), ("stdin", stdin)):  # neither can be handed to a process
        if "\x00" in text:
            where = text.index("\x00")
            raise ToolError(f"{name} holds a NUL character at character {where:,}, which no program takes")
        invalid = invalid_text(text)
        if invalid is not None:
            raise ToolError(f"{name} has {invalid}, which is not valid text")
    base = replace(limits or SandboxLimits(), wall_s=timeout_s)
    if max_growth_bytes is not None:
        base = replace(base, max_growth_bytes=max(0, max_growth_bytes))
    argv = [*INTERPRETERS[language], code]
    unreadable = workspace.settings_identities()  # hard links to them, whatever their names
    return await run_in_sandbox(argv, workspace.root, stdin=stdin, limits=base, unreadable=unreadable)


def format_result(result: SandboxResult) -> str:
    """The tool's answer to the agent: exit code, why it was killed, what was removed, the output."""
    killed = result.killed or ("timed out" if result.timed_out else None)
    lines = [f"exit code {result.exit_code}" + (f" (killed: {killed})" if killed else "")]
    for path in result.removed:
        name = protected_component(PurePosixPath(path).parts) or path
        lines.append(f"removed {path}: {protection_notice(name)}")
    for name, text, cut in (
        ("stdout", result.stdout, result.stdout_truncated),
        ("stderr", result.stderr, result.stderr_truncated),
    ):
        if cut:  # a secret the cap fell inside keeps no part of itself short of its shape
            text = without_cut_secret(text)
        if text or cut:
            lines.append(f"--- {name}{' (truncated)' if cut else ''} ---\n{text.rstrip()}")
    return "\n".join(lines)


def succeeded_output(answer: str) -> str | None:
    """The standard output in a `format_result` answer of a program that exited 0.

    None for any other answer, and when the output was cut short (truncated).
    """
    if not answer.startswith("exit code 0\n") and answer != "exit code 0":
        return None
    if "\n--- stdout (truncated) ---\n" in answer:
        return None
    _, found, out = answer.partition("--- stdout ---\n")
    return out.split("\n--- stderr", 1)[0].strip() if found else ""
