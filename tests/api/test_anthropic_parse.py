"""Anthropic's Messages API, the request side, as tables of cases: the body's system, messages and content
blocks -> OpenAI-style chat messages, bad bodies named by field, the sampling fields that reach the spec,
and `tools` / `tool_choice` -> OpenAI function tools. The answer's shapes are in test_anthropic_events.py,
the routes in test_anthropic_routes.py."""

import pytest

from pool.api.anthropic.parse import chat_messages, parse_count_tokens, parse_messages, tool_fields
from pool.errors import InvalidRequest
from tests.api.anthropic_fixtures import QUESTION, WEATHER, WEATHER_FN

# ---- the body -> OpenAI-style messages -----------------------------------------------------------

CALL = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}

MESSAGES = [
    ("a string", None, [{"role": "user", "content": "hi"}],
     [{"role": "user", "content": "hi"}]),
    ("system string", "Be brief.", [{"role": "user", "content": "hi"}],
     [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]),
    ("system blocks",
     [{"type": "text", "text": "A."}, {"type": "text", "text": "B.", "cache_control": {"type": "ephemeral"}}],
     [{"role": "user", "content": "hi"}],
     [{"role": "system", "content": "A.\n\nB."}, {"role": "user", "content": "hi"}]),
    ("empty system", "", [{"role": "user", "content": "hi"}], [{"role": "user", "content": "hi"}]),
    ("text blocks", None, [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
     [{"role": "user", "content": "a\n\nb"}]),
    ("assistant text", None,
     [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "text", "text": "hello"}]}],
     [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]),
    ("tool round trip", None,
     [{"role": "user", "content": "weather?"},
      {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}, CALL]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                                   {"type": "text", "text": "and tomorrow?"}]}],
     [{"role": "user", "content": "weather?"},
      {"role": "assistant", "content": "Let me look.", "tool_calls": [
          {"id": "toolu_1", "type": "function",
           "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
      {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
      {"role": "user", "content": "and tomorrow?"}]),
    ("tool_result blocks, error, empty", None,
     [{"role": "assistant", "content": [CALL, {**CALL, "id": "toolu_2", "input": {}}]},
      {"role": "user", "content": [
          {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "no such city"}],
           "is_error": True},
          {"type": "tool_result", "tool_use_id": "toolu_2"}]}],
     [{"role": "assistant", "content": "", "tool_calls": [
         {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
         {"id": "toolu_2", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: no such city"},
      {"role": "tool", "tool_call_id": "toolu_2", "content": ""}]),
    ("thinking dropped", None,
     [{"role": "user", "content": "hi"},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "x"},
                                        {"type": "text", "text": "yo"}]}],
     [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]),
    ("empty user blocks", None, [{"role": "user", "content": []}], [{"role": "user", "content": ""}]),
]


@pytest.mark.parametrize("name,system,messages,expected", MESSAGES, ids=[m[0] for m in MESSAGES])
def test_chat_messages(name, system, messages, expected):
    assert chat_messages(system, messages) == expected


BAD_BODIES = [
    ({"messages": QUESTION, "max_tokens": 5}, "model"),
    ({"model": "m", "messages": QUESTION}, "max_tokens"),
    ({"model": "m", "messages": QUESTION, "max_tokens": 0}, "max_tokens"),
    ({"model": "m", "messages": QUESTION, "max_tokens": True}, "max_tokens"),
    ({"model": "m", "messages": [], "max_tokens": 5}, "messages"),
    ({"model": "m", "messages": "hi", "max_tokens": 5}, "messages"),
    ({"model": "m", "messages": [{"role": "system", "content": "x"}], "max_tokens": 5}, "messages.0.role"),
    ({"model": "m", "messages": [{"role": "user", "content": 5}], "max_tokens": 5}, "messages.0.content"),
    ({"model": "m", "messages": [{"role": "user", "content": [{"text": "x"}]}], "max_tokens": 5},
     "messages.0.content.0"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]},
     "messages.0.content.0.source.data"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]},
     "messages.0.content.0.text"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_use", **CALL}]}]},
     "messages.0.content.0.type"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "assistant", "content": [{**CALL, "input": "x"}]}]},
     "messages.0.content.0.input"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "assistant", "content": [{**CALL, "id": None}]}]},
     "messages.0.content.0.id"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
     "messages.0.content.0.tool_use_id"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "is_error": "yes"}]}]}, "messages.0.content.0.is_error"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]}]}]},
     "messages.0.content.0.content.0.type"),
    ({"model": "m", "messages": QUESTION, "max_tokens": 5, "system": 3}, "system"),
    ({"model": "m", "messages": QUESTION, "max_tokens": 5, "system": [{"type": "image"}]}, "system.0.type"),
    ({"model": "m", "messages": QUESTION, "max_tokens": 5, "temperature": 1.5}, "temperature"),
    ({"model": "m", "messages": QUESTION, "max_tokens": 5, "top_p": 0}, "top_p"),
    ({"model": "m", "messages": QUESTION, "max_tokens": 5, "top_k": -1}, "top_k"),
    ({"model": "m", "messages": QUESTION, "max_tokens": 5, "stop_sequences": "x"}, "stop_sequences"),
    ({"model": "m", "messages": QUESTION, "max_tokens": 5, "stream": "yes"}, "stream"),
]


