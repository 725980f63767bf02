"""`response_format` through the ASGI application in this process and the official openai client: JSON schemas whose
answers validate, json_object, the client's own `parse` helper, streaming, and 400s that name what
cannot be enforced."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.conftest import DEMO
from tests.pool.constraint_schemas import SCHEMAS

MAX_TOKENS = 160


@pytest.fixture(scope="module")
def server(module_asgi_server, demo_model_dir):
    return module_asgi_server({DEMO: demo_model_dir})


def ask(client, question: str, response_format: dict, **kw):
    return client.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": question}],
                                          response_format=response_format, temperature=0, max_tokens=MAX_TOKENS, **kw)


def json_schema_format(name: str, schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def test_ten_schemas_answer_with_json_that_validates(server):
    """All ten at once: the server batches them (each request has its own grammar)."""
    client = server.openai()
    with ThreadPoolExecutor(len(SCHEMAS)) as pool:
        replies = dict(zip(SCHEMAS, pool.map(
            lambda name: ask(client, SCHEMAS[name][1], json_schema_format(name, SCHEMAS[name][0])), SCHEMAS)))
    for name, reply in replies.items():
        choice = reply.choices[0]
        assert choice.finish_reason == "stop", (name, choice.message.content)
        jsonschema.validate(json.loads(choice.message.content), SCHEMAS[name][0],
                            format_checker=jsonschema.FormatChecker())


def test_json_object(server):
    reply = ask(server.openai(), 'What is the capital of France? Reply in JSON with the key "capital".',
                {"type": "json_object"})
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


class City(BaseModel):
    name: str = Field(max_length=30)
    country: str = Field(max_length=30)
    size: Literal["small", "medium", "large"]


def test_the_clients_parse_helper_gets_its_model(server):
    """openai's `chat.completions.parse` sends a strict schema made from a pydantic model and
    parses the answer back into it."""
    reply = server.openai().chat.completions.parse(
        model=DEMO, messages=[{"role": "user", "content": "Tell me about Paris."}], response_format=City,
        temperature=0, max_tokens=MAX_TOKENS)
    city = reply.choices[0].message.parsed
    assert isinstance(city, City) and city.name


def test_streamed_answer_validates(server):
    schema, question = SCHEMAS["nested_enum_bounds"]
    stream = ask(server.openai(), question, json_schema_format("record", schema), stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    jsonschema.validate(json.loads(text), schema)


def test_text_format_is_unconstrained(server):
    reply = ask(server.openai(), "What is the capital of France?", {"type": "text"})
    assert "Paris" in reply.choices[0].message.content


@pytest.mark.parametrize("response_format, named, code", [
    (json_schema_format("x", {"type": "array", "uniqueItems": True}), "uniqueItems", "unsupported_schema"),
    (json_schema_format("x", {"type": "string", "pattern": "^(?=a)"}), "look-around", "unsupported_schema"),
    (json_schema_format("x", {"type": "hiccup"}), "hiccup", "unsupported_schema"),
    ({"type": "json_object", "schema": {"not": {}}}, "not", "unsupported_schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": 123}}, "schema", None),
    ({"type": "json_schema"}, "json_schema", None),
    ({"type": "sound"}, "sound", None),
    ("json", "response_format", None),
])
def test_what_cannot_be_enforced_is_a_400_naming_it(server, response_format, named, code):
    with pytest.raises(openai.BadRequestError) as raised:
        ask(server.openai(), "hi", response_format)
    error = raised.value.body
    assert raised.value.status_code == 400 and error["param"] == "response_format"
    assert named in error["message"] and error["code"] == code
