"""What constrained decoding cannot enforce is named (pool/serving/constraints.py): the schema keywords,
formats, patterns and $refs it refuses, in a response format or a tool's parameters, and the feature read
out of the grammar library's own message. The decoding itself is in test_constraints.py."""

from __future__ import annotations

import pytest

from pool.serving.constraints import UnsupportedSchema, json_schema, tool_calls, unsupported_feature


@pytest.mark.parametrize("schema, feature", [
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
    ({"not": {"type": "string"}}, "not"),
    ({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}, "if, then"),
    ({"type": "array", "contains": {"type": "integer"}}, "contains"),
    ({"type": "object", "dependentRequired": {"a": ["b"]}}, "dependentRequired"),
    ({"type": "string", "format": "hostname-ish"}, "hostname-ish"),
    ({"type": "string", "pattern": "^(?=a)abc$"}, "look-around"),
    ({"$ref": "https://example.com/schema.json"}, "https://example.com/schema.json"),
    ({"type": "hiccup"}, "hiccup"),
    ([1, 2], "JSON object"),
])
def test_unsupported_schema_names_the_feature(schema, feature):
    with pytest.raises(UnsupportedSchema) as raised:
        json_schema(schema, True)
    assert feature in raised.value.feature


def test_unsupported_parameters_of_a_tool_are_named():
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"xs": {"type": "array", "uniqueItems": True}}}}}
    with pytest.raises(UnsupportedSchema, match="uniqueItems"):
        tool_calls([tool], None, True)


@pytest.mark.parametrize("message, feature", [
    ('Unimplemented keys: ["uniqueItems"]', "uniqueItems"),
    ('Unimplemented keys: ["if", "then"]', "if, then"),
    ("Unknown format: weird", "Unknown format: weird"),
    ("regex parse error:\n    ^(?=a)$\n     ^^^\nerror: look-around is not supported",
     "regex parse error: ^(?=a)$ error: look-around is not supported"),
    ("", "unknown error"),
])
def test_unsupported_feature_from_the_library_message(message, feature):
    assert unsupported_feature(message) == feature
