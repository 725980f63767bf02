"""The bounds a schema leaves open, closed for decoding (pool/serving/schema_bounds.py): one row per
case of the rule, then what the compiled grammar takes and refuses, for a response format and a
forced call's arguments, on the demo model's tokenizer; and a named call is one call."""

from __future__ import annotations

import copy

import pytest
from llguidance import LLMatcher
from llguidance.hf import from_tokenizer
from pydantic import BaseModel
from transformers import AutoTokenizer

from pool.serving.constraints import TOOL_CALL_END, TOOL_CALL_START, json_schema, tool_calls
from pool.serving.schema_bounds import MAX_SAFE_INTEGER, NUMBER_STEP, STRING_MAX_LENGTH, bounded

INT = {"type": "integer", "minimum": -MAX_SAFE_INTEGER, "maximum": MAX_SAFE_INTEGER}
NUM = {"type": "number", "minimum": -MAX_SAFE_INTEGER, "maximum": MAX_SAFE_INTEGER, "multipleOf": NUMBER_STEP}
STR = {"type": "string", "maxLength": STRING_MAX_LENGTH}


class City(BaseModel):
    name: str
    population: int


CITY = City.model_json_schema()      # what LangChain and instructor send: nothing bounded


def obj(properties: dict, **rest) -> dict:
    return {"type": "object", "properties": properties, **rest}


@pytest.mark.parametrize("schema, expected", [
    # objects: closed unless the schema opens them
    (obj({}), obj({}, additionalProperties=False)),
    ({"properties": {"a": {"const": 1}}}, {"properties": {"a": {"const": 1}}, "additionalProperties": False}),
    (obj({}, additionalProperties=True), obj({}, additionalProperties=True)),
    (obj({}, additionalProperties={"type": "integer"}), obj({}, additionalProperties=INT)),
    (obj({}, patternProperties={"^x": {"type": "boolean"}}), obj({}, patternProperties={"^x": {"type": "boolean"}})),
    ({"type": "object"}, {"type": "object"}),                              # a free-form object stays free
    ({"type": ["object", "null"], "properties": {}},
     {"type": ["object", "null"], "properties": {}, "additionalProperties": False}),
    ({"type": "array", "properties": {}}, {"type": "array", "properties": {}}),   # not an object
    # intersections stay open: each side would forbid the other's properties
    ({"allOf": [obj({"a": {"type": "boolean"}}), obj({"b": {"type": "boolean"}})]},
     {"allOf": [obj({"a": {"type": "boolean"}}), obj({"b": {"type": "boolean"}})]}),
    ({"allOf": [obj({"a": {"type": "boolean"}})]},
     {"allOf": [obj({"a": {"type": "boolean"}}, additionalProperties=False)]}),
    ({"$defs": {"Base": obj({})}, "allOf": [{"$ref": "#/$defs/Base"}, obj({})]},
     {"$defs": {"Base": obj({})}, "allOf": [{"$ref": "#/$defs/Base"}, obj({})]}),
    (obj({}, anyOf=[{"required": ["a"]}]), obj({}, anyOf=[{"required": ["a"]}])),
    (obj({}, minProperties=1), obj({}, minProperties=1)),                # counted: extra ones are meant
    (obj({"a": {"const": 1}}, required=["a", "b"]), obj({"a": {"const": 1}}, required=["a", "b"])),
    (obj({"a": {"const": 1}}, required=["a"]), obj({"a": {"const": 1}}, required=["a"], additionalProperties=False)),
    ({"$defs": {"A": obj({})}, "$ref": "#/$defs/A"},
     {"$defs": {"A": obj({}, additionalProperties=False)}, "$ref": "#/$defs/A"}),
    # integers and numbers: 16 digits, nine decimals
    ({"type": "integer"}, INT),
    ({"type": "integer", "maximum": 5}, {"type": "integer", "maximum": 5, "minimum": -MAX_SAFE_INTEGER}),
    ({"type": "integer", "exclusiveMinimum": 0},
     {"type": "integer", "exclusiveMinimum": 0, "maximum": MAX_SAFE_INTEGER}),
    ({"type": "integer", "minimum": 1, "maximum": 9}, {"type": "integer", "minimum": 1, "maximum": 9}),
    ({"type": "integer", "minimum": 10**20}, {"type": "integer", "minimum": 10**20}),    # no empty range
    ({"type": "integer", "minimum": 0, "exclusiveMinimum": True},
     {"type": "integer", "minimum": 0, "exclusiveMinimum": True}),                       # draft 4: left as is
    ({"type": "number"}, NUM),
    ({"type": "number", "multipleOf": 0.5}, {**NUM, "multipleOf": 0.5}),
    ({"type": ["integer", "null"]}, {**INT, "type": ["integer", "null"]}),
    ({"enum": [1, 2]}, {"enum": [1, 2]}),
    ({"type": "integer", "const": 3}, {"type": "integer", "const": 3}),
    # strings
    ({"type": "string"}, STR),
    ({"type": ["string", "null"]}, {**STR, "type": ["string", "null"]}),
    ({"type": "string", "maxLength": 9}, {"type": "string", "maxLength": 9}),
    ({"type": "string", "pattern": "^a+$"}, {"type": "string", "pattern": "^a+$"}),
    ({"type": "string", "format": "date"}, {"type": "string", "format": "date"}),
    ({"type": "string", "enum": ["a"]}, {"type": "string", "enum": ["a"]}),
    # everywhere a schema holds schemas; arrays themselves stay unbounded
    ({"type": "array", "items": {"type": "string"}}, {"type": "array", "items": STR}),
    ({"type": "array", "prefixItems": [{"type": "integer"}]}, {"type": "array", "prefixItems": [INT]}),
    ({"items": [{"type": "string"}]}, {"items": [STR]}),
    ({"anyOf": [{"type": "integer"}, {"type": "null"}]}, {"anyOf": [INT, {"type": "null"}]}),
    ({"definitions": {"n": {"type": "number"}}}, {"definitions": {"n": NUM}}),
    # not schemas: unchanged
    (True, True),
    ([1], [1]),
    ({}, {}),
])
def test_bounded(schema, expected):
    before = copy.deepcopy(schema)
    assert bounded(schema) == expected
    assert schema == before                  # a copy: the client's schema is not touched


