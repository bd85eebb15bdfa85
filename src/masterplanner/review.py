"""Review: the plan and prompts as a person edits them (YAML), and turning an edit back into a plan.

Front ends (the CLI now, the web UI later) show the plan, let the person edit it, and submit a
decision; this module holds what they share. An edit is parsed and validated as a whole: any
problem is reported with what and where (YAML line, step and field), and nothing is applied.
`edit_in_editor` opens the person's own editor on such a text; an editor that fails, removes the
file or saves something that is not UTF-8 text is a `ConfigError` naming the editor and the
problem, never a half-read edit.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import NUL_PROBLEM, ConfigError, PlanError
from .plan import Plan, validate_plan
from .tools import Catalog

__all__ = [
    "ERROR_MARK",
    "FRESH",
    "POLICIES",
    "ReviewEdit",
    "critique_note",
    "edit_in_editor",
    "editor_command",
    "parse_review_yaml",
    "render_review_yaml",
    "reused_agent_origin",
    "with_errors_on_top",
]

POLICIES = ("auto", "ask", "deny")

ERROR_MARK = "# ERROR: "
"""How validation errors are written at the top of a reopened edit (YAML comments, so ignored)."""

_HEADER = (
    "# Edit the plan and each step's prompt, then save and close the editor.\n"
    "# Remove a step by deleting it; dependencies name step ids. Lines starting with # are ignored.\n"
    "# tool_policies (for the whole run, or in a step for its agent) map a tool to auto, ask or deny.\n"
    "# A step reusing a stored agent says so in `agent`; set it to `fresh` to have a new prompt written.\n"
    "# `expand: true` on a step has it planned as a sub-plan of its own when it is ready to run.\n"
    "# The task is the run's and stays as it is. Close the editor without saving to give up the edit.\n"
)
FRESH = "fresh"
"""What a person writes in a step's `agent` to replace a reused agent with a newly written one."""


def reused_agent_origin(agent: dict[str, Any]) -> str:
    """A reused agent's id, its run and whether a person wrote its prompt, as the web review words them.

    "ID from run R, its prompt written by a person": the run is left out when unknown, the person
    when the prompt is theirs only because they edited it in this review (it is then marked edited).
    """
    origin = str(agent.get("agent_id") or "")
    if agent.get("reused_from"):
        origin += f" from run {agent['reused_from']}"
    if agent.get("prompt_by_person") and not agent.get("edited"):
        origin += ", its prompt written by a person"
    return origin


def critique_note(critique: dict[str, Any]) -> str:
    """The critic's scores as the reviews say them, with what they are of.

    The critique is of the text the last revision replaced (the draft, after one round), not of
    the prompt shown: shown as "critic: …" beside the prompt, the scores read as the prompt's.
    """
    return (
        f"the critic scored the version before this revision: clarity {critique['clarity']}, "
        f"completeness {critique['completeness']}, tool fit {critique['tool_fit']}, "
        f"output {critique['output_format']}"
    )


@dataclass(frozen=True)
class ReviewEdit:
    """What an edit says: the plan, the agents map (prompts, per-agent tool policies), run-wide policies."""

    plan: Plan
    agents: dict[str, Any]
    tool_policies: dict[str, str] = field(default_factory=dict)


_STEP_KEYS = ("id", "title", "agent_role", "tools", "depends_on", "instruction", "expected_output")


class _Dumper(yaml.SafeDumper):
    """Writes multi-line strings as literal blocks, so prompts stay readable and editable."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render_review_yaml(
    plan: Plan, agents: dict[str, Any] | None = None, tool_policies: dict[str, str] | None = None
) -> str:
    """The YAML a person edits: the task, run-wide tool policies, and every step with its prompt."""
    steps = []
    for step in plan.steps:
        data = step.model_dump(mode="json")
        entry = {key: data[key] for key in _STEP_KEYS}
        if step.expand:
            entry["expand"] = True
        agent = (agents or {}).get(step.id) or {}
        if agent.get("agent_id") and agent.get("reused_from") is not None:
            entry["agent"] = f"reused {reused_agent_origin(agent)}"
        prompt = agent.get("prompt")
        if prompt:
            entry["prompt"] = prompt.rstrip() + "\n" if "\n" in prompt else prompt
        if agent.get("tool_policies"):
            entry["tool_policies"] = dict(agent["tool_policies"])
        steps.append(entry)
    document: dict[str, Any] = {"task": plan.task}
    if plan.final_step:
        document["final_step"] = plan.final_step
    document["tool_policies"] = dict(tool_policies or {})
    document["steps"] = steps
    body = yaml.dump(document, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)
    return _HEADER + body


def with_errors_on_top(text: str, error: PlanError) -> str:
    """`text` with earlier error lines removed and `error`'s problems written at the top."""
    kept = [line for line in text.splitlines() if not line.startswith(ERROR_MARK)]
    marks = [f"{ERROR_MARK}{problem}" for problem in error.problems]
    return "\n".join([*marks, *kept]) + "\n"


