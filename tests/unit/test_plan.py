import copy
from typing import Any

import pytest
from _plans import step

from masterplanner.errors import PlanError
from masterplanner.plan import (
    Plan,
    dependents_of,
    find_cycle,
    plan_output_schema,
    sinks,
    steps_from_output,
    steps_to_output,
    topological_order,
    validate_plan,
    validate_task,
)
from masterplanner.tools import BUILTIN_TOOL_NAMES, builtin_catalog

CATALOG = builtin_catalog()


def plan_dict(*steps: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"task": "a task", "steps": list(steps), **extra}


def problems(raw: dict[str, Any], **kwargs: Any) -> list[str]:
    with pytest.raises(PlanError) as caught:
        validate_plan(raw, CATALOG, **kwargs)
    return caught.value.problems


def test_valid_plan_round_trips_through_json() -> None:
    raw = plan_dict(step("load"), step("sum", "load"), step("plot", "sum"), final_step="plot")
    plan = validate_plan(raw, CATALOG)
    assert plan.ids == ["load", "sum", "plot"]
    assert plan.to_json_dict() == raw
    assert Plan.model_validate_json(plan.model_dump_json()) == plan


def test_builtin_tool_names_are_fixed() -> None:
    assert BUILTIN_TOOL_NAMES == (
        "code_execution",
        "read_file",
        "write_file",
        "list_files",
        "delete_file",
        "http_request",
        "web_search",
        "generate_image",
        "ask_user",
        "remember",
        "recall",
    )


def test_cycle_is_named() -> None:
    found = problems(plan_dict(step("a", "c"), step("b", "a"), step("c", "b")))
    assert found == ["steps form a cycle: a -> c -> b -> a (each depends on the next)"]


def test_every_problem_names_its_step() -> None:
    raw = plan_dict(
        step("load", "missing"),
        step("load"),
        step("self", "self"),
        step("tooly", tools=["read_file", "teleport"]),
        final_step="nowhere",
    )
    assert problems(raw) == [
        "step 'load': the id is used by more than one step",
        "step 'load': depends on unknown step 'missing'",
        "step 'self': depends on itself",
        "step 'tooly': unknown tool 'teleport'; available: " + ", ".join(BUILTIN_TOOL_NAMES),
        "plan: final_step 'nowhere' is not a step",
    ]


def test_a_builtin_tool_the_catalog_leaves_out_is_not_available_here() -> None:
    narrow = builtin_catalog().subset(["read_file", "write_file"])
    raw = plan_dict(step("fetch", tools=["http_request", "teleport", "read_file"]))
    with pytest.raises(PlanError) as caught:
        validate_plan(raw, narrow)
    assert caught.value.problems == [
        "step 'fetch': unknown tool 'teleport'; available: read_file, write_file",
        "step 'fetch': tool 'http_request' is not available here; available: read_file, write_file",
    ]


def test_shape_problems_name_step_and_field() -> None:
    bad = step("ok")
    bad["instruction"] = "   "
    unnamed = step("x")
    del unnamed["id"]
    raw = plan_dict(bad, unnamed, {**step("Bad Id")}, {**step("extra"), "colour": "red"}, "write it")
    raw["steps"][1]["tools"] = "read_file"
    raw["colour"] = "red"
    # an unknown field is said with the fields known where it is: before, only "unknown field"
    assert problems(raw) == [
        "step 'ok': instruction: must not be empty",
        "step #2: id: is missing",
        "step #2: tools: should be a list, got text",
        "step 'Bad Id': id: must be a short slug of lowercase letters, digits and hyphens, e.g. load-data",
        "step 'extra': colour: unknown field; known: agent_role, depends_on, expand, expected_output, id, "
        "instruction, title, tools",
        "step #5: should be an object with the fields of a step, got text",
        "plan: colour: unknown field; known: final_step, steps, task",
    ]