def test_a_pydantic_model_is_closed_and_bounded():
    assert bounded(CITY) == {**CITY, "additionalProperties": False, "properties": {
        "name": {**CITY["properties"]["name"], **STR}, "population": {**CITY["properties"]["population"], **INT}}}


@pytest.fixture(scope="module")
def llg_tokenizer(demo_model_dir):
    return from_tokenizer(AutoTokenizer.from_pretrained(demo_model_dir))


def takes(llg_tokenizer, grammar: str, text: str) -> bool:
    matcher = LLMatcher(llg_tokenizer, grammar, log_level=0)
    return matcher.consume_tokens(llg_tokenizer.tokenize_str(text)) and matcher.is_accepting()


def call(arguments: str) -> str:
    return f'{TOOL_CALL_START}\n{{"name": "city", "arguments": {arguments}}}\n{TOOL_CALL_END}'


@pytest.mark.parametrize("text, taken", [
    ('{"name": "Paris", "population": 2161000}', True),
    ('{"name": "Paris", "population": 2161000, "population_density": 1000000}', False),
    ('{"name": "Paris", "population": 9007199254740991}', True),
    ('{"name": "Paris", "population": 21111111111111111}', False),
    ('{"name": "' + "a" * STRING_MAX_LENGTH + '", "population": 1}', True),
    ('{"name": "' + "a" * (STRING_MAX_LENGTH + 1) + '", "population": 1}', False),
])
def test_the_grammar_of_a_pydantic_schema_ends(llg_tokenizer, text, taken):
    """The runaways of issue 24: keys added forever, digits without end."""
    assert takes(llg_tokenizer, json_schema(CITY).grammar, text) is taken
    tool = {"type": "function", "function": {"name": "city", "parameters": CITY}}
    assert takes(llg_tokenizer, tool_calls([tool], "city", False).grammar, call(text)) is taken


def test_a_schema_that_opens_its_object_keeps_it_open(llg_tokenizer):
    schema = {**CITY, "additionalProperties": {"type": "integer"}}
    text = '{"name": "Paris", "population": 2161000, "arrondissements": 20}'
    assert takes(llg_tokenizer, json_schema(schema).grammar, text)


def test_a_named_call_is_one_call_and_required_may_be_more(llg_tokenizer):
    """instructor's Mode.TOOLS names the function and leaves parallel_tool_calls at true: the demo
    model wrote the same call until max_tokens."""
    tool = {"type": "function", "function": {"name": "city", "parameters": CITY}}
    one = call('{"name": "Paris", "population": 1}')
    assert takes(llg_tokenizer, tool_calls([tool], "city", True).grammar, one)
    assert not takes(llg_tokenizer, tool_calls([tool], "city", True).grammar, one + "\n" + one)
    assert takes(llg_tokenizer, tool_calls([tool], None, True).grammar, one + "\n" + one)