def _policies(raw: object, catalog: Catalog, where: str, problems: list[str]) -> dict[str, str]:
    """`raw` as tool policies; what is wrong with it goes to `problems` (then nothing is taken)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.append(f"{where}: tool_policies must map tool names to auto, ask or deny")
        return {}
    found = [
        f"{where}: tool_policies: {tool!r} is not a tool of this run"
        for tool in raw
        if not _policy_tool(tool, catalog)
    ] + [
        f"{where}: tool_policies: {tool} must be auto, ask or deny, got {value!r}"
        for tool, value in raw.items()
        if value not in POLICIES
    ]
    problems.extend(found)
    return {} if found else {str(tool): str(value) for tool, value in raw.items()}


def _policy_tool(name: object, catalog: Catalog) -> bool:
    """Whether `name` may have a policy: a tool of the run, or one configured but missing here.

    A run keeps the policies configured for tools it cannot offer on this machine (`web_search`
    without a backend, the tools of an MCP server that would not start): the review shows them
    as they are, and saving the document unchanged must not refuse them.
    """
    if not isinstance(name, str):
        return False
    from .engine.catalogs import RunCatalog
    from .tools.mcp_names import names_server_tool

    if name in catalog:
        return True
    if not isinstance(catalog, RunCatalog):
        return False
    return name in catalog.missing or names_server_tool(name, catalog.mcp_servers)


@dataclass
class _AgentEdits:
    """What the steps of an edit say about their agents, taken out of the plan's steps."""

    policies: dict[str, dict[str, str]] = field(default_factory=dict)
    prompts: dict[str, str] = field(default_factory=dict)
    fresh: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)

    def take(self, step: object, catalog: Catalog) -> object:
        """`step` without its `agent`, `tool_policies` and `prompt` keys, which are recorded here.

        What is wrong with them is added to `problems`, so that one edit's problems are all named at once.
        """
        if not isinstance(step, dict):
            return step
        step = dict(step)
        where = f"step {step.get('id')}"
        if "agent" in step:
            choice = step.pop("agent")
            if isinstance(choice, str) and choice.strip().lower() == FRESH:
                self.fresh.add(str(step.get("id")))
            elif not (isinstance(choice, str) and choice.startswith("reused ")):
                self.problems.append(f"{where}: agent must be left as it is or set to {FRESH!r}")
        if "tool_policies" in step:
            policies = _policies(step.pop("tool_policies"), catalog, where, self.problems)
            self.policies[str(step.get("id"))] = policies
        if "prompt" in step:
            prompt = step.pop("prompt")
            if isinstance(step.get("id"), str):
                if not isinstance(prompt, str) or not prompt.strip():
                    self.problems.append(f"{where}: prompt must be non-empty text")
                elif "\x00" in prompt:  # a YAML "\0"
                    self.problems.append(f"{where}: prompt: {NUL_PROBLEM}")
                else:
                    self.prompts[step["id"]] = prompt
        return step

    def agent(self, step_id: str, before: dict[str, Any]) -> dict[str, Any]:
        """The step's agent entry after the edit."""
        prompt = self.prompts.get(step_id)
        edited = prompt is not None and prompt.strip() != str(before.get("prompt", "")).strip()
        if step_id in self.fresh:
            # the reused agent goes: the person's own prompt if they wrote one, else a new one
            after: dict[str, Any] = {"prompt": prompt, "edited": True} if edited else {"fresh": True}
        elif edited:
            after = {**before, "prompt": prompt, "edited": True}
        else:
            after = dict(before)
        after.pop("tool_policies", None)
        if self.policies.get(step_id):
            after["tool_policies"] = self.policies[step_id]
        return after


