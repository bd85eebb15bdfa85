"""How the local model constrains a reply, without running the model."""

import json

from pydantic_ai.messages import TextPart, ToolCallPart
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.output import OutputObjectDefinition
from pydantic_ai.tools import ToolDefinition

from masterplanner.models.local import reply_format

ADD = ToolDefinition(
    name="add",
    description="Add two integers.",
    parameters_json_schema={
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
)
NOTE = ToolDefinition(
    name="note",
    parameters_json_schema={
        "type": "object",
        "properties": {"item": {"$ref": "#/$defs/Item"}},
        "required": ["item"],
        "$defs": {
            "Item": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
        },
    },
)
OUTPUT = OutputObjectDefinition(
    json_schema={"type": "object", "properties": {"total": {"type": "integer"}}, "required": ["total"]}
)


def options(schema: dict[str, object]) -> list[str]:
    names = []
    for option in schema["anyOf"]:  # type: ignore[attr-defined]
        properties = option["properties"]
        names.append(properties["tool"]["const"] if "tool" in properties else "answer")
    return names


def test_plain_text_is_unconstrained() -> None:
    reply = reply_format(ModelRequestParameters())
    assert reply.schema is None
    assert reply.decode("hello") == [TextPart("hello")]


def test_structured_output_without_tools_uses_the_output_schema() -> None:
    reply = reply_format(
        ModelRequestParameters(output_mode="native", output_object=OUTPUT, allow_text_output=True)
    )
    assert reply.schema == OUTPUT.json_schema
    assert not reply.envelope
    assert "matches this JSON schema" in reply.instructions[0]


def test_tools_and_text_answer() -> None:
    reply = reply_format(ModelRequestParameters(function_tools=[ADD, NOTE]))
    assert reply.schema is not None
    assert options(reply.schema) == ["add", "note", "answer"]
    assert reply.schema["$defs"] == {"t1_Item": NOTE.parameters_json_schema["$defs"]["Item"]}
    assert reply.schema["anyOf"][1]["properties"]["arguments"]["properties"]["item"] == {
        "$ref": "#/$defs/t1_Item"
    }
    assert reply.decode('{"tool": "add", "arguments": {"a": 1, "b": 2}}')[0].args == {"a": 1, "b": 2}
    assert reply.decode('{"answer": "3"}') == [TextPart("3")]
    assert "- add: Add two integers." in reply.instructions[0]


def test_tools_and_structured_answer() -> None:
    reply = reply_format(
        # Native structured output arrives as text, so pydantic-ai allows text output in that mode.
        ModelRequestParameters(
            function_tools=[ADD], output_mode="native", output_object=OUTPUT, allow_text_output=True
        )
    )
    assert reply.schema is not None
    assert options(reply.schema) == ["add", "answer"]
    assert reply.schema["anyOf"][1]["properties"]["answer"] == OUTPUT.json_schema
    assert reply.decode('{"answer": {"total": 3}}') == [TextPart(json.dumps({"total": 3}))]


def test_tool_choice_required_removes_the_answer() -> None:
    reply = reply_format(ModelRequestParameters(function_tools=[ADD, NOTE]), {"tool_choice": "required"})
    assert reply.schema is not None
    assert options(reply.schema) == ["add", "note"]


def test_tool_choice_list_narrows_the_tools() -> None:
    reply = reply_format(ModelRequestParameters(function_tools=[ADD, NOTE]), {"tool_choice": ["note"]})
    assert reply.schema is not None
    assert options(reply.schema) == ["note"]


def test_tool_choice_none_answers_directly() -> None:
    reply = reply_format(ModelRequestParameters(function_tools=[ADD]), {"tool_choice": "none"})
    assert reply.schema is None


def test_output_tools_are_callable() -> None:
    final = ToolDefinition(name="final_result", parameters_json_schema=OUTPUT.json_schema, kind="output")
    reply = reply_format(
        ModelRequestParameters(output_mode="tool", output_tools=[final], allow_text_output=False)
    )
    assert reply.schema is not None
    assert options(reply.schema) == ["final_result"]
    part = reply.decode('{"tool": "final_result", "arguments": {"total": 1}}')[0]
    assert isinstance(part, ToolCallPart)
    assert part.tool_name == "final_result"


def test_truncated_envelope_is_a_clear_error() -> None:
    import pytest

    from masterplanner import ModelError

    reply = reply_format(ModelRequestParameters(function_tools=[ADD]))
    with pytest.raises(ModelError, match="cut off at the output token cap"):
        reply.decode('{"tool": "ad')
