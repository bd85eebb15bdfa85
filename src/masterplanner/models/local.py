"""`LocalModel`: a GGUF model run in-process by llama.cpp, as a pydantic-ai `Model`.

Small local models cannot be trusted to write valid JSON or to call tools by themselves, so every
structured response is constrained by a grammar built from a JSON schema:

- a call that wants structured output and offers no tools is held to the output schema itself;
- a call that offers tools is held to one *envelope* schema, a choice between
  `{"tool": "<name>", "arguments": {…}}` for each tool (argument schema included) and
  `{"answer": …}` for the final answer (the output schema, or a string for text output);
- a plain text call generates freely.

So every response parses, every tool call names an offered tool with arguments that validate,
and structured output validates. The tools and the reply format are described to the model in
its system message, since chat templates of small models have no tool support.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ModelResponsePart,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.profiles import ModelProfile
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.usage import RequestUsage

from ..errors import ModelError
from ..tools.results import failed
from ._llama import LlamaRuntime, check_gguf, embedded_model_path, load_llama
from ._schema import JsonSchema, compact_schema, grammar_schema, hoist_definitions

__all__ = [
    "SMALL_MODEL_BYTES",
    "STRUCTURED_PLANS",
    "LocalModel",
    "LocalModelProfile",
    "ToolAids",
    "embedded_model_path",
    "load_llama",
]

_FINISH_REASONS = {"stop": "stop", "length": "length", "tool_calls": "tool_call"}

STRUCTURED_PLANS = "masterplanner_structured_plans"
"""Profile flag: plans take their steps from the task's clauses and the model only fills them in
(`clause_planner`), and steps get the small-model step aids. Set for small GGUF files only."""
SMALL_MODEL_BYTES = 300_000_000
"""GGUF files smaller than this count as small models (the embedded SmolLM2-135M is 98 MB)."""


class LocalModelProfile(ModelProfile, total=False):
    """The profile of a local model: pydantic-ai's keys and masterplanner's aid flags."""

    masterplanner_structured_plans: bool
    """See `STRUCTURED_PLANS`."""
    masterplanner_context_tokens: int
    """The context window (see `models.context_window`)."""
    masterplanner_max_output_tokens: int
    """The most tokens of one reply."""


@dataclass
class _ReplyFormat:
    """How the model must reply to one request: the grammar's schema and how to read the reply."""

    schema: JsonSchema | None
    envelope: bool
    instructions: list[str] = field(default_factory=list)

    def decode(self, text: str) -> list[ModelResponsePart]:
        if not self.envelope:
            return [TextPart(text)]
        try:
            reply = json.loads(text)
        except json.JSONDecodeError:
            # The grammar only allows complete JSON, so the token cap cut the reply short. Greedy
            # decoding would repeat the same reply, so asking again cannot help.
            raise ModelError(
                "the local model's reply was cut off at the output token cap before its JSON was complete; "
                "raise local_max_output_tokens or ask for less"
            ) from None
        if "tool" in reply:
            return [ToolCallPart(reply["tool"], reply.get("arguments", {}))]
        answer = reply["answer"]
        return [TextPart(answer if isinstance(answer, str) else json.dumps(answer))]


@dataclass(frozen=True)
class ToolAids:
    """Help for a small model to use tools, set per step by the engine (never used for hosted models).

    Measured with the embedded SmolLM2 on "Write a haiku about the sea to haiku.txt": left free to
    answer or call a tool it never wrote the file; with a tool call required on its first turn and
    the `path` argument narrowed to the file names the instruction mentions, it did every time.
    """

    first_call_tools: tuple[str, ...] = ()
    """Until one tool call has succeeded, the model must call one of these tools (it may not answer)."""
    argument_values: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    """Per tool, string arguments limited to these values, e.g. `{"write_file": {"path": ("haiku.txt",)}}`."""
    max_tool_calls: int | None = None
    """After this many tool calls (failed ones included) the model must answer (the embedded model
    otherwise repeated the same `write_file` call until the step's request cap, 12 times out of 12)."""


