"""The Responses API's request side and event sequence, as tables of cases: `input` items -> chat
messages, each field -> what the CompletionSpec or the echoed response gets, bad bodies named by
field, `truncation: "auto"`'s dropping, and the stream's events for text and calls. The routes are
in test_responses_routes.py."""

import pytest

from pool.api.responses.events import EventStream
from pool.api.responses.items import cuts, input_items, messages
from pool.api.responses.parse import parse_responses
from pool.api.responses.shapes import Response, Text, output_items, status_of
from pool.errors import InvalidRequest
from pool.serving.constraints import json_object
from pool.tools.calls import ToolCall

M = "m"
CALL = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}
OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "21 degrees"}
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}

# ---- input -> chat messages ---------------------------------------------------------------------

INPUTS = [
    ("a string", "hi", [{"role": "user", "content": "hi"}]),
    ("a message, no type", [{"role": "user", "content": "hi"}], [{"role": "user", "content": "hi"}]),
    ("input_text parts", [{"type": "message", "role": "user",
                           "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]}],
     [{"role": "user", "content": "ab"}]),
    ("developer is system", [{"role": "developer", "content": "Be brief."}],
     [{"role": "system", "content": "Be brief."}]),
    ("assistant output_text", [{"role": "assistant", "content": [{"type": "output_text", "text": "hello",
                                                                 "annotations": []}]}],
     [{"role": "assistant", "content": "hello"}]),
    ("a call and its output", [{"role": "user", "content": "w?"}, CALL, OUTPUT],
     [{"role": "user", "content": "w?"},
      {"role": "assistant", "content": "", "tool_calls": [
          {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees"}]),
    ("text then two calls: one assistant turn",
     [{"role": "assistant", "content": "Let me look."}, CALL, {**CALL, "call_id": "call_2"}],
     [{"role": "assistant", "content": "Let me look.", "tool_calls": [
         {"id": f"call_{i}", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
         for i in (1, 2)]}]),
    ("output as parts", [{**OUTPUT, "output": [{"type": "input_text", "text": "21"}]}],
     [{"role": "tool", "tool_call_id": "call_1", "content": "21"}]),
    ("reasoning skipped", [{"type": "reasoning", "id": "rs_1", "summary": []}, {"role": "user", "content": "hi"}],
     [{"role": "user", "content": "hi"}]),
]


@pytest.mark.parametrize("given, expected", [c[1:] for c in INPUTS], ids=[c[0] for c in INPUTS])
def test_input_to_messages(given, expected):
    assert messages(input_items(given)) == expected


def test_items_are_kept_with_ids_and_parts():
    items = input_items("hi")
    assert items[0]["id"].startswith("msg_") and items[0]["content"] == [{"type": "input_text", "text": "hi"}]
    assert input_items([{**CALL, "id": "fc_9"}])[0]["id"] == "fc_9"


BAD_INPUTS = [
    ("empty list", [], "input"),
    ("a number", 3, "input"),
    ("not an object", ["hi"], "input[0]"),
    ("bad role", [{"role": "robot", "content": "x"}], "input[0].role"),
    ("an image part that is no URL", [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}],
     "input[0].content[0].image_url"),
    ("a file part", [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}], "input[0].content[0]"),
    ("item_reference", [{"type": "item_reference", "id": "msg_1"}], "input[0].type"),
    ("call without name", [{**CALL, "name": None}], "input[0].name"),
    ("output without call_id", [{"type": "function_call_output", "output": "x"}], "input[0].call_id"),
]


@pytest.mark.parametrize("given, param", [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_names_the_item(given, param):
    with pytest.raises(InvalidRequest) as caught:
        input_items(given)
    assert caught.value.param == param


def test_cuts_keep_calls_with_their_outputs():
    items = input_items([{"role": "user", "content": "a"}, CALL, OUTPUT, {"role": "user", "content": "b"}])
    assert cuts(items) == [0, 3]
    assert cuts(items[-1:]) == [0]


# ---- fields -> the spec and the echo ------------------------------------------------------------

FIELDS = [
    ("max_output_tokens", {"max_output_tokens": 50}, "max_tokens", 50),
    ("temperature", {"temperature": 0.5}, "temperature", 0.5),
    ("top_p", {"top_p": 0.9}, "top_p", 0.9),
    ("seed", {"seed": 7}, "seed", 7),
    ("keep_alive", {"keep_alive": "5m"}, "keep_alive", 300.0),
    ("cache_prompt", {"cache_prompt": False}, "cache_prompt", False),
    ("kv field", {"max_kv_size": 4096}, "kv", {"max_kv_size": 4096}),
    ("no format", {}, "constraint", None),
    ("text format", {"text": {"format": {"type": "text"}}}, "constraint", None),
    ("json_object", {"text": {"format": {"type": "json_object"}}}, "constraint", json_object()),
    ("tool_choice default", {"tools": [WEATHER]}, "tool_choice", "auto"),
    ("tool_choice named", {"tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_weather"}},
     "tool_choice", {"type": "function", "function": {"name": "get_weather"}}),
    ("parallel_tool_calls", {"tools": [WEATHER], "parallel_tool_calls": False}, "parallel_tool_calls", False),
]


@pytest.mark.parametrize("body, field, value", [c[1:] for c in FIELDS], ids=[c[0] for c in FIELDS])
def test_field_reaches_the_spec(body, field, value):
    spec = parse_responses({"model": M, "input": "hi", **body}).spec([])
    assert getattr(spec, field) == value


def test_tools_become_chat_function_tools():
    spec = parse_responses({"model": M, "input": "hi", "tools": [WEATHER]}).spec([])
    assert spec.tools == ({"type": "function", "function": {k: WEATHER[k] for k in ("name", "description",
                                                                                     "parameters")}},)


def test_hosted_tools_are_left_out_and_a_namespaces_functions_offered():
    """What Codex sends: function tools, a `namespace` of function tools, and `web_search`."""
    agents = {"type": "namespace", "name": "multi_agent_v1", "description": "sub-agents",
              "tools": [{**WEATHER, "name": "spawn_agent"}]}
    req = parse_responses({"model": M, "input": "hi", "tools": [WEATHER, agents, {"type": "web_search"},
                                                                 {"type": "web_search_preview"}]})
    assert [t["function"]["name"] for t in req.spec([]).tools] == ["get_weather", "spawn_agent"]
    assert req.namespaces == {"spawn_agent": "multi_agent_v1"}
    assert [t.get("namespace") for t in req.echo["tools"]] == [None, "multi_agent_v1"]
    call = ToolCall(id="call_2", name="spawn_agent", arguments="{}")
    assert [i.get("namespace") for i in output_items([CALLED, call], req.namespaces)] == [None, "multi_agent_v1"]


def test_json_schema_format_is_a_constraint():
    body = {"text": {"format": {"type": "json_schema", "name": "c", "strict": True,
                                "schema": {"type": "object", "properties": {"a": {"type": "string"}}}}}}
    req = parse_responses({"model": M, "input": "hi", **body})
    assert req.spec([]).constraint is not None and req.echo["text"] == body["text"]


def test_instructions_lead_and_earlier_items_follow():
    req = parse_responses({"model": M, "input": "now", "instructions": "Be brief."})
    earlier = input_items([{"role": "user", "content": "before"}, {"role": "assistant", "content": "ok"}])
    assert req.spec([*earlier, *req.input]).messages == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "before"},
        {"role": "assistant", "content": "ok"}, {"role": "user", "content": "now"}]


ECHO = [
    ("store default", {}, "store", True),
    ("store false", {"store": False}, "store", False),
    ("metadata", {"metadata": {"a": "b"}}, "metadata", {"a": "b"}),
    ("metadata default", {}, "metadata", {}),
    ("truncation default", {}, "truncation", "disabled"),
    ("truncation auto", {"truncation": "auto"}, "truncation", "auto"),
    ("previous", {"previous_response_id": "resp_1"}, "previous_response_id", "resp_1"),
    ("tools flat", {"tools": [WEATHER]}, "tools", [{**WEATHER, "strict": False}]),
    ("text default", {}, "text", {"format": {"type": "text"}}),
    ("max_output_tokens", {"max_output_tokens": 9}, "max_output_tokens", 9),
]


@pytest.mark.parametrize("body, field, value", [c[1:] for c in ECHO], ids=[c[0] for c in ECHO])
def test_field_is_echoed(body, field, value):
    assert parse_responses({"model": M, "input": "hi", **body}).echo[field] == value


DROP = object()     # a field left out
BAD = [
    ("no model", {"model": DROP}, "model"),
    ("no input", {"input": DROP}, "input"),
    ("max_output_tokens 0", {"max_output_tokens": 0}, "max_output_tokens"),
    ("temperature 3", {"temperature": 3}, "temperature"),
    ("top_p 0", {"top_p": 0}, "top_p"),
    ("store not bool", {"store": "yes"}, "store"),
    ("stream not bool", {"stream": 1}, "stream"),
    ("instructions not str", {"instructions": 3}, "instructions"),
    ("previous not str", {"previous_response_id": 3}, "previous_response_id"),
    ("metadata value", {"metadata": {"a": 1}}, "metadata"),
    ("metadata too many", {"metadata": {str(i): "x" for i in range(17)}}, "metadata"),
    ("truncation", {"truncation": "middle"}, "truncation"),
    ("a client tool in another shape", {"tools": [{"type": "custom", "name": "apply_patch"}]}, "tools[0].type"),
    ("local_shell", {"tools": [WEATHER, {"type": "local_shell"}]}, "tools[1].type"),
    ("namespace without tools", {"tools": [{"type": "namespace", "name": "ns"}]}, "tools[0].tools"),
    ("namespace of a hosted tool", {"tools": [{"type": "namespace", "name": "ns", "tools": [{"type": "mcp"}]}]},
     "tools[0].tools[0].type"),
    ("tool name", {"tools": [{**WEATHER, "name": "bad name"}]}, "tools[0].name"),
    ("tool_choice unknown", {"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ("tool_choice required without tools", {"tool_choice": "required"}, "tool_choice"),
    ("parallel not bool", {"tools": [WEATHER], "parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ("format type", {"text": {"format": {"type": "xml"}}}, "text.format"),
    ("json_schema without name", {"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
    ("json_schema without schema", {"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ("background", {"background": True}, "background"),
    ("conversation", {"conversation": "conv_1"}, "conversation"),
    ("kv field", {"kv_bits": 3}, "kv_bits"),
]


@pytest.mark.parametrize("body, param", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_field_is_a_400_naming_it(body, param):
    with pytest.raises(InvalidRequest) as caught:
        parse_responses({k: v for k, v in {"model": M, "input": "hi", **body}.items() if v is not DROP})
    assert caught.value.param == param


# ---- the answer ---------------------------------------------------------------------------------

CALLED = ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}')


def test_output_items_join_text_and_keep_calls_apart():
    items = output_items([Text("Let "), Text("me look."), CALLED])
    assert [i["type"] for i in items] == ["message", "function_call"]
    assert items[0]["content"][0]["text"] == "Let me look." and items[1]["call_id"] == "call_1"


@pytest.mark.parametrize("reason, output, requested, status", [
    ("stop", [], 10, ("completed", None)),
    ("length", [], 10, ("incomplete", {"reason": "max_output_tokens"})),
    ("length", [], None, ("incomplete", {"reason": "max_output_tokens", "limit": "server_default",
                                         "max_output_tokens": 7})),
    ("length", [{"type": "function_call"}], None, ("completed", None)),
])
def test_status(reason, output, requested, status):
    assert status_of(reason, output, requested=requested, output_tokens=7) == status


def test_event_sequence_for_text_then_a_call():
    stream = EventStream(Response(model=M, echo={}))
    events = stream.start() + stream.feed(Text("He")) + stream.feed(Text("llo")) + stream.feed(CALLED)
    events += stream.finish(finish_reason="stop", usage={})
    events.append(stream.final_event())
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["output_index"] for e in events if "output_index" in e] == [0] * 7 + [1] * 4
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "Hello"


def test_failure_events():
    stream = EventStream(Response(model=M, echo={}))
    events = stream.start() + stream.feed(Text("x")) + stream.fail(code="engine_failed", message="boom", param=None)
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert events[-1]["response"]["status"] == "failed" and events[-1]["response"]["error"]["message"] == "boom"
