"""The checks of `eval tasks`: what a run left in its workspace, and whether its plan makes sense.

File checks are declared in the suite, one single-key object each (paths are relative to the
task's workspace; words match whole words, case-insensitively):

| check | passes when |
| --- | --- |
| `{"exists": PATH}` | PATH is a regular file holding more than white space |
| `{"lines": {"path", "min", "max"}}` | its count of non-blank lines is within `min`..`max` (`max` optional) |
| `{"max_chars": {"path", "max"}}` | its text, trimmed, is at most `max` characters |
| `{"mentions": {"path", "any": [WORD, …]}}` | it holds at least one of the words |
| `{"not_mentions": {"path", "any": [WORD, …]}}` | it holds none of them |
| `{"equals_number": {"path", "value", "tol"}}` | a number written in it is within `tol` of `value` |
| `{"differs": {"path", "from": PATH}}` | its text differs from the other file's (case and spacing aside) |
| `{"runs": PATH}` | the script (`.py`, `.sh`, `.js`) exits 0 in the sandbox, within 30 s |

Checks run in order, so a `runs` check can make a file that a later check reads.

Plan checks apply to every task (the issue's "no plan field is debris"): the plan is valid; each
role is 1-3 words of letters; titles are at most 60 characters and distinct; no two steps share
an instruction; there are at most one step more than the task has actions (its clauses,
`plan_structure.clauses`); and, where the task says a step uses another's result, at least one
step depends on another. The workspace is what model-written code left: it is read through
`Workspace`, which follows no symlink and reads only regular files.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import ConfigError, PlanError, SandboxError, ToolError, validation_problems
from ..plan import validate_plan
from ..plan_structure import clauses
from ..tools.workspace import Workspace
from ..usage import counted

__all__ = ["CHECK_KINDS", "Check", "CheckResult", "check_file", "parse_check", "plan_checks"]

CHECK_KINDS = ("exists", "lines", "max_chars", "mentions", "not_mentions", "equals_number", "differs", "runs")
MAX_TITLE_CHARS = 60
RUN_TIMEOUT_S = 30.0
_ROLE = re.compile(r"[A-Za-z]+(?:-[A-Za-z]+)*(?: [A-Za-z]+(?:-[A-Za-z]+)*){0,2}")
_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w])")
_INTERPRETERS = {".py": "/usr/bin/python3 -I", ".sh": "/usr/bin/bash", ".js": "/usr/bin/node"}


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    path: str = Field(min_length=1)


class _Lines(_Spec):
    min: int = Field(0, ge=0)
    max: int | None = Field(None, ge=0)


class _MaxChars(_Spec):
    max: int = Field(ge=0)


class _Words(_Spec):
    any: list[str] = Field(min_length=1)


class _Number(_Spec):
    value: float
    tol: float = Field(0.0, ge=0)


class _Differs(_Spec):
    source: str = Field(alias="from", min_length=1)


_SPECS: dict[str, type[_Spec]] = {
    "lines": _Lines,
    "max_chars": _MaxChars,
    "mentions": _Words,
    "not_mentions": _Words,
    "equals_number": _Number,
    "differs": _Differs,
}


@dataclass(frozen=True)
class Check:
    """One declared file check: its kind, the file it reads, and its other arguments."""

    kind: str
    path: str
    args: dict[str, Any]

    @property
    def name(self) -> str:
        """`kind path`, as reports show it."""
        return f"{self.kind} {self.path}"


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check: `kind` groups results across tasks, `name` says which one it was."""

    kind: str
    name: str
    ok: bool
    detail: str = ""

    def to_json_dict(self) -> dict[str, Any]:
        """`{"kind", "check", "ok", "detail"}`."""
        return {"kind": self.kind, "check": self.name, "ok": self.ok, "detail": self.detail}


def parse_check(raw: object, where: str) -> Check:
    """A check from its JSON form (see the module docstring); `ConfigError` naming `where` if wrong."""
    if not isinstance(raw, dict) or len(raw) != 1:
        raise ConfigError(f"{where}: a check is an object with one key, one of {', '.join(CHECK_KINDS)}")
    ((kind, value),) = raw.items()
    if kind not in CHECK_KINDS:
        raise ConfigError(f"{where}: unknown check {kind!r}; known: {', '.join(CHECK_KINDS)}")
    if kind in ("exists", "runs"):
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{where}: {kind} takes a file path")
        return Check(kind, value, {})
    try:
        spec = _SPECS[kind].model_validate(value)
    except ValidationError as exc:
        problems = "; ".join(validation_problems(exc.errors(), whole=kind))
        raise ConfigError(f"{where}: {kind}: {problems}") from None
    args = spec.model_dump(exclude={"path"})
    return Check(kind, spec.path, args)


def _mentions(text: str, word: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(word.casefold())}(?!\w)", text.casefold()) is not None


def _numbers(text: str) -> list[float]:
    return [float(found.replace(",", "")) for found in _NUMBER.findall(text)]


def _normalized(text: str) -> str:
    return " ".join(text.casefold().split())