def _aided_choice(
    aids: ToolAids, messages: list[ModelMessage], params: ModelRequestParameters, settings: ModelSettings
) -> ModelSettings:
    """The tool choice the aids impose at this point of the conversation."""
    parts = [part for message in messages for part in getattr(message, "parts", [])]
    returned = [part for part in parts if isinstance(part, ToolReturnPart)]
    succeeded = sum(not failed(part.content) for part in returned)
    refused = sum(isinstance(part, RetryPromptPart) and part.tool_name is not None for part in parts)
    if aids.max_tool_calls is not None and len(returned) + refused >= aids.max_tool_calls:
        return {**settings, "tool_choice": "none"}
    if succeeded:
        return settings
    offered = {tool.name for tool in params.function_tools}
    required = [name for name in aids.first_call_tools if name in offered]
    return {**settings, "tool_choice": required} if required else settings


def _narrow(arguments: JsonSchema, values: dict[str, tuple[str, ...]]) -> JsonSchema:
    properties = arguments.get("properties")
    if not values or not isinstance(properties, dict):
        return arguments
    narrowed = {
        name: (
            {**schema, "enum": list(values[name])}
            if name in values and schema.get("type") == "string"
            else schema
        )
        for name, schema in properties.items()
    }
    return {**arguments, "properties": narrowed}


def _tool_option(
    tool: ToolDefinition,
    index: int,
    definitions: JsonSchema,
    values: dict[str, dict[str, tuple[str, ...]]] | None = None,
) -> JsonSchema:
    arguments, defs = hoist_definitions(tool.parameters_json_schema or {"type": "object"}, f"t{index}_")
    arguments = _narrow(arguments, (values or {}).get(tool.name, {}))
    definitions.update(defs)
    return {
        "type": "object",
        "properties": {"tool": {"const": tool.name}, "arguments": arguments},
        "required": ["tool", "arguments"],
        "additionalProperties": False,
    }


def _without_descriptions(schema: JsonSchema) -> JsonSchema:
    """The argument schema without per-argument descriptions.

    The embedded model copied them verbatim into its arguments (a haiku file that read "the
    complete text to write").
    """
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return schema
    bare = {name: {k: v for k, v in spec.items() if k != "description"} for name, spec in properties.items()}
    return {**schema, "properties": bare}


def _describe_tools(tools: list[ToolDefinition]) -> str:
    lines = ["You can call these tools:"]
    for tool in tools:
        schema = compact_schema(_without_descriptions(tool.parameters_json_schema))
        lines.append(f"- {tool.name}: {tool.description or '(no description)'} Arguments: {schema}")
    return "\n".join(lines)


def _allowed_tools(
    params: ModelRequestParameters, settings: ModelSettings
) -> tuple[list[ToolDefinition], bool]:
    """The tools this request may call and whether it may answer directly, per `tool_choice`."""
    from pydantic_ai.models._tool_choice import resolve_tool_choice

    tools = [*params.function_tools, *params.output_tools]
    choice = resolve_tool_choice(settings, params)
    if choice == "none":
        return [], True
    if choice == "auto":
        return tools, True
    if choice == "required":
        return tools if params.function_tools else list(params.output_tools), False
    mode, names = choice
    return [tool for tool in tools if tool.name in names], mode == "auto"