@pytest.mark.parametrize("body,param", BAD_BODIES, ids=[b[1] for b in BAD_BODIES])
def test_bad_bodies_name_the_field(body, param):
    with pytest.raises(InvalidRequest) as e:
        parse_messages(body)
    assert e.value.param == param
    assert param.split(".")[0] in e.value.message


def test_sampling_fields_reach_the_spec():
    req = parse_messages({"model": "m", "messages": QUESTION, "max_tokens": 7, "temperature": 0.5, "top_p": 0.9,
                          "top_k": 40, "stop_sequences": ["\n\n", ""], "stream": True,
                          "metadata": {"user_id": "u"}, "thinking": {"type": "disabled"}})
    assert req.stream
    spec = req.spec
    assert (spec.model, spec.max_tokens, spec.temperature, spec.top_p, spec.stop) == ("m", 7, 0.5, 0.9, ("\n\n",))
    assert spec.messages == [{"role": "user", "content": "What is the capital of France?"}]
    assert parse_count_tokens({"model": "m", "messages": QUESTION, "system": "S"}).messages[0] == \
        {"role": "system", "content": "S"}


# ---- tools -> OpenAI function tools --------------------------------------------------------------

TIME = {"name": "time", "input_schema": {"type": "object"}}
TIME_FN = {"type": "function", "function": {"name": "time", "parameters": {"type": "object"}}}

TOOLS = [
    ("none", None, None, {}),
    ("tools, no choice", [WEATHER, TIME], None,
     {"tools": (WEATHER_FN, TIME_FN), "tool_choice": "auto", "parallel_tool_calls": True}),
    ("custom type", [{**TIME, "type": "custom", "cache_control": {"type": "ephemeral"}}], {"type": "auto"},
     {"tools": (TIME_FN,), "tool_choice": "auto", "parallel_tool_calls": True}),
    ("any", [WEATHER], {"type": "any"},
     {"tools": (WEATHER_FN,), "tool_choice": "required", "parallel_tool_calls": True}),
    ("tool, no parallel", [WEATHER, TIME], {"type": "tool", "name": "time", "disable_parallel_tool_use": True},
     {"tools": (WEATHER_FN, TIME_FN), "tool_choice": {"type": "function", "function": {"name": "time"}},
      "parallel_tool_calls": False}),
    ("none choice", [WEATHER], {"type": "none"},
     {"tools": (WEATHER_FN,), "tool_choice": "none", "parallel_tool_calls": True}),
    ("auto without tools", None, {"type": "auto"}, {"tools": (), "tool_choice": "auto", "parallel_tool_calls": True}),
]


@pytest.mark.parametrize("name,tools,choice,expected", TOOLS, ids=[t[0] for t in TOOLS])
def test_tool_fields(name, tools, choice, expected):
    assert tool_fields(tools, choice) == expected


BAD_TOOLS = [
    ({"name": "x"}, None, "tools.0.input_schema"),
    ({"name": "bad name", "input_schema": {"type": "object"}}, None, "tools.0.name"),
    ({"name": "x", "input_schema": {"type": "string"}}, None, "tools.0.input_schema"),
    ({"name": "x", "description": 3, "input_schema": {"type": "object"}}, None, "tools.0.description"),
    ({"type": "web_search_20250305", "name": "web_search"}, None, "tools.0.type"),
    (WEATHER, {"type": "tool", "name": "nope"}, "tool_choice.name"),
    (WEATHER, {"type": "maybe"}, "tool_choice.type"),
    (WEATHER, "auto", "tool_choice"),
    (WEATHER, {"type": "auto", "disable_parallel_tool_use": "no"}, "disable_parallel_tool_use"),
    (None, {"type": "any"}, "tool_choice.type"),
]


@pytest.mark.parametrize("tool,choice,param", BAD_TOOLS, ids=[b[2] + str(i) for i, b in enumerate(BAD_TOOLS)])
def test_bad_tools_name_the_field(tool, choice, param):
    with pytest.raises(InvalidRequest) as e:
        tool_fields(None if tool is None else [tool], choice)
    assert e.value.param == param


def test_repeated_tool_names_are_refused():
    with pytest.raises(InvalidRequest) as e:
        tool_fields([WEATHER, WEATHER], None)
    assert e.value.param == "tools.1.name"
