"""The one exception hierarchy of masterplanner.

```
MasterplannerError                 anything masterplanner raises on purpose
├── ConfigError                    the user must change an input or setting (CLI exit code 2)
│   ├── SettingsError              a setting, TOML file or environment variable is invalid
│   ├── ModelSpecError             a model spec string has no known form
│   ├── MissingCredentialError     a provider needs an environment variable that is not set
│   ├── ToolNameClashError         two MCP servers' tools cannot be named apart in one catalog
│   ├── ModelFileError             a GGUF model file is missing or cannot be loaded
│   ├── ScriptError                a scripted-model file is missing or malformed, or a call
│   │                              lacks the text its script entry expects
│   └── SandboxError               the code sandbox cannot start here (it never runs code unconfined)
├── PlanError                      a plan (from a model, a file or an edit) is invalid (exit code 2)
├── ToolError                      a tool refused or failed a call (the agent is told; exit code 1)
├── RunError                       a run cannot be found, resumed, cancelled or stored (exit code 1)
│   ├── BudgetExceededError        a run went over its model-call, token or wall-time budget
│   ├── RunStoppedError            a run's execution stopped before its end could be recorded
│   │                              (its database failed): the run is left to resume
│   └── DatabaseError              the database failed a call (unwritable, full, locked): the
│       │                          API's 500, not a refusal
│       └── DatabaseUnavailableError  the Postgres server could not be reached (store calls
│                                  retry for a while before raising it)
├── RequestError                   a run's request does not exist, is closed, or the answer does
│                                  not fit it (exit code 2; nothing changes)
└── ModelError                     a model call failed at run time (CLI exit code 1)
    ├── ModelRetriesExhaustedError a model server kept failing in passing (rate limits, server
    │                              errors, no answer) until its tries ran out
    └── ScriptExhaustedError       the scripted model has no entry left for a call's purpose
```

Exceptions carry what went wrong in their message and never log: the caller decides what
the person sees. Messages never contain secret values, only the names of the variables that
hold them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from .remedies import FrontEnd, Remedy

__all__ = [
    "NUL_PROBLEM",
    "AgentEditError",
    "BudgetExceededError",
    "ConfigError",
    "DatabaseError",
    "DatabaseUnavailableError",
    "MasterplannerError",
    "MissingCredentialError",
    "ModelError",
    "ModelFileError",
    "ModelRetriesExhaustedError",
    "ModelSpecError",
    "NotFoundError",
    "PlanError",
    "RequestClosedError",
    "RequestError",
    "RunError",
    "RunNotFoundError",
    "RunStoppedError",
    "SandboxError",
    "ScriptError",
    "ScriptExhaustedError",
    "SettingsError",
    "ToolError",
    "ToolNameClashError",
    "json_kind",
    "known_fields",
    "no_nul",
    "nul_at",
    "nul_field",
    "nul_replaced",
    "problem_in_our_words",
    "quoted_id",
    "validation_problems",
]


class MasterplannerError(Exception):
    """Base class of every error masterplanner raises on purpose."""

    exit_code: ClassVar[int] = 1
    """The CLI's exit code for this error: 2 for usage and configuration, 1 for failures."""

    remedy: Remedy | None = None
    """What to do about it, if the error names it, as data: each front end says it in its own
    terms (`said`). `str()` says it as the CLI does."""

    def __init__(self, *args: object, remedy: Remedy | None = None) -> None:
        super().__init__(*args)
        if remedy is not None:
            self.remedy = remedy

    def said(self, front_end: FrontEnd = "cli", *, resumes: bool = True) -> str:
        """The message, and the remedy if any in `front_end`'s terms (`Remedy.said`)."""
        message = super().__str__()
        return message + (self.remedy.said(front_end, resumes=resumes) if self.remedy is not None else "")

    def __str__(self) -> str:
        return self.said()

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickle (DBOS stores a workflow's or step's exception so) rebuilds an exception by
        # calling its class with `args`, the message, which errors whose `__init__` takes other
        # fields refuse. Rebuilt without `__init__` instead, with the message and fields kept.
        return (_rebuilt, (type(self), self.args, dict(self.__dict__)))


def _rebuilt(
    cls: type[MasterplannerError], args: tuple[Any, ...], fields: dict[str, Any]
) -> MasterplannerError:
    """An error unpickled: its class, message and fields as they were raised."""
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(fields)
    return error


class ConfigError(MasterplannerError):
    """An input or setting is wrong; the person has to change it."""

    exit_code = 2


class SettingsError(ConfigError):
    """A setting, configuration file or environment variable holds an invalid value."""


class ModelSpecError(ConfigError):
    """A model spec string does not match any known form."""


class ToolNameClashError(ConfigError):
    """Two MCP servers' tools the catalog cannot name apart; `servers`: the one or two offering them."""

    def __init__(self, message: str, servers: tuple[str, ...]) -> None:
        super().__init__(message)
        self.servers = servers


