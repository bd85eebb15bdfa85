"""The scripted model: a deterministic stand-in for an LLM, for tests, demos and benchmarks.

A script is a JSON file:

```json
{"calls": [
  {"purpose": "planner", "output": {"steps": []}, "delay_s": 0.5},
  {"purpose": "step:fetch",
   "tool_calls": [{"name": "write_file", "args": {"path": "a.txt", "content": "x"}}]},
  {"purpose": "step:fetch", "output": "done"},
  {"purpose": "*", "repeat": true}
]}
```

Entries answer calls of their purpose in order. `delay_s` is awaited without blocking other
calls; `"repeat": true` keeps an entry answering every later call of its purpose; purpose `"*"`
answers any call whose own purpose has no entry left. An entry with neither `output` nor
`tool_calls` returns the smallest valid instance of the requested output schema (or a short
text). `"expect": ["text", …]` makes the call fail with `ScriptError` unless its request (the
instructions, prompts, tool results and retry prompts it was sent) contains every text, so a test can check
what a model was shown. `"cut_off": true` ends the reply as a model that reached its output
limit does (finish reason `length`), for a text `output` such as a JSON reply cut short. A call
with no entry left fails with `ScriptExhaustedError` naming its purpose. `"small_model": true`
beside `"calls"` makes the model plan as a small local model does (`clause_planner`: the planner
call only fills in each step's title and role), and its steps take the small-model step aids as
the embedded model's do (`engine.step_agent`: a step that only reads a file is the engine's own
`read_file` call, a text to write is drafted; the grammar it would impose is not applied, the
script is the model's choice). `"max_output_tokens": N` beside `"calls"` is the most tokens one reply
may take, as a GGUF model's cap (the run's token and money budgets reserve that much for each
request; a reply of more words fails with `ScriptError`). A text reply of more words than the
request's `max_tokens` setting is cut to that many (finish reason `length`), as a provider stops
there (a tool call over it fails with `ScriptError`). A reply's tokens are its words, a
request's the words of what it was sent. `"turn": N` makes an entry answer only the N-th
request of a conversation (one that already holds N-1 replies): a step's first request can call
a tool and its second answer, whatever order steps of several runs ask in, in any process, and
when a step is replayed after a crash.
"""

from __future__ import annotations

import copy
import json
import threading
from collections import deque
from pathlib import Path
from typing import Any

import anyio
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    ModelResponsePart,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.settings import ModelSettings
from pydantic_ai.usage import RequestUsage

from ..errors import ScriptError, ScriptExhaustedError, validation_problems
from ..purpose import current_purpose
from ..text_files import json_problem, read_text
from ._schema import minimal_instance
from .local import LocalModelProfile, ToolAids

__all__ = ["ScriptedModel"]

_NO_OUTPUT = object()


class _ToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    args: dict[str, Any] = Field(default_factory=dict)


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    purpose: str = Field(min_length=1)
    output: Any = Field(default_factory=lambda: _NO_OUTPUT)
    tool_calls: list[_ToolCall] | None = None
    delay_s: float = Field(0.0, ge=0, le=3600)
    repeat: bool = False
    expect: list[str] = Field(default_factory=list)
    cut_off: bool = False
    turn: int | None = Field(None, ge=1, le=1000)

    @model_validator(mode="after")
    def _one_kind_of_answer(self) -> _Entry:
        if self.output is not _NO_OUTPUT and self.tool_calls is not None:
            raise ValueError("an entry gives either 'output' or 'tool_calls', not both")
        if self.tool_calls is not None and not self.tool_calls:
            raise ValueError("'tool_calls' must list at least one call")
        return self

    @property
    def has_output(self) -> bool:
        return self.output is not _NO_OUTPUT


