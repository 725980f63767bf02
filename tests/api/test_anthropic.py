"""Anthropic's Messages API: the body -> spec translation and the answer's shapes as tables of
cases, then the routes through the ASGI application in this process with the official `anthropic` client."""

import json
import threading

import anthropic
import httpx
import pytest

from pool.api.anthropic import events
from pool.api.anthropic.events import EventStream, Text, ToolUse
from pool.api.anthropic.parse import chat_messages, parse_count_tokens, parse_messages, tool_fields
from pool.api.auth import given_keys
from pool.api.dialects import ANTHROPIC
from pool.api.errors import envelope, error_response
from pool.errors import InvalidRequest
from tests.conftest import DEMO

KEY = "test-key-123"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


# ---- the body -> OpenAI-style messages -----------------------------------------------------------

CALL = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}

MESSAGES = [
    ("a string", None, [{"role": "user", "content": "hi"}],
     [{"role": "user", "content": "hi"}]),
    ("system string", "Be brief.", [{"role": "user", "content": "hi"}],
     [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]),
    ("system blocks", [{"type": "text", "text": "A."}, {"type": "text", "text": "B.", "cache_control": {"type": "ephemeral"}}],
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
          {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
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
    ({"model": "m", "messages": [{"role": "user", "content": [{"text": "x"}]}], "max_tokens": 5}, "messages.0.content.0"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]},
     "messages.0.content.0.type"),
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

WEATHER = {"name": "get_weather", "description": "Weather of a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
WEATHER_FN = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                               "parameters": WEATHER["input_schema"]}}
TIME = {"name": "time", "input_schema": {"type": "object"}}
TIME_FN = {"type": "function", "function": {"name": "time", "parameters": {"type": "object"}}}

TOOLS = [
    ("none", None, None, {}),
    ("tools, no choice", [WEATHER, TIME], None,
     {"tools": (WEATHER_FN, TIME_FN), "tool_choice": "auto", "parallel_tool_calls": True}),
    ("custom type", [{**TIME, "type": "custom", "cache_control": {"type": "ephemeral"}}], {"type": "auto"},
     {"tools": (TIME_FN,), "tool_choice": "auto", "parallel_tool_calls": True}),
    ("any", [WEATHER], {"type": "any"}, {"tools": (WEATHER_FN,), "tool_choice": "required", "parallel_tool_calls": True}),
    ("tool, no parallel", [WEATHER, TIME], {"type": "tool", "name": "time", "disable_parallel_tool_use": True},
     {"tools": (WEATHER_FN, TIME_FN), "tool_choice": {"type": "function", "function": {"name": "time"}},
      "parallel_tool_calls": False}),
    ("none choice", [WEATHER], {"type": "none"}, {"tools": (WEATHER_FN,), "tool_choice": "none", "parallel_tool_calls": True}),
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


# ---- the answer's shapes -------------------------------------------------------------------------

STOP_REASONS = [("stop", None, False, "end_turn"), ("stop", "###", False, "stop_sequence"),
                ("length", None, False, "max_tokens"), ("stop", None, True, "tool_use"),
                ("length", None, True, "tool_use")]


@pytest.mark.parametrize("finish,stop_sequence,tool_use,expected", STOP_REASONS)
def test_stop_reason(finish, stop_sequence, tool_use, expected):
    assert events.stop_reason(finish, stop_sequence, tool_use=tool_use) == expected


def test_content_blocks_join_text_and_keep_calls_in_order():
    pieces = [Text("a"), Text(""), Text("b"), ToolUse("toolu_1", "f", '{"x": 1}'), ToolUse("toolu_2", "g", "[1]"),
              Text("c")]
    assert events.content_blocks(pieces) == [
        {"type": "text", "text": "ab"},
        {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"x": 1}},
        {"type": "tool_use", "id": "toolu_2", "name": "g", "input": {}},
        {"type": "text", "text": "c"}]
    assert events.content_blocks([Text("")]) == []


def _names(evts):
    return [name for name, _ in evts]