def reply_format(
    params: ModelRequestParameters, settings: ModelSettings | None = None, aids: ToolAids | None = None
) -> _ReplyFormat:
    """Work out the grammar schema and reply instructions for one request."""
    tools, may_answer = _allowed_tools(params, settings or {})
    values = aids.argument_values if aids is not None else {}
    output = params.output_object
    output_schema = output.json_schema if output is not None else None
    if not tools:
        if output_schema is None:
            return _ReplyFormat(None, envelope=False)
        hints = [_schema_hint(output_schema)] if params.output_mode == "native" else []
        return _ReplyFormat(output_schema, envelope=False, instructions=hints)

    definitions: JsonSchema = {}
    options = [_tool_option(tool, index, definitions, values) for index, tool in enumerate(tools)]
    answer_help = ""
    if may_answer and output_schema is not None:
        answer, defs = hoist_definitions(output_schema, "out_")
        definitions.update(defs)
        options.append(_answer_option(answer))
        answer_help = ' When you are done, reply {"answer": <JSON object matching the output schema>}.'
    elif may_answer and params.allow_text_output:
        options.append(_answer_option({"type": "string"}))
        answer_help = ' When you are done, reply {"answer": "<your final answer>"}.'
    schema: JsonSchema = {"anyOf": options}
    if definitions:
        schema["$defs"] = definitions
    instructions = [
        _describe_tools(tools),
        'To call a tool, reply {"tool": "<tool name>", "arguments": {<arguments>}}.' + answer_help,
    ]
    if may_answer and output_schema is not None:
        instructions.append(_schema_hint(output_schema))
    return _ReplyFormat(schema, envelope=True, instructions=instructions)


SCHEMA_HINT_LIMIT = 2000
"""Schemas longer than this (compact JSON characters) are not shown to the model: they would cost
more prompt tokens than they help a small model, and the grammar enforces them anyway."""


def _schema_hint(schema: JsonSchema) -> str:
    text = compact_schema(schema)
    if len(text) > SCHEMA_HINT_LIMIT:
        return "Reply with only a JSON object in the format described above."
    return f"Reply with only a JSON object that matches this JSON schema:\n{text}"


def _answer_option(answer: JsonSchema) -> JsonSchema:
    return {
        "type": "object",
        "properties": {"answer": answer},
        "required": ["answer"],
        "additionalProperties": False,
    }


def _user_text(part: UserPromptPart) -> str:
    if isinstance(part.content, str):
        return part.content
    texts: list[str] = []
    for item in part.content:
        if isinstance(item, str):
            texts.append(item)
        else:
            raise ModelError(f"the local model reads text only; it cannot take {type(item).__name__} input")
    return "\n".join(texts)


def _request_messages(message: ModelRequest) -> list[dict[str, str]]:
    from pydantic_ai.models import _sendable_request_parts

    chat: list[dict[str, str]] = []
    for part in _sendable_request_parts(message.parts):
        if isinstance(part, SystemPromptPart):
            chat.append({"role": "system", "content": part.content})
        elif isinstance(part, UserPromptPart):
            chat.append({"role": "user", "content": _user_text(part)})
        elif isinstance(part, ToolReturnPart):
            chat.append(
                {"role": "user", "content": f"Result of tool {part.tool_name}:\n{part.model_response_str()}"}
            )
        else:
            raise ModelError(f"the local model cannot send a {type(part).__name__} message part")
    return chat


def _response_messages(message: ModelResponse) -> list[dict[str, str]]:
    chat: list[dict[str, str]] = []
    for part in message.parts:
        if isinstance(part, TextPart):
            chat.append({"role": "assistant", "content": part.content})
        elif isinstance(part, ToolCallPart):
            envelope = {"tool": part.tool_name, "arguments": part.args_as_dict()}
            chat.append({"role": "assistant", "content": json.dumps(envelope)})
        elif not isinstance(part, ThinkingPart):
            raise ModelError(f"the local model cannot replay a {type(part).__name__} response part")
    return chat


def _merge_roles(chat: list[dict[str, str]]) -> list[dict[str, str]]:
    """Join consecutive messages of one role: small models' chat templates expect turns to alternate."""
    merged: list[dict[str, str]] = []
    for message in chat:
        if merged and merged[-1]["role"] == message["role"]:
            merged[-1] = {
                "role": message["role"],
                "content": f"{merged[-1]['content']}\n\n{message['content']}",
            }
        else:
            merged.append(dict(message))
    return merged


