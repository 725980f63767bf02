"""The bounds a schema leaves open, closed for decoding: a constraint that ends the way clients expect.

A schema made from a pydantic model (LangChain's and instructor's) bounds nothing: its objects leave
`additionalProperties` out, so JSON Schema lets a model add keys forever, and its integers and
strings have no size, so `"population": 2111111...` is valid to any length. A small model takes
that road until `max_tokens`. llama.cpp closes objects unless the schema opens them and bounds a
number's digits; llguidance has no such setting, so `bounded` tightens a copy of the schema before
it is compiled. Every value the copy allows is valid against the original: only the client's
schema is validated against, and it still holds.

- An object with `properties` and no `additionalProperties` (nor `patternProperties`) takes only
  its declared properties. Objects combined with `allOf`, `anyOf`, `oneOf` or `$ref` are left as
  they are: closing one side of an intersection would forbid the other side's properties; so are
  objects that count their properties or require one they do not declare (closed, they could
  not be written).
- An integer without `maximum` (or `minimum`) gets +-(2**53 - 1), the integers every JSON parser
  reads exactly (16 digits); a number the same, and `multipleOf` 1e-9 (nine decimals) without one.
- A string without `maxLength`, `pattern`, `format`, `enum` or `const` gets `maxLength` 4096.
- Arrays are left unbounded: their length is the client's to choose (`maxItems`)."""

from __future__ import annotations

from typing import Any

MAX_SAFE_INTEGER = 2**53 - 1        # JavaScript's Number.MAX_SAFE_INTEGER: 16 digits
NUMBER_STEP = 1e-9                  # a number's decimals: nine at most
STRING_MAX_LENGTH = 4096            # characters
_OPENING = ("additionalProperties", "patternProperties", "minProperties", "maxProperties",
            "allOf", "anyOf", "oneOf", "$ref")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_VALUES = ("additionalProperties", "items", "not", "if", "then", "else", "contains")
_STRING_BOUNDS = ("maxLength", "pattern", "format", "enum", "const")


def bounded(schema: Any) -> Any:
    """A copy of `schema` with its open ends closed (see the module's docstring); not a schema
    (a bool, a list): unchanged."""
    if not isinstance(schema, dict):
        return schema
    return _bound(schema, _intersected_refs(schema))


def _bound(node: Any, open_refs: frozenset[str], *, path: str = "#", close: bool = True) -> Any:
    if isinstance(node, list):      # an old draft's `items` list
        return [_bound(n, open_refs, path=path) for n in node]
    if not isinstance(node, dict):
        return node
    out = dict(node)
    for key in _SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            # the members of an intersection stay open (each would forbid the others' properties)
            members = not (key == "allOf" and len(node[key]) > 1)
            out[key] = [_bound(n, open_refs, path=f"{path}/{key}/{i}", close=members)
                        for i, n in enumerate(node[key])]
    for key in _SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            out[key] = {name: _bound(n, open_refs, path=f"{path}/{key}/{name}") for name, n in node[key].items()}
    for key in _SCHEMA_VALUES:
        if key in node:
            out[key] = _bound(node[key], open_refs, path=f"{path}/{key}")
    if "enum" in node or "const" in node:
        return out
    types = _types(node)
    if close and _closable(node) and path not in open_refs:
        out["additionalProperties"] = False
    if types & {"integer", "number"}:
        _bound_number(out, step="multipleOf" not in node and "integer" not in types)
    if "string" in types and not any(k in node for k in _STRING_BOUNDS):
        out["maxLength"] = STRING_MAX_LENGTH
    return out


def _types(node: dict) -> set[str]:
    kind = node.get("type")
    if isinstance(kind, str):
        return {kind}
    return {k for k in kind if isinstance(k, str)} if isinstance(kind, list) else set()


def _closable(node: dict) -> bool:
    types = _types(node)
    properties, required = node.get("properties"), node.get("required")
    undeclared = isinstance(required, list) and isinstance(properties, dict) and not set(required) <= set(properties)
    return (isinstance(properties, dict) and (not types or "object" in types)
            and not any(k in node for k in _OPENING) and not undeclared)


def _bound_number(out: dict, *, step: bool) -> None:
    if not all(_number(out[k]) for k in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum") if k in out):
        return                      # a draft-4 boolean or a bad bound: left for llguidance to judge
    low = out.get("minimum", out.get("exclusiveMinimum"))
    high = out.get("maximum", out.get("exclusiveMaximum"))
    if high is None and (low is None or low <= MAX_SAFE_INTEGER):
        out["maximum"] = MAX_SAFE_INTEGER
    if low is None and (high is None or high >= -MAX_SAFE_INTEGER):
        out["minimum"] = -MAX_SAFE_INTEGER
    if step:
        out["multipleOf"] = NUMBER_STEP


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _intersected_refs(schema: dict) -> frozenset[str]:
    """The `$ref`s that are members of an `allOf` of two or more schemas (a model's base class, say):
    their targets stay open, or the intersection would forbid the other members' properties."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for n in node:
                walk(n)
        elif isinstance(node, dict):
            members = node.get("allOf")
            if isinstance(members, list) and len(members) > 1:
                found.update(m["$ref"] for m in members if isinstance(m, dict) and isinstance(m.get("$ref"), str))
            for value in node.values():
                walk(value)
    walk(schema)
    return frozenset(found)