class MissingCredentialError(ConfigError):
    """A provider needs an environment variable (an API key) that is not set.

    `what` names the setting's kind: a `model` (the default) or an `embedder`.
    """

    def __init__(self, variable: str, spec: str, *, what: str = "model") -> None:
        self.variable = variable
        self.spec = spec
        super().__init__(f"{what} {spec!r} needs the environment variable {variable}, which is not set")


class ModelFileError(ConfigError):
    """A GGUF model file is missing, unreadable or not a model llama.cpp can load."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"model file {path}: {reason}")


class ScriptError(ConfigError):
    """A scripted-model file is missing or malformed, or a call lacks a text its entry expects."""


class SandboxError(ConfigError):
    """The code sandbox cannot start on this machine; the message says why and how to fix it."""


class AgentEditError(ConfigError):
    """An edited agent is not a valid agent; `problems` lists each problem. Nothing was stored."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("the edit is not a valid agent, nothing changed: " + "; ".join(self.problems))


class PlanError(MasterplannerError):
    """A plan is invalid; `problems` lists each problem, naming the step it concerns."""

    exit_code = 2

    def __init__(self, problems: list[str], *, context: str = "invalid plan") -> None:
        self.problems = list(problems)
        super().__init__(f"{context}: " + "; ".join(self.problems))


class ToolError(MasterplannerError):
    """A tool refused a call (bad argument, path outside the workspace) or failed while running it."""


class RunError(MasterplannerError):
    """A run cannot be found, resumed, cancelled or stored."""


class NotFoundError(MasterplannerError):
    """An id names nothing: no such agent, team or memory (`RunNotFoundError`: no such run); the API's 404."""

    exit_code = 2


class RunNotFoundError(RunError, NotFoundError):
    """No run has the id given, or the id's start given is the start of several runs' ids."""

    exit_code = 2

    def __init__(self, message: str, *, ambiguous: bool = False, remedy: Remedy | None = None) -> None:
        super().__init__(message, remedy=remedy)
        self.ambiguous = ambiguous
        """Whether several runs' ids start so (give more of the id)."""


class BudgetExceededError(RunError):
    """A run used more model calls, tokens or wall time than its budget allows.

    `budget` names the run option that ran out (`max_model_calls`, `max_tokens`, `max_cost_usd`,
    `max_wall_s`), so a front end can name its own flag or field for it.
    """

    def __init__(self, message: str, *, budget: str | None = None) -> None:
        super().__init__(message)
        self.budget = budget


class RunStoppedError(RunError):
    """A run's execution stopped before the run's end could be recorded (its database failed).

    The run is left as it was, unfinished: `runs resume` goes on with it once the cause is gone.
    """


class DatabaseError(RunError):
    """The database failed a call (unwritable, full, locked, not a database): the server's failure.

    Not the run's state: the API answers it 500 where it answers a refusal 409 (`web.app`).
    """


class DatabaseUnavailableError(DatabaseError):
    """The database server could not be reached, or dropped the connection (it restarted)."""


class ModelError(MasterplannerError):
    """A model call failed while running."""


class ModelRetriesExhaustedError(ModelError):
    """A model server failed in passing (rate limit, server error, no answer) on every try."""


class ScriptExhaustedError(ModelError):
    """The scripted model was called for a purpose that has no entry left."""

    def __init__(self, purpose: str, script: str) -> None:
        self.purpose = purpose
        self.script = script
        super().__init__(
            f"scripted model {script}: no entry left for purpose {purpose!r} "
            f'(add an entry with that purpose, "repeat": true, or purpose "*")'
        )


class RequestError(MasterplannerError):
    """A request of a run cannot be answered: unknown, no longer open, or the answer does not fit it."""

    exit_code = 2


class RequestClosedError(RequestError):
    """A request that is answered, cancelled or expired takes no answer (the API's 409)."""


_SHAPES = {
    "string_type": "should be text",
    "list_type": "should be a list",
    "bool_type": "should be true or false",
    "bool_parsing": "should be true or false",
    "int_type": "should be a whole number",
    "int_parsing": "should be a whole number",
    "int_from_float": "should be a whole number",
    "float_type": "should be a number",
    "float_parsing": "should be a number",
    "missing": "is missing",
    "extra_forbidden": "unknown field",
}
_WHOLE_PROBLEMS = {
    "missing": _SHAPES["missing"],
    "extra_forbidden": _SHAPES["extra_forbidden"],
    # JSON text with a lone surrogate (`"\ud800"`)
    "string_unicode": "should be text, and it holds a character that is not one (a lone surrogate)",
}
"""The kinds of problem said the same whatever was given."""