class LocalModel(Model):
    """A GGUF model run in-process by llama.cpp, with grammar-constrained structured output and tools."""

    _announces_lookalike_notes = False
    unsupported_settings = frozenset(
        {"logit_bias", "parallel_tool_calls", "timeout", "extra_headers", "extra_body"}
    )

    max_items = 24
    """Grammar bound for arrays whose schema sets no `maxItems` (keeps generation finite)."""

    def __init__(
        self,
        path: Path | None = None,
        *,
        context_tokens: int = 8192,
        threads: int | None = None,
        max_output_tokens: int = 2048,
        settings: ModelSettings | None = None,
        aids: ToolAids | None = None,
    ) -> None:
        self.path = check_gguf((path or embedded_model_path()).resolve())
        self.aids = aids
        self.context_tokens = context_tokens
        self.threads = threads
        self.max_output_tokens = max_output_tokens
        super().__init__(
            settings=settings,
            profile=LocalModelProfile(
                supports_tools=True,
                supports_json_schema_output=True,
                supports_json_object_output=True,
                default_structured_output_mode="native",
                masterplanner_structured_plans=self.path.stat().st_size < SMALL_MODEL_BYTES,
                masterplanner_context_tokens=context_tokens,
                masterplanner_max_output_tokens=max_output_tokens,
            ),
        )

    def aided(self, aids: ToolAids) -> LocalModel:
        """The same model (sharing its loaded weights) with tool-use `aids` applied to every request."""
        return LocalModel(
            self.path,
            context_tokens=self.context_tokens,
            threads=self.threads,
            max_output_tokens=self.max_output_tokens,
            settings=self.settings,
            aids=aids,
        )

    @property
    def model_name(self) -> str:
        """The GGUF file's name without its extension."""
        return self.path.stem

    @property
    def system(self) -> str:
        """The provider label used in telemetry."""
        return "llama.cpp"

    def runtime(self) -> LlamaRuntime:
        """The loaded model (loaded on first use, shared by every `LocalModel` of the same file)."""
        return load_llama(self.path, context_tokens=self.context_tokens, threads=self.threads)

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        """Generate one response, grammar-constrained whenever it must be structured."""
        model_settings, params = self.prepare_request(model_settings, model_request_parameters)
        messages = self.prepare_messages(messages, params)
        settings = model_settings or {}
        if self.aids is not None and params.function_tools:
            settings = _aided_choice(self.aids, messages, params, settings)
        reply = reply_format(params, settings, self.aids)
        chat = self._chat(messages, params, reply)
        import asyncio

        runtime = await asyncio.to_thread(self.runtime)
        schema = reply.schema
        if schema is not None:
            schema = grammar_schema(schema, max_items=self.max_items)
        generation = await runtime.generate(
            chat,
            schema=schema,
            max_tokens=min(int(settings.get("max_tokens", self.max_output_tokens)), self.max_output_tokens),
            temperature=float(settings.get("temperature", 0.0)),
            top_p=float(settings.get("top_p", 1.0)),
            presence_penalty=float(settings.get("presence_penalty", 0.0)),
            frequency_penalty=float(settings.get("frequency_penalty", 0.0)),
            seed=settings.get("seed"),
            stop=list(settings.get("stop_sequences", [])),
        )
        return ModelResponse(
            parts=reply.decode(generation.text),
            usage=RequestUsage(
                input_tokens=generation.prompt_tokens, output_tokens=generation.completion_tokens
            ),
            model_name=self.model_name,
            finish_reason=_FINISH_REASONS.get(generation.finish_reason),  # type: ignore[arg-type]
        )

    def _chat(
        self, messages: list[ModelMessage], params: ModelRequestParameters, reply: _ReplyFormat
    ) -> list[dict[str, str]]:
        instruction_parts = self._get_instruction_parts(messages, params) or []
        system = [part.content for part in instruction_parts] + reply.instructions
        chat: list[dict[str, str]] = []
        for message in messages:
            chat.extend(
                _request_messages(message)
                if isinstance(message, ModelRequest)
                else _response_messages(message)
            )
        if system:
            chat.insert(0, {"role": "system", "content": "\n\n".join(system)})
        return _merge_roles(chat)