def _judge(check: Check, text: str, workspace: Workspace) -> tuple[bool, str]:
    """Whether `text` (the file's) passes `check`, and why not."""
    path, args = check.path, check.args
    if check.kind == "exists":
        return bool(text.strip()), f"{path} is empty"
    if check.kind == "lines":
        count = sum(1 for line in text.splitlines() if line.strip())
        high = args["max"]
        wanted = f"{args['min']} to {high}" if high is not None else f"at least {args['min']}"
        return args["min"] <= count <= (high if high is not None else count), (
            f"{path} has {counted(count, 'non-blank line')}; wanted {wanted}"
        )
    if check.kind == "max_chars":
        size = len(text.strip())
        return size <= args["max"], f"{path} has {size:,} characters; at most {args['max']:,} wanted"
    if check.kind in ("mentions", "not_mentions"):
        found = [word for word in args["any"] if _mentions(text, word)]
        if check.kind == "mentions":
            return bool(found), f"{path} mentions none of: {', '.join(args['any'])}"
        return not found, f"{path} mentions {', '.join(found)}"
    if check.kind == "equals_number":
        numbers = _numbers(text)
        close = [number for number in numbers if abs(number - args["value"]) <= args["tol"]]
        shown = ", ".join(f"{number:g}" for number in numbers[:5]) or "no number"
        return bool(close), f"{path} holds {shown}; wanted {args['value']:g} (± {args['tol']:g})"
    # differs
    try:
        source = workspace.read_file(args["source"])
    except ToolError as error:
        return False, f"cannot read {args['source']}: {error}"
    return _normalized(text) != _normalized(source), f"{path} is the same text as {args['source']}"


async def _runs(check: Check, workspace: Workspace) -> tuple[bool, str]:
    from ..tools.code_execution import execute_code

    suffix = "." + check.path.rsplit(".", 1)[-1] if "." in check.path else ""
    interpreter = _INTERPRETERS.get(suffix.lower())
    if interpreter is None:
        return False, f"{check.path}: no interpreter for {suffix or 'a file without an extension'}"
    command = f"{interpreter} {shlex.quote('./' + check.path)}"
    try:
        result = await execute_code(workspace, "bash", command, timeout_s=RUN_TIMEOUT_S)
    except (SandboxError, ToolError) as error:
        return False, f"{check.path} could not be run: {error}"
    if result.exit_code == 0 and not result.timed_out and not result.killed:
        return True, ""
    why = result.killed or ("timed out" if result.timed_out else f"exit code {result.exit_code}")
    tail = " ".join(result.stderr.split())[-200:]
    return False, f"{check.path}: {why}" + (f": {tail}" if tail else "")


async def check_file(check: Check, workspace: Workspace) -> CheckResult:
    """Run one file check against the workspace."""
    if check.kind == "runs":
        if not workspace.is_file(check.path):
            return CheckResult(check.kind, check.name, False, f"{check.path} does not exist")
        ok, detail = await _runs(check, workspace)
        return CheckResult(check.kind, check.name, ok, "" if ok else detail)
    try:
        text = workspace.read_file(check.path)
    except ToolError as error:
        return CheckResult(check.kind, check.name, False, str(error))
    ok, detail = _judge(check, text, workspace)
    return CheckResult(check.kind, check.name, ok, "" if ok else detail)


PlanCheckKind = Literal[
    "plan_valid", "plan_roles", "plan_titles", "plan_instructions", "plan_size", "plan_dependencies"
]


def _result(kind: PlanCheckKind, problems: list[str]) -> CheckResult:
    return CheckResult(kind, kind.replace("_", " "), not problems, "; ".join(problems))


def plan_checks(task: str, plan: dict[str, Any] | None, *, needs_dependency: bool) -> list[CheckResult]:
    """The plan checks every task gets (see the module docstring); only `plan valid` without a plan."""
    if plan is None:
        return [_result("plan_valid", ["the run has no plan"])]
    try:
        parsed = validate_plan(plan)
    except PlanError as error:
        return [_result("plan_valid", [str(error)])]
    steps = parsed.steps
    roles = [f"step {s.id}: role {s.agent_role!r}" for s in steps if not _ROLE.fullmatch(s.agent_role)]
    titles = [
        f"step {s.id}: title of {len(s.title)} characters" for s in steps if len(s.title) > MAX_TITLE_CHARS
    ]
    seen_titles: dict[str, str] = {}
    seen_instructions: dict[str, str] = {}
    same_instruction: list[str] = []
    for step in steps:
        title = _normalized(step.title)
        if title in seen_titles:
            titles.append(f"steps {seen_titles[title]} and {step.id}: the same title")
        seen_titles.setdefault(title, step.id)
        instruction = _normalized(step.instruction).rstrip(".!")
        if instruction in seen_instructions:
            same_instruction.append(f"steps {seen_instructions[instruction]} and {step.id}")
        seen_instructions.setdefault(instruction, step.id)
    actions = len(clauses(task))
    size = (
        [f"{counted(len(steps), 'step')} for {counted(actions, 'action')}"]
        if len(steps) > actions + 1
        else []
    )
    results = [
        _result("plan_valid", []),
        _result("plan_roles", roles),
        _result("plan_titles", titles),
        _result("plan_instructions", [f"{pair} share an instruction" for pair in same_instruction]),
        _result("plan_size", size),
    ]
    if needs_dependency:
        edges = sum(len(step.depends_on) for step in steps)
        results.append(_result("plan_dependencies", [] if edges else ["no step depends on another"]))
    return results