STREAMS = [
    ("text", [Text("Hel"), Text("lo")],
     ["message_start", "content_block_start", "ping", "content_block_delta", "content_block_delta",
      "content_block_stop", "message_delta", "message_stop"]),
    ("nothing", [Text("")], ["message_start", "ping", "message_delta", "message_stop"]),
    ("text then call then text", [Text("Let me see."), ToolUse("toolu_1", "f", "{}"), Text("done")],
     ["message_start", "content_block_start", "ping", "content_block_delta", "content_block_stop",
      "content_block_start", "content_block_delta", "content_block_stop",
      "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"]),
    ("two calls", [ToolUse("toolu_1", "f", "{}"), ToolUse("toolu_2", "f", "{}")],
     ["message_start", "content_block_start", "ping", "content_block_delta", "content_block_stop",
      "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"]),
]


@pytest.mark.parametrize("name,pieces,expected", STREAMS, ids=[s[0] for s in STREAMS])
def test_event_sequence(name, pieces, expected):
    stream = EventStream(model="m", input_tokens=9)
    out = stream.start()
    for piece in pieces:
        out += stream.feed(piece)
    out += stream.finish(stop_reason="end_turn", stop_sequence=None, output_tokens=4)
    assert _names(out) == expected
    assert all(data["type"] == name for name, data in out)
    indexes = [data["index"] for name, data in out if name.startswith("content_block")]
    starts = [data["index"] for name, data in out if name == "content_block_start"]
    assert starts == list(range(len(starts))) and indexes == sorted(indexes)
    assert out[0][1]["message"]["usage"] == {"input_tokens": 9, "output_tokens": 0}
    assert out[-2][1]["usage"] == {"output_tokens": 4}


def test_stream_tool_use_block_carries_its_arguments_as_json_delta():
    stream = EventStream(model="m", input_tokens=1)
    out = stream.feed(ToolUse("toolu_1", "f", '{"a": 1}'))
    assert out[0][1]["content_block"] == {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}
    assert out[2][1]["delta"] == {"type": "input_json_delta", "partial_json": '{"a": 1}'}
    assert stream.tool_use
    assert events.sse("ping", {"type": "ping"}) == b'event: ping\ndata: {"type": "ping"}\n\n'


def test_answer_text_with_a_call_in_the_fallback_format_becomes_pieces():
    from pool.api.anthropic.messages import _WithTools
    from pool.tools.formats import FALLBACK, fallback_call_text
    from pool.tools.stream import ToolStream

    reader = _WithTools(ToolStream(FALLBACK, tools=[WEATHER_FN]))
    text = "Let me check. " + fallback_call_text("get_weather", {"city": "Paris"})
    pieces = [p for i in range(0, len(text), 7) for p in reader.feed(text[i:i + 7])] + reader.finish()
    blocks = events.content_blocks(pieces)
    assert blocks[0] == {"type": "text", "text": "Let me check."}
    assert blocks[1]["type"] == "tool_use" and blocks[1]["id"].startswith("toolu_")
    assert (blocks[1]["name"], blocks[1]["input"]) == ("get_weather", {"city": "Paris"})


# ---- errors and auth ----------------------------------------------------------------------------

KEYS = [({}, []), ({"Authorization": "Bearer k"}, ["k"]), ({"Authorization": "bearer  k "}, ["k"]),
        ({"Authorization": "Basic k"}, []), ({"x-api-key": "k"}, ["k"]),
        ({"Authorization": "Bearer a", "x-api-key": "b"}, ["a", "b"])]


@pytest.mark.parametrize("headers,keys", KEYS)
def test_given_keys(headers, keys):
    assert given_keys(httpx.Headers(headers)) == keys


# ---- through the application ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(module_asgi_server, demo_model_dir):
    """The demo model behind an API key; one running request per model and one waiting, so a third is
    refused at once (the 529 test)."""
    return module_asgi_server({DEMO: demo_model_dir}, OMLX_API_KEY=KEY, OMLX_MAX_CONCURRENT=1, OMLX_QUEUE_PER_MODEL=1)


def client(server, key=KEY, **kw) -> anthropic.Anthropic:
    return server.anthropic(api_key=key, **kw)


def test_text_answer(server):
    reply = client(server).messages.create(model=DEMO, max_tokens=16, messages=QUESTION,
                                           extra_body={"temperature": 0, "top_p": 1, "top_k": 5})
    assert reply.type == "message" and reply.role == "assistant" and reply.id.startswith("msg_")
    assert reply.model == DEMO
    assert [b.type for b in reply.content] == ["text"] and "Paris" in reply.content[0].text
    assert reply.stop_reason == "end_turn" and reply.stop_sequence is None
    assert reply.usage.input_tokens > 0 and 0 < reply.usage.output_tokens <= 16