_JSON_READER_PROBLEMS = (
    ("EOF while parsing", "the text ends before the JSON does"),
    ("expected ident", "a value was expected"),
    ("expected value", "a value was expected"),
    ("trailing characters", "more text follows the JSON value"),
    ("trailing comma", "a comma is followed by no value"),
    ("key must be a string", "a key in double quotes was expected"),
    ("expected `,` or `}`", "a comma or } was expected"),
    ("expected `,` or `]`", "a comma or ] was expected"),
    ("expected `:`", "a colon was expected"),
    ("control character", "a string holds a control character (write it as an escape)"),
    ("invalid escape", "a string holds an escape JSON does not have"),
    ("invalid number", "a number is not written as JSON writes numbers"),
    ("number out of range", "a number is too large"),
)
"""pydantic's JSON reader's words for text that is not JSON (`expected ident`), and ours."""
_JSON_READER_PLACE = re.compile(r"^(?P<why>.*?) at line (?P<line>\d+) column (?P<column>\d+)$")


def _not_json(item: Any) -> str:
    """Where and why text given as JSON is not JSON, from a `json_invalid` problem.

    The reader's own words ("expected ident at line 1 column 2") reached people as they were.
    """
    error = str((item.get("ctx") or {}).get("error", ""))
    place = _JSON_READER_PLACE.match(error)
    why = place["why"] if place else error
    words = next((ours for theirs, ours in _JSON_READER_PROBLEMS if why.startswith(theirs)), None)
    words = words or "not valid JSON here"
    where = f"line {place['line']}, column {place['column']}: " if place else ""
    return f"is not valid JSON ({where}{words})"


def validation_problems(errors: Iterable[Any], *, whole: str, model: Any = None) -> list[str]:
    """Each problem of a pydantic `ValidationError` (its `errors()`) as `field: what is wrong`.

    In our words (`problem_in_our_words`); `whole` names where a problem with no field is (`file`).
    With the `model` validated, an unknown field is said with the fields known where it is.
    """
    problems = []
    for item in errors:
        problem = problem_in_our_words(item)
        known = known_fields(model, item["loc"][:-1]) if item["type"] == "extra_forbidden" else None
        if known:
            problem += f"; known: {', '.join(known)}"
        problems.append(f"{'.'.join(str(part) for part in item['loc']) or whole}: {problem}")
    return problems


def known_fields(model: Any, loc: Iterable[int | str]) -> list[str] | None:
    """The fields of the pydantic model at `loc` inside `model` (a model class), or None if none is there.

    `loc` is a problem's place (`agents.asker`): fields by name, a table's entries by key and a
    list's by index. Before, `agents.asker.system_prompt: unknown field` named no field it takes.
    """
    from typing import Union, get_args, get_origin

    shape = model
    for part in loc:
        if get_origin(shape) in (Union, type(int | None)):
            shape = next((arg for arg in get_args(shape) if arg is not type(None)), None)
        if isinstance(getattr(shape, "model_fields", None), dict) and str(part) in shape.model_fields:
            shape = shape.model_fields[str(part)].annotation
        elif get_origin(shape) is dict:
            shape = get_args(shape)[1]
        elif get_origin(shape) is list:
            shape = get_args(shape)[0]
        else:
            return None
    if get_origin(shape) in (Union, type(int | None)):
        shape = next((arg for arg in get_args(shape) if arg is not type(None)), None)
    fields = getattr(shape, "model_fields", None)
    return sorted(fields) if isinstance(fields, dict) else None


ID_SHOWN_CHARS = 40
"""How much of an id given from outside (a URL's, a command line's) an error message repeats."""


def quoted_id(value: str) -> str:
    """An id given from outside, quoted for a message, cut to its first 40 characters and `…`.

    Before, `GET /api/v1/runs/<5,000 characters>` repeated all of them in its 404.
    """
    return repr(value if len(value) <= ID_SHOWN_CHARS else value[:ID_SHOWN_CHARS] + "…")


