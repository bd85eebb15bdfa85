"""Each shipped tool is defined once: the catalog, a step agent's tools and availability agree."""

from __future__ import annotations

from pathlib import Path

from masterplanner import Settings, builtin_catalog
from masterplanner.engine.catalogs import run_catalog, tool_context
from masterplanner.engine.step_tools import runnable_tools, step_tools
from masterplanner.tools import BUILTIN_TOOL_NAMES, BUILTIN_TOOLS


def test_the_agent_is_offered_exactly_what_the_catalog_says(isolated: Path) -> None:
    catalog = builtin_catalog()
    context = tool_context(Settings.load())
    offered = {tool.name: tool.tool_def for tool in step_tools(list(BUILTIN_TOOL_NAMES), context)}
    assert list(offered) == catalog.names == list(BUILTIN_TOOL_NAMES)
    for spec in catalog:
        assert offered[spec.name].parameters_json_schema == spec.args_schema, spec.name


def test_schemas_that_once_drifted_now_hold_in_both_places() -> None:
    code = builtin_catalog()["code_execution"].args_schema["properties"]
    assert code["timeout_s"]["type"] == "integer"
    assert (code["timeout_s"]["minimum"], code["timeout_s"]["maximum"]) == (1, 120)
    assert code["language"]["enum"] == ["python", "bash", "javascript", "sql"]
    http = builtin_catalog()["http_request"].args_schema["properties"]
    assert http["method"]["enum"] == ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def test_policies_side_effects_and_availability_come_from_the_definitions(isolated: Path) -> None:
    catalog = builtin_catalog()
    assert {tool.name: (tool.side_effect, tool.approval) for tool in BUILTIN_TOOLS} == {
        spec.name: (spec.side_effect, spec.approval) for spec in catalog
    }
    assert [spec.name for spec in catalog if spec.approval == "ask"] == [
        "code_execution",
        "delete_file",
        "http_request",
        "generate_image",
    ]
    plain = run_catalog(Settings.load())
    assert {"http_request", "web_search", "generate_image"} <= set(plain.missing)
    assert set(plain.names) | set(plain.missing) == set(BUILTIN_TOOL_NAMES)
    configured = run_catalog(
        Settings.load(http_allowed_domains=["example.com"], web_search_backend="local", web_search_folder=".")
    )
    assert "http_request" in configured and "web_search" in configured
    assert runnable_tools(["read_file", "no_such_tool", "recall"], tool_context(Settings.load())) == [
        "read_file",
        "recall",
    ]
