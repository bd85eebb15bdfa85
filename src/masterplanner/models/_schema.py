"""JSON-schema helpers shared by the model adapters: `$ref` handling and minimal instances."""

from __future__ import annotations

import copy
import json
import math
import re
from typing import Any

__all__ = [
    "GRAMMAR_MAX_STRING_LENGTH",
    "compact_schema",
    "grammar_schema",
    "hoist_definitions",
    "minimal_instance",
]

JsonSchema = dict[str, Any]


def _resolve(ref: str, root: JsonSchema) -> JsonSchema:
    if not ref.startswith("#/"):
        raise ValueError(f"unsupported $ref {ref!r}: only local references (#/...) are supported")
    node: Any = root
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    if not isinstance(node, dict):
        raise ValueError(f"$ref {ref!r} does not point at a schema")
    return node


def minimal_instance(schema: JsonSchema, root: JsonSchema | None = None, depth: int = 0) -> Any:
    """The smallest value that validates against `schema`: required fields only, shortest arrays.

    Used by the scripted model to answer calls a script does not spell out.
    """
    root = schema if root is None else root
    if depth > 32:
        raise ValueError("schema nests too deeply (recursive $ref without a terminating branch?)")
    if "$ref" in schema:
        return minimal_instance(_resolve(schema["$ref"], root), root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    if "default" in schema:
        return copy.deepcopy(schema["default"])
    for combinator in ("anyOf", "oneOf"):
        if schema.get(combinator):
            branches = schema[combinator]
            non_null = [branch for branch in branches if branch.get("type") != "null"]
            return minimal_instance((non_null or branches)[0], root, depth + 1)
    if schema.get("allOf"):
        merged: JsonSchema = {}
        for part in schema["allOf"]:
            merged |= _resolve(part["$ref"], root) if "$ref" in part else part
        return minimal_instance(merged, root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((option for option in kind if option != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    return _minimal_of_type(kind, schema, root, depth)


def _minimal_of_type(kind: str, schema: JsonSchema, root: JsonSchema, depth: int) -> Any:
    if kind == "object":
        properties: dict[str, JsonSchema] = schema.get("properties", {})
        return {
            name: minimal_instance(properties.get(name, {}), root, depth + 1)
            for name in schema.get("required", [])
        }
    if kind == "array":
        count = int(schema.get("minItems", 0))
        prefix: list[JsonSchema] = schema.get("prefixItems", [])
        item_schemas = [*prefix[:count], *[schema.get("items", {})] * (count - len(prefix))]
        return [minimal_instance(item_schema, root, depth + 1) for item_schema in item_schemas]
    if kind == "string":
        return _minimal_string(schema)
    if kind in ("integer", "number"):
        return _minimal_number(kind, schema)
    if kind == "boolean":
        return False
    return None


def _minimal_string(schema: JsonSchema) -> str:
    formats = {
        "date": "2000-01-01",
        "date-time": "2000-01-01T00:00:00Z",
        "time": "00:00:00",
        "email": "a@example.com",
        "uri": "https://example.com",
        "uuid": "00000000-0000-0000-0000-000000000000",
    }
    if schema.get("format") in formats:
        return formats[schema["format"]]
    shortest = int(schema.get("minLength", 0))
    pattern = schema.get("pattern")
    if pattern is None:
        return "a" * shortest
    # The shortest run of one letter or digit the pattern takes (slugs, codes); for a pattern
    # that takes none (words, say) the string stays as without it, and validation names it.
    for length in range(shortest, shortest + 9):
        for letter in "a0A":
            if re.search(pattern, letter * length):
                return letter * length
    return "a" * shortest


def _minimal_number(kind: str, schema: JsonSchema) -> int | float:
    low, high = schema.get("minimum"), schema.get("maximum")
    open_low, open_high = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")

    def fits(value: float) -> bool:
        return (
            (low is None or value >= low)
            and (high is None or value <= high)
            and (open_low is None or value > open_low)
            and (open_high is None or value < open_high)
        )

    bounds = [bound for bound in (low, high, open_low, open_high) if bound is not None]
    candidates: list[float] = [0, *bounds, *(b + 1 for b in bounds), *(b - 1 for b in bounds)]
    if len(bounds) >= 2:
        candidates.append(sum(bounds[:2]) / 2)
    for candidate in candidates:
        value = math.ceil(candidate) if kind == "integer" else candidate
        if fits(value):
            return int(value) if kind == "integer" else float(value)
    raise ValueError(f"no {kind} satisfies the bounds of {schema}")


def hoist_definitions(schema: JsonSchema, prefix: str) -> tuple[JsonSchema, JsonSchema]:
    """Split `schema` into (body, definitions) with every definition renamed `<prefix><name>`.

    Lets several schemas, each with its own `$defs`, be combined under one root without their
    definitions colliding: the caller puts all returned definitions into the root's `$defs`.
    """
    body = copy.deepcopy(schema)
    definitions: JsonSchema = {}
    for key in ("$defs", "definitions"):
        for name, definition in body.pop(key, {}).items():
            definitions[f"{prefix}{name}"] = definition

    def rewrite(node: Any) -> Any:
        if isinstance(node, dict):
            result = {key: rewrite(value) for key, value in node.items()}
            ref = result.get("$ref")
            if isinstance(ref, str):
                for key in ("#/$defs/", "#/definitions/"):
                    if ref.startswith(key):
                        result["$ref"] = f"#/$defs/{prefix}{ref[len(key) :]}"
                if ref == "#":
                    raise ValueError("schemas that refer to their own root ($ref '#') are not supported")
            return result
        if isinstance(node, list):
            return [rewrite(item) for item in node]
        return node

    return rewrite(body), {name: rewrite(definition) for name, definition in definitions.items()}


GRAMMAR_MAX_STRING_LENGTH = 800
"""Longest `maxLength` kept in a grammar: llama.cpp expands it into one nested rule per
character and refuses grammars past about 1,000 ("exceeds sane defaults")."""


def grammar_schema(schema: JsonSchema, *, max_items: int) -> JsonSchema:
    """A copy of `schema` fit for grammar-constrained generation.

    - Arrays without `maxItems` get `max_items`: generation only ends when the grammar lets it,
      and a small model that keeps choosing "one more item" would otherwise run into the token
      cap and leave broken JSON.
    - String bounds above `GRAMMAR_MAX_STRING_LENGTH` are dropped from the grammar (they stay in
      the schema the answer is validated against).
    - Integers with a small closed range become an enum: llama-cpp-python's grammar converter
      ignores `minimum`/`maximum` (a 1-5 score came back as 10).
    """

    def adapt(node: Any) -> Any:
        if isinstance(node, list):
            return [adapt(item) for item in node]
        if not isinstance(node, dict):
            return node
        result = {
            key: value if key in ("enum", "const", "default") else adapt(value) for key, value in node.items()
        }
        kinds = result.get("type")
        if (kinds == "array" or (isinstance(kinds, list) and "array" in kinds)) and "maxItems" not in result:
            result["maxItems"] = max(max_items, int(result.get("minItems", 0)))
        if isinstance(result.get("maxLength"), int) and result["maxLength"] > GRAMMAR_MAX_STRING_LENGTH:
            del result["maxLength"]
        if result.get("type") == "integer" and "enum" not in result:
            allowed = _small_integer_range(result)
            if allowed is not None:
                result["enum"] = allowed
        return result

    adapted: JsonSchema = adapt(schema)
    return adapted


def _small_integer_range(schema: JsonSchema, limit: int = 256) -> list[int] | None:
    low = schema.get("minimum")
    if isinstance(schema.get("exclusiveMinimum"), int | float):
        low = math.floor(schema["exclusiveMinimum"]) + 1
    high = schema.get("maximum")
    if isinstance(schema.get("exclusiveMaximum"), int | float):
        high = math.ceil(schema["exclusiveMaximum"]) - 1
    if not isinstance(low, int | float) or not isinstance(high, int | float):
        return None
    low, high = math.ceil(low), math.floor(high)
    if high < low or high - low >= limit:
        return None
    return list(range(low, high + 1))


def compact_schema(schema: JsonSchema) -> str:
    """`schema` as short JSON for a prompt: no `title` keys, no spaces (prompt tokens cost time)."""

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {
                key: strip(value)
                for key, value in node.items()
                if key != "title" or not isinstance(value, str)
            }
        if isinstance(node, list):
            return [strip(item) for item in node]
        return node

    return json.dumps(strip(schema), separators=(",", ":"))