def _load_yaml(text: str) -> dict[str, Any]:
    try:
        document = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "somewhere"
        raise PlanError(
            [f"the edit is not valid YAML at {where}: {exc.problem}"], context="invalid edit"
        ) from None
    except yaml.YAMLError as exc:
        raise PlanError([f"the edit is not valid YAML: {exc}"], context="invalid edit") from None
    if not isinstance(document, dict):
        raise PlanError(["the edit must be a mapping with 'task' and 'steps'"], context="invalid edit")
    return document


def parse_review_yaml(
    text: str, catalog: Catalog, agents: dict[str, Any] | None = None, *, task: str | None = None
) -> ReviewEdit:
    """Read an edited review back: the validated plan, the agents map, the run-wide tool policies.

    Raises `PlanError` naming every problem at once; the plan and prompts given are never changed.
    `task`: the run's, which the edit must keep (`validate_plan`); an edit without a `task` keeps
    it, as the edit's header says.
    """
    document = _load_yaml(text)
    if task is not None and "task" not in document:
        document["task"] = task
    edits = _AgentEdits()
    run_policies = _policies(document.pop("tool_policies", None), catalog, "the run", edits.problems)
    if isinstance(document.get("steps"), list):
        document = {**document, "steps": [edits.take(step, catalog) for step in document["steps"]]}
    try:
        plan = validate_plan(document, catalog, task=task)
    except PlanError as exc:
        raise PlanError([*edits.problems, *exc.problems], context="invalid edit") from None
    if edits.problems:
        raise PlanError(edits.problems, context="invalid edit")
    new_agents: dict[str, Any] = {}
    for step in plan.steps:
        after = edits.agent(step.id, dict((agents or {}).get(step.id) or {}))
        if after:
            new_agents[step.id] = after
    return ReviewEdit(plan, new_agents, run_policies)


EDIT_LIMIT_BYTES = 4 * 1024 * 1024
"""The most an edit may hold; an editor that saves more is refused (a plan is far smaller)."""


def editor_command() -> str:
    """The person's editor: `$VISUAL`, then `$EDITOR` (as git and click read them), else a common one."""
    for variable in ("VISUAL", "EDITOR"):
        command = os.environ.get(variable, "").strip()
        if command:
            return command
    for name in ("sensible-editor", "vim", "nano"):
        if shutil.which(name):
            return name
    return "vi"


def _editor_status(editor: str, returncode: int) -> str | None:
    if returncode == 0:
        return None
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"the editor {editor!r} was stopped by {name}"
    return f"the editor {editor!r} exited with status {returncode}"


def _read_back(editor: str, path: Path) -> str:
    try:
        with path.open("rb") as saved:
            data = saved.read(EDIT_LIMIT_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"the editor {editor!r} removed the file it was editing") from None
    except OSError as exc:
        raise ConfigError(
            f"the editor {editor!r} left a file that cannot be read: {exc.strerror or exc}"
        ) from None
    if len(data) > EDIT_LIMIT_BYTES:
        raise ConfigError(f"the editor {editor!r} saved more than {EDIT_LIMIT_BYTES // 1024 // 1024} MiB")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"the editor {editor!r} saved text that is not UTF-8 "
            f"(byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None
    return text.replace("\r\n", "\n")


def edit_in_editor(text: str, *, extension: str = ".yaml", editor: str | None = None) -> str:
    """Open `text` in the person's editor (`editor_command()` unless given) and return what they saved.

    The text is written to a private temporary file, removed afterwards. Raises `ConfigError`
    naming the editor and what went wrong: it is not a command line, cannot be started, exited
    with a non-zero status or was killed, removed the file, or saved bytes that are not UTF-8.
    """
    command = editor or editor_command()
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise ConfigError(f"the editor {command!r} is not a command line: {exc}") from None
    if not argv:
        raise ConfigError("the editor setting ($VISUAL or $EDITOR) is empty")
    with tempfile.TemporaryDirectory(prefix="masterplanner-edit-", ignore_cleanup_errors=True) as folder:
        path = Path(folder) / f"edit{extension}"
        # private, like the folder: a plan and its prompts are the person's business
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as draft:
            draft.write(text if text.endswith("\n") else text + "\n")
        try:
            returncode = subprocess.run([*argv, str(path)], check=False).returncode
        except OSError as exc:
            raise ConfigError(f"the editor {command!r} could not be started: {exc.strerror or exc}") from None
        problem = _editor_status(command, returncode)
        if problem is not None:
            raise ConfigError(problem)
        return _read_back(command, path)
