"""Anthropic's Messages API through the ASGI application in this process, with the official `anthropic`
client on the demo model: answers, max_tokens, stop sequences, the system prompt and count_tokens, the
event stream, errors in Anthropic's envelope, either key header, a full queue's 529, a body too large,
and tool calls; with the API key read from either header. The translation on its own is in
test_anthropic_parse.py and test_anthropic_events.py."""

import json
import threading

import anthropic
import httpx
import pytest

from pool.api.auth import given_keys
from pool.api.dialects import ANTHROPIC
from pool.api.errors import envelope, error_response
from tests.api.anthropic_fixtures import QUESTION, WEATHER
from tests.conftest import DEMO

KEY = "test-key-123"


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
    # the same rendering as /v1/messages: its prompt is what it read and what the prompt cache gave
    assert reply.usage.input_tokens + reply.usage.cache_read_input_tokens == counted


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
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == \
        plain.usage.input_tokens + plain.usage.cache_read_input_tokens
    # the same question a third time: all but its last token come from the prompt cache
    assert plain.usage.cache_read_input_tokens > 0 and plain.usage.input_tokens == 1


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
    counts = lambda: (server.model(DEMO)["running"], server.model(DEMO)["queued"])
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

    follow = [*WEATHER_ASK,
              {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id,
                                            "content": "Sunny, 24 C"}]}]
    counted = c.messages.count_tokens(model=DEMO, messages=follow, tools=[WEATHER]).input_tokens
    answer = c.messages.create(model=DEMO, max_tokens=24, messages=follow, tools=[WEATHER])
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    # the call and its result are in the prompt
    prompt = lambda m: m.usage.input_tokens + m.usage.cache_read_input_tokens
    assert prompt(answer) == counted > prompt(reply)


def test_streamed_tool_call(server):
    with client(server).messages.stream(model=DEMO, max_tokens=64, messages=WEATHER_ASK, tools=[WEATHER],
                                        tool_choice={"type": "any"}) as stream:
        seen = [event.type for event in stream]
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    calls = [b for b in final.content if b.type == "tool_use"]
    assert calls and all(c.name == "get_weather" and isinstance(c.input["city"], str) for c in calls)
    assert seen[0] == "message_start" and seen[-1] == "message_stop" and "input_json" in seen