def test_limits() -> None:
    many = [step(f"s{i}") for i in range(13)]
    assert problems(plan_dict(*many)) == ["plan: 13 steps; at most 12 are allowed"]
    validate_plan(plan_dict(*many), CATALOG, max_steps=13)
    long_instruction = step("a")
    long_instruction["instruction"] = "x" * 4001
    assert problems(plan_dict(long_instruction)) == [
        "step 'a': instruction: is 4,001 characters; the limit is 4,000"
    ]
    assert problems({"task": "t", "steps": []}) == ["plan: steps: must not be empty"]


def test_not_an_object() -> None:
    with pytest.raises(PlanError, match="plan: should be a JSON object, got a list"):
        validate_plan([], CATALOG)  # type: ignore[arg-type]


def test_validate_task() -> None:
    assert validate_task("  plan a trip ") == "plan a trip"
    with pytest.raises(PlanError, match="the task is empty"):
        validate_task(" \n ")
    with pytest.raises(PlanError, match="the task is 102,400 characters; the limit is 20,000"):
        validate_task("x" * 102_400)


def test_graph_helpers() -> None:
    plan = validate_plan(
        plan_dict(step("a"), step("b", "a"), step("c"), step("d", "b", "c"), step("e", "d")), CATALOG
    )
    assert topological_order(plan) == ["a", "c", "b", "d", "e"]
    assert dependents_of(plan, "b") == ["d", "e"]
    assert dependents_of(plan, "e") == []
    assert sinks(plan.steps) == ["e"]
    assert find_cycle({"a": ["b"], "b": []}) is None


def test_model_facing_form_round_trips() -> None:
    public = [step("a"), step("b", "a"), step("c", "a", "b")]
    model_form = steps_to_output(copy.deepcopy(public))
    assert [s["after"] for s in model_form] == [[], [1], [1, 2]]
    assert steps_from_output(model_form) == public
    # Numbers naming later steps still become ids, so a cycle is reported as one.
    cyclic = steps_from_output([step("x") | {"after": [2]}, step("y") | {"after": [1]}])
    assert isinstance(cyclic, list)
    assert problems(plan_dict(*cyclic)) == ["steps form a cycle: x -> y -> x (each depends on the next)"]


def test_output_schema_only_allows_earlier_steps_and_catalog_tools() -> None:
    schema = plan_output_schema(CATALOG.names, max_steps=3)
    assert schema["required"] == ["actions", "steps"]
    assert [len(option["prefixItems"]) for option in schema["properties"]["steps"]["anyOf"]] == [1, 2, 3]
    third = schema["$defs"]["step3"]["properties"]
    assert third["after"]["items"] == {"enum": [1, 2]}
    assert third["tools"]["items"] == {"enum": list(BUILTIN_TOOL_NAMES)}


def test_output_schema_with_tools_per_step_asks_for_those_steps_each_with_its_tools() -> None:
    choices = [["read_file"], ["write_file", "code_execution"]]
    schema = plan_output_schema(CATALOG.names, step_tools=choices)
    assert schema["required"] == ["steps"]
    assert schema["properties"]["steps"]["minItems"] == schema["properties"]["steps"]["maxItems"] == 2
    assert sorted(schema["$defs"]) == ["step1", "step2"]
    tools = [schema["$defs"][name]["properties"]["tools"]["items"]["enum"] for name in ("step1", "step2")]
    assert tools == choices


def test_repeated_ids_in_model_output_are_made_unique_but_not_in_the_public_form() -> None:
    from masterplanner.plan import steps_from_output

    model_output = [{"id": "a", "after": []}, {"id": "a", "after": [1]}, {"id": "a", "after": [2]}]
    assert steps_from_output(model_output) == [
        {"id": "a", "depends_on": []},
        {"id": "a-2", "depends_on": ["a"]},
        {"id": "a-3", "depends_on": ["a-2"]},
    ]
    public = [{"id": "a", "depends_on": []}, {"id": "a", "depends_on": ["a"]}]
    assert steps_from_output(public) == public  # ids name dependencies here: ambiguous, left to validation