class _Script(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    calls: list[_Entry]
    small_model: bool = False
    max_output_tokens: int | None = Field(None, ge=1, le=10**9)


def _load(path: Path) -> _Script:
    text = read_text(path, "scripted model file", error=ScriptError)
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScriptError(f"scripted model file {path}: not JSON: {json_problem(exc)}") from None
    try:
        return _Script.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(validation_problems(exc.errors(), whole="file", model=_Script))
        raise ScriptError(f"scripted model file {path}: {problems}") from None


class ScriptedModel(Model):
    """Answers each call from a script, by the call's purpose label (see the module docstring)."""

    _announces_lookalike_notes = False

    def __init__(self, path: str | Path, *, settings: ModelSettings | None = None) -> None:
        self.path = Path(path)
        self._script = _load(self.path)
        self._lock = threading.Lock()
        self._queues: dict[str, deque[_Entry]] = {}
        for entry in self._script.calls:
            self._queues.setdefault(entry.purpose, deque()).append(entry)
        super().__init__(
            settings=settings,
            profile=LocalModelProfile(
                supports_json_schema_output=True,
                supports_json_object_output=True,
                masterplanner_structured_plans=self._script.small_model,
                **(
                    {}
                    if self._script.max_output_tokens is None
                    else {"masterplanner_max_output_tokens": self._script.max_output_tokens}
                ),
            ),
        )

        self.aids: ToolAids | None = None
        """The step's tool-use aids (a small model's step only; see `aided`)."""

    def aided(self, aids: ToolAids) -> ScriptedModel:
        """The same script (its entries shared, each still answered once) carrying a step's `aids`."""
        twin = copy.copy(self)
        twin.aids = aids
        return twin

    @property
    def model_name(self) -> str:
        """The script's path, so runs record which script answered them."""
        return str(self.path)

    @property
    def system(self) -> str:
        """The provider label used in telemetry."""
        return "scripted"

    def remaining(self) -> dict[str, int]:
        """How many entries are left per purpose (repeating entries count once)."""
        with self._lock:
            return {purpose: len(queue) for purpose, queue in self._queues.items() if queue}

    def _take(self, purpose: str, turn: int) -> _Entry:
        with self._lock:
            for key in (purpose, "*"):
                for entry in self._queues.get(key, ()):
                    if entry.turn not in (None, turn):
                        continue
                    if not entry.repeat:
                        self._queues[key].remove(entry)
                    return entry
        raise ScriptExhaustedError(purpose, str(self.path))

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        """Answer one call with the next script entry for its purpose."""
        model_settings, params = self.prepare_request(model_settings, model_request_parameters)
        purpose = current_purpose() or "chat"
        entry = self._take(purpose, 1 + sum(isinstance(message, ModelResponse) for message in messages))
        if entry.expect:
            self._check_expected(entry, purpose, messages)
        if entry.delay_s:
            await anyio.sleep(entry.delay_s)
        parts = self._parts(entry, params)
        output_tokens = _count_tokens(parts)
        cap = self._script.max_output_tokens
        if cap is not None and output_tokens > cap:
            raise ScriptError(
                f"scripted model file {self.path}: a {purpose} call's reply has {output_tokens} tokens, "
                f"more than the script's max_output_tokens of {cap}"
            )
        cut_off = entry.cut_off
        limit = (model_settings or {}).get("max_tokens")
        if isinstance(limit, int) and output_tokens > limit:  # the request's limit: the reply stops there
            if not all(isinstance(part, TextPart) for part in parts):
                raise ScriptError(
                    f"scripted model file {self.path}: a {purpose} call's reply has {output_tokens} tokens, "
                    f"more than the request's max_tokens of {limit}, and a tool call cannot be cut"
                )
            words = " ".join(part.content for part in parts if isinstance(part, TextPart)).split()
            parts, output_tokens, cut_off = [TextPart(" ".join(words[:limit]))], limit, True
        return ModelResponse(
            parts=parts,
            usage=RequestUsage(input_tokens=_count_tokens(messages), output_tokens=output_tokens),
            model_name=self.model_name,
            finish_reason="length" if cut_off else None,
        )

    def _check_expected(self, entry: _Entry, purpose: str, messages: list[ModelMessage]) -> None:
        texts = [getattr(message, "instructions", None) or "" for message in messages]
        texts += [
            part.content if isinstance(part.content, str) else json.dumps(part.content, default=str)
            for message in messages
            for part in message.parts
            if isinstance(part, UserPromptPart | ToolReturnPart | SystemPromptPart | RetryPromptPart)
        ]
        request = "\n".join(texts)
        for wanted in entry.expect:
            if wanted not in request:
                raise ScriptError(
                    f"scripted model file {self.path}: a {purpose} call's request does not contain "
                    f"the expected text {wanted!r}"
                )

    def _parts(self, entry: _Entry, params: ModelRequestParameters) -> list[ModelResponsePart]:
        if entry.tool_calls is not None:
            return [ToolCallPart(call.name, dict(call.args)) for call in entry.tool_calls]
        if params.output_object is not None:
            output = entry.output if entry.has_output else minimal_instance(params.output_object.json_schema)
            return [TextPart(output if isinstance(output, str) else json.dumps(output))]
        if params.output_tools and not (params.allow_text_output and isinstance(entry.output, str)):
            tool = params.output_tools[0]
            output = entry.output if entry.has_output else minimal_instance(tool.parameters_json_schema)
            return [ToolCallPart(tool.name, output if isinstance(output, dict | str) else json.dumps(output))]
        if not entry.has_output:
            return [TextPart("ok")]
        return [TextPart(entry.output if isinstance(entry.output, str) else json.dumps(entry.output))]


def _count_tokens(items: list[Any]) -> int:
    """A deterministic token estimate: whitespace-separated words of every text and argument."""
    total = 0
    for item in items:
        for part in getattr(item, "parts", [item]):
            content = getattr(part, "content", None)
            if content is None and isinstance(part, ToolCallPart):
                try:
                    content = part.args_as_json_str()
                except ValueError:  # a lone surrogate (JSON allows "\udcff"): the call goes on to the tool
                    content = json.dumps(part.args_as_dict(), separators=(",", ":"), default=str)
            if isinstance(content, str):
                total += len(content.split())
            elif content is not None:
                total += len(json.dumps(content, default=str).split())
    return total