def problem_in_our_words(item: Any, *, what: str | None = None) -> str:
    """One problem of a pydantic `ValidationError` (an item of `errors()`) in our words.

    The common kinds are worded here; pydantic's own message stays only for the rare ones.
    `what` names the object a wrong-typed value should have been (`a step`).
    """
    kind, value = item["type"], item.get("input")
    limit = (item.get("ctx") or {}).get("min_length") or (item.get("ctx") or {}).get("max_length")
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        shape = f"an object with the fields of {what}" if what else "a JSON object"
        return f"should be {shape}, got {json_kind(value)}"
    if kind == "path_type":  # pydantic: "Input is not a valid path for <class 'pathlib.Path'>"
        return f"should be a path (text), got {json_kind(value)}"
    if kind == "json_invalid" and (item.get("ctx") or {}).get("error"):
        return _not_json(item)
    if kind in _WHOLE_PROBLEMS:
        return _WHOLE_PROBLEMS[kind]
    if kind in _SHAPES:
        return f"{_SHAPES[kind]}, got {_given(kind, value)}"
    # (each of the bounded kinds needs its bound: items made without context, as pydantic-ai makes
    # a retry's, are said in pydantic's message, which has it)
    if kind == "string_too_short" and limit is not None:
        return "must not be empty" if limit == 1 else f"should have at least {limit} characters"
    if kind == "string_too_long" and isinstance(value, str) and limit is not None:
        return f"is {len(value):,} characters; the limit is {limit:,}"
    if kind == "too_short" and limit is not None:
        return "must not be empty" if limit == 1 else f"should have at least {limit} items"
    if kind == "too_long" and limit is not None and "actual_length" in (item.get("ctx") or {}):
        return f"has {(item.get('ctx') or {}).get('actual_length')} items; the limit is {limit}"
    if kind == "value_error":
        return str(item["msg"]).removeprefix("Value error, ")
    if kind == "literal_error" and "expected" in (item.get("ctx") or {}):
        shown = repr(value) if isinstance(value, str) else json_kind(value)
        return f"should be {item['ctx']['expected']}, got {shown}"
    bounds = item.get("ctx") or {}
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        if isinstance(value, float) and value != value:  # NaN passes no comparison
            return "must be a number, got NaN"
        sign = {"greater_than": "more than", "greater_than_equal": "at least"}
        sign |= {"less_than": "less than", "less_than_equal": "at most"}
        bound = next(iter(bounds.values()), None)
        if isinstance(bound, int | float):
            return f"must be {sign[kind]} {_number(bound)}, got {_number(value)}"
    message = str(item["msg"])
    return message[:1].lower() + message[1:]


def _given(kind: str, value: Any) -> str:
    """What was given instead: its kind, or text that did not parse (an environment variable's) as written."""
    if kind.endswith("_parsing") and isinstance(value, str):
        return repr(_number(value))
    return _number(value) if kind == "int_from_float" else json_kind(value)


def _number(value: Any) -> str:
    """A number as a person writes it (`86,400`, `0.5`); text (a query's) as it was written."""
    if isinstance(value, str):
        return value if len(value) <= 40 else value[:39] + "…"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return repr(value)
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        value = int(value)  # beyond that a float's digits are not the ones written (1e308)
    if isinstance(value, int) and value.bit_length() > 100:  # past 30 digits: how long, not each digit
        digits = int(value.bit_length() * math.log10(2)) + 1  # str() of such an int may be refused
        return f"a number of about {digits:,} digits"
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def json_kind(value: Any) -> str:
    """What kind of JSON value `value` is, as a person would say it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, (str, bytes)):  # bytes: a body sent as something other than JSON
        return "text"
    if isinstance(value, (list, tuple)):
        return "a list"
    return "an object"


NUL_PROBLEM = "must not hold a NUL character"
"""Why a text holding a NUL is refused, wherever it comes in (`nul_field`, `no_nul`)."""


def nul_at(value: object, where: tuple[str | int, ...] = ()) -> tuple[str | int, ...] | None:
    """Where in a JSON-like value a string (or a key) holds a NUL character, or None.

    No text stored holds one: Postgres refuses it in its own words (after a run had taken it and
    then failed on it), SQLite stored it, and searches stop at it (`database.names_nothing`). So
    every text that comes in (an answer, an edit, a comment, a model's plan) is checked before it
    is stored. A key holding one is named with it written out (backslash, x00), not held in the name.
    """
    if isinstance(value, str):
        return where if "\x00" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            name = str(key)
            found = (
                (*where, name.replace("\x00", "\\x00")) if "\x00" in name else nul_at(item, (*where, name))
            )
            if found is not None:
                return found
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = nul_at(item, (*where, index))
            if found is not None:
                return found
    return None


def nul_field(value: object, whole: str = "it") -> str | None:
    """`field.0.name: must not hold a NUL character` for the first NUL in `value`, or None.

    `whole` names `value` itself when it is the text holding the NUL.
    """
    where = nul_at(value)
    if where is None:
        return None
    return f"{'.'.join(map(str, where)) or whole}: {NUL_PROBLEM}"


def nul_replaced(text: str) -> str:
    """A model's `text` with each NUL character replaced by U+FFFD, the replacement character.

    What a model writes (a step's output, a checker's reason, a consulted step's answer, the
    run's composed answer, a step's prompt, a failure analysis's lesson) is not the person's
    input to refuse: it is kept, and stored, with the NUL shown as the character that stands
    for one that cannot be (`nul_at` says why).
    """
    return text.replace("\x00", "\ufffd")


def no_nul(value: str) -> str:
    """A pydantic validator's check: `value` unless it holds a NUL (a `ValueError` then)."""
    if "\x00" in value:
        raise ValueError(NUL_PROBLEM)
    return value
