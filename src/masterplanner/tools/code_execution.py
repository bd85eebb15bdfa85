"""`code_execution`: run Python, bash or JavaScript in the sandbox, in the run's workspace."""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from ..errors import ToolError
from ..sandbox import SandboxLimits, SandboxResult, run_in_sandbox
from .workspace import Workspace

__all__ = ["INTERPRETERS", "MAX_CODE_CHARS", "Language", "execute_code", "format_result"]

Language = Literal["python", "bash", "javascript"]
INTERPRETERS: dict[str, list[str]] = {
    "python": ["/usr/bin/python3", "-I", "-c"],
    "bash": ["/usr/bin/bash", "-c"],
    "javascript": ["/usr/bin/node", "-e"],
}
"""System interpreters: the sandbox user cannot read the invoking user's home (pyenv, venvs)."""
MAX_CODE_CHARS = 100_000
MAX_TIMEOUT_S = 120


async def execute_code(
    workspace: Workspace,
    language: str,
    code: str,
    stdin: str = "",
    timeout_s: float = 30,
    limits: SandboxLimits | None = None,
) -> SandboxResult:
    """Run `code` sandboxed with the workspace as its working directory; `ToolError` for bad arguments."""
    if language not in INTERPRETERS:
        raise ToolError(f"language must be one of {', '.join(INTERPRETERS)}, got {language!r}")
    if not code.strip():
        raise ToolError("code is empty")
    if len(code) > MAX_CODE_CHARS:
        raise ToolError(f"code is {len(code):,} characters; the limit is {MAX_CODE_CHARS:,}")
    if not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise ToolError(f"timeout_s must be between 0 and {MAX_TIMEOUT_S}, got {timeout_s:g}")
    base = limits or SandboxLimits()
    argv = [*INTERPRETERS[language], code]
    return await run_in_sandbox(argv, workspace.root, stdin=stdin, limits=replace(base, wall_s=timeout_s))


def format_result(result: SandboxResult) -> str:
    """The tool's answer to the agent: exit code, stdout, stderr, with truncation marked."""
    lines = [f"exit code {result.exit_code}" + (" (killed: timed out)" if result.timed_out else "")]
    for name, text, cut in (
        ("stdout", result.stdout, result.stdout_truncated),
        ("stderr", result.stderr, result.stderr_truncated),
    ):
        if text or cut:
            lines.append(f"--- {name}{' (truncated)' if cut else ''} ---\n{text.rstrip()}")
    return "\n".join(lines)