def test_max_tokens(server):
    reply = client(server).messages.create(model=DEMO, max_tokens=3,
                                           messages=[{"role": "user", "content": "Tell me a long story."}])
    assert reply.stop_reason == "max_tokens" and reply.usage.output_tokens == 3


def test_stop_sequences(server):
    plain = client(server).messages.create(model=DEMO, max_tokens=16, messages=QUESTION)
    assert "France" in plain.content[0].text     # the sequence below would be generated
    reply = client(server).messages.create(model=DEMO, max_tokens=16, messages=QUESTION,
                                           stop_sequences=["France"])
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == "France"
    assert "France" not in "".join(b.text for b in reply.content)


def test_system_prompt_and_count_tokens(server):
    c = client(server)
    system = "You are a geography teacher. Answer in one sentence."
    counted = c.messages.count_tokens(model=DEMO, system=system, messages=QUESTION).input_tokens
    longer = c.messages.count_tokens(model=DEMO, system=system + " Be precise and polite.", messages=QUESTION)
    as_blocks = c.messages.count_tokens(model=DEMO, system=[{"type": "text", "text": system}],
                                        messages=QUESTION).input_tokens
    assert longer.input_tokens > counted == as_blocks > 0
    reply = c.messages.create(model=DEMO, max_tokens=8, system=system, messages=QUESTION)
    assert reply.usage.input_tokens == counted     # the same rendering as /v1/messages


def _sse_events(response: httpx.Response) -> list[tuple[str, dict]]:
    out, name = [], None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[len("event: "):]
        elif line.startswith("data: "):
            out.append((name, json.loads(line[len("data: "):])))
    return out


def test_streaming_event_order(server):
    body = {"model": DEMO, "max_tokens": 16, "temperature": 0, "messages": QUESTION, "stream": True}
    with server.stream_request("POST", "/v1/messages", json=body, timeout=120,
                               headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        seen = _sse_events(r)
    names = [n for n, _ in seen]
    assert all(data["type"] == n for n, data in seen)
    deltas = names.count("content_block_delta")
    assert deltas >= 1
    assert names == ["message_start", "content_block_start", "ping", *["content_block_delta"] * deltas,
                     "content_block_stop", "message_delta", "message_stop"]
    text = "".join(d["delta"]["text"] for n, d in seen if n == "content_block_delta")
    assert "Paris" in text
    assert seen[-2][1]["delta"]["stop_reason"] == "end_turn" and seen[-2][1]["usage"]["output_tokens"] > 0

    # the SDK's own assembly of the same stream equals the non-streamed answer
    with client(server).messages.stream(model=DEMO, max_tokens=16, messages=QUESTION) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    plain = client(server).messages.create(model=DEMO, max_tokens=16, messages=QUESTION)
    assert streamed == final.content[0].text == plain.content[0].text == text
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == plain.usage.output_tokens
    assert final.usage.input_tokens == plain.usage.input_tokens


def test_errors_in_anthropics_envelope(server):
    c = client(server)
    with pytest.raises(anthropic.NotFoundError) as e:
        c.messages.create(model="no-such-model", max_tokens=4, messages=QUESTION)
    assert e.value.body["error"]["type"] == "not_found_error" and e.value.body["type"] == "error"
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model=DEMO, max_tokens=4, messages=QUESTION, extra_body={"temperature": 1.5})
    assert e.value.body["error"]["type"] == "invalid_request_error" and "temperature" in e.value.message
    with pytest.raises(anthropic.AuthenticationError) as e:
        client(server, key="wrong").messages.create(model=DEMO, max_tokens=4, messages=QUESTION)
    assert e.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.NotFoundError):
        c.messages.count_tokens(model="no-such-model", messages=QUESTION)

    headers = {"x-api-key": KEY}
    raw = [server.fetch("POST", "/v1/messages", content=b"{nope", headers=headers),
           server.fetch("POST", "/v1/messages", json={"model": DEMO, "messages": QUESTION}, headers=headers),
           server.fetch("GET", "/v1/messages", headers=headers),
           server.fetch("POST", "/v1/messages/nope", json={}, headers=headers)]
    assert [(r.status_code, r.json()["error"]["type"]) for r in raw] == [
        (400, "invalid_request_error"), (400, "invalid_request_error"), (405, "invalid_request_error"),
        (404, "not_found_error")]
    assert all(r.json()["type"] == "error" for r in raw) and raw[2].headers["Allow"] == "POST"
    assert "max_tokens" in raw[1].json()["error"]["message"]


