from typing import Literal

import pytest
from pydantic import BaseModel, Field, TypeAdapter

from masterplanner.models._schema import grammar_schema, hoist_definitions, minimal_instance


class Leaf(BaseModel):
    name: str = Field(min_length=3)
    size: float = Field(gt=0.5, lt=2)
    tags: list[str] = Field(min_length=2)
    level: Literal["low", "high"] = "high"


class Tree(BaseModel):
    root: Leaf
    leaves: list[Leaf]
    count: int = Field(ge=-5, le=-2)
    maybe: int | None
    flag: bool


def test_minimal_instance_validates() -> None:
    schema = Tree.model_json_schema()
    value = minimal_instance(schema)
    assert value == {
        "root": {"name": "aaa", "size": 1.5, "tags": ["", ""]},
        "leaves": [],
        "count": -5,
        "maybe": 0,
        "flag": False,
    }
    Tree.model_validate(value)


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"const": 7}, 7),
        ({"enum": ["b", "a"]}, "b"),
        ({"type": "string", "format": "date"}, "2000-01-01"),
        ({"type": "integer", "exclusiveMinimum": 3}, 4),
        ({"type": "number", "minimum": 2.5}, 2.5),
        ({"type": ["null", "integer"]}, 0),
        (
            {"allOf": [{"type": "object", "required": ["a"], "properties": {"a": {"type": "boolean"}}}]},
            {"a": False},
        ),
        ({"type": "array", "minItems": 2, "items": {"type": "integer"}}, [0, 0]),
    ],
)
def test_minimal_instance_cases(schema: dict[str, object], expected: object) -> None:
    assert minimal_instance(schema) == expected


def test_hoist_definitions_renames_and_rewrites_refs() -> None:
    body, definitions = hoist_definitions(Tree.model_json_schema(), "t0_")
    assert "$defs" not in body
    assert set(definitions) == {"t0_Leaf"}
    assert body["properties"]["root"] == {"$ref": "#/$defs/t0_Leaf"}
    combined = {"anyOf": [body], "$defs": definitions}
    value = minimal_instance(combined)
    TypeAdapter(Tree).validate_python(value)


def test_grammar_schema_bounds_arrays_and_drops_long_string_bounds() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
            "b": {"type": "array", "maxItems": 3},
            "c": {"type": "array", "minItems": 40},
            "d": {"enum": [{"type": "array"}]},
            "e": {"type": "string", "maxLength": 5000, "minLength": 1},
            "f": {"type": "string", "maxLength": 300},
            "g": {"type": "integer", "minimum": 1, "maximum": 5},
            "h": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 3.5},
            "i": {"type": "integer", "minimum": 0},
        },
    }
    bounded = grammar_schema(schema, max_items=24)
    assert bounded["properties"]["e"] == {"type": "string", "minLength": 1}
    assert bounded["properties"]["f"] == {"type": "string", "maxLength": 300}
    assert bounded["properties"]["g"]["enum"] == [1, 2, 3, 4, 5]
    assert bounded["properties"]["h"]["enum"] == [1, 2, 3]
    assert "enum" not in bounded["properties"]["i"]
    assert bounded["properties"]["a"]["maxItems"] == 24
    assert bounded["properties"]["a"]["items"]["maxItems"] == 24
    assert bounded["properties"]["b"]["maxItems"] == 3
    assert bounded["properties"]["c"]["maxItems"] == 40
    assert bounded["properties"]["d"] == {"enum": [{"type": "array"}]}
    assert "maxItems" not in schema["properties"]["a"]  # the input is not changed


def test_minimal_instance_fills_prefix_items_and_patterns() -> None:
    schema = {
        "type": "array",
        "prefixItems": [{"type": "integer", "minimum": 3}, {"type": "string", "pattern": "^[a-z][a-z-]*$"}],
        "minItems": 2,
        "maxItems": 2,
    }
    assert minimal_instance(schema) == [3, "a"]


def test_minimal_instance_of_the_plan_schema_is_a_valid_plan() -> None:
    # what the scripted model answers a planner call its script does not spell out
    import jsonschema

    from masterplanner.plan import plan_output_schema, steps_from_output, validate_plan
    from masterplanner.tools import builtin_catalog

    schema = plan_output_schema(["read_file", "write_file"])
    value = minimal_instance(schema)
    jsonschema.validate(value, schema)
    assert value == {
        "actions": ["a"],
        "steps": [
            {
                "id": "a",
                "title": "a",
                "instruction": "a",
                "agent_role": "a",
                "tools": [],
                "after": [],
                "expected_output": "",
            }
        ],
    }
    plan = validate_plan({"task": "t", "steps": steps_from_output(value["steps"])}, builtin_catalog())
    assert [step.id for step in plan.steps] == ["a"]