def test_either_key_header_opens_every_api_route(server):
    assert server.fetch("GET", "/v1/models", headers={"x-api-key": KEY}).status_code == 200
    assert server.fetch("GET", "/api/pool", headers={"x-api-key": KEY}).status_code == 200
    assert server.fetch("GET", "/v1/models", headers={"x-api-key": "wrong"}).status_code == 401
    body = {"model": DEMO, "max_tokens": 2, "messages": QUESTION}
    assert server.fetch("POST", "/v1/messages", json=body, headers=server.headers, timeout=120).status_code == 200
    assert client(server, key=None, auth_token=KEY).messages.create(**body).usage.output_tokens > 0


def test_a_full_queue_is_a_529_overloaded_error(server):
    counts = lambda: (server.model(DEMO)["running"], server.model(DEMO)["queued"])  # noqa: E731
    results: dict = {}
    running = server.stream(DEMO)
    server.wait_for(lambda: counts() == (1, 0), interval=0.02)
    queued = threading.Thread(target=lambda: results.__setitem__(
        "queued", client(server).messages.create(model=DEMO, max_tokens=2, messages=QUESTION)))
    queued.start()
    try:
        server.wait_for(lambda: counts() == (1, 1), interval=0.02)
        with pytest.raises(anthropic.InternalServerError) as e:
            client(server).messages.create(model=DEMO, max_tokens=2, messages=QUESTION)
        assert e.value.status_code == 529 and e.value.body["error"]["type"] == "overloaded_error"
        assert e.value.response.headers["Retry-After"] == "2"
    finally:
        running.close()
        queued.join(120)
    assert results["queued"].usage.output_tokens > 0


def test_a_body_too_large_is_a_413():
    from django.test import RequestFactory, override_settings

    from pool.api.anthropic.parse import read_body
    from pool.api.errors import RequestTooLarge

    request = RequestFactory().post("/v1/messages", data=json.dumps({"x": "y" * 200}), content_type="application/json")
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=100), pytest.raises(RequestTooLarge) as e:
        read_body(request)
    assert error_response(e.value, ANTHROPIC).status_code == 413
    assert envelope(e.value, ANTHROPIC)["error"]["type"] == "request_too_large"


# ---- tools through the application (needs serving's tool wiring: pool/tools.prepare_messages and the
# tool-call constraint for a forced choice) ----------------------------------------------------------

WEATHER_ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_tool_round_trip(server):
    c = client(server)
    reply = c.messages.create(model=DEMO, max_tokens=64, messages=WEATHER_ASK, tools=[WEATHER],
                              tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True})
    assert reply.stop_reason == "tool_use" and reply.stop_sequence is None, reply
    calls = [b for b in reply.content if b.type == "tool_use"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].id.startswith("toolu_")
    assert isinstance(calls[0].input["city"], str)      # the schema's required field, as a dict

    follow = [*WEATHER_ASK, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id, "content": "Sunny, 24 C"}]}]
    counted = c.messages.count_tokens(model=DEMO, messages=follow, tools=[WEATHER]).input_tokens
    answer = c.messages.create(model=DEMO, max_tokens=24, messages=follow, tools=[WEATHER])
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert answer.usage.input_tokens == counted > reply.usage.input_tokens   # the call and its result are in the prompt


def test_streamed_tool_call(server):
    with client(server).messages.stream(model=DEMO, max_tokens=64, messages=WEATHER_ASK, tools=[WEATHER],
                                        tool_choice={"type": "any"}) as stream:
        seen = [event.type for event in stream]
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    calls = [b for b in final.content if b.type == "tool_use"]
    assert calls and all(c.name == "get_weather" and isinstance(c.input["city"], str) for c in calls)
    assert seen[0] == "message_start" and seen[-1] == "message_stop" and "input_json" in seen
