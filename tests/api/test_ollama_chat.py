"""Ollama's /api/chat, /api/generate, /api/embed and /api/embeddings: the bodies parsed (tables), then
with the official `ollama` Python client against a real server with the demo models."""

from __future__ import annotations

import json

import httpx
import ollama
import pytest

from pool.api.ollama.parse import chat_messages, parse_chat, parse_embed, parse_generate
from pool.errors import InvalidRequest
from tests.conftest import DEMO

MINILM = "all-MiniLM-L6-v2"
USER = [{"role": "user", "content": "Say hi."}]


# ---- the bodies, parsed --------------------------------------------------------------------------

@pytest.mark.parametrize("options, fields", [
    ({}, {"max_tokens": None, "context_limit": None, "temperature": None}),
    ({"num_predict": 7, "num_ctx": 4096, "temperature": 0.5}, {"max_tokens": 7, "context_limit": 4096,
                                                               "temperature": 0.5}),
    ({"num_predict": -1}, {"max_tokens": None}),          # Ollama's "until done": the server's default
    ({"stop": ["\n"], "seed": 3, "top_k": 40}, {"stop": ("\n",), "seed": 3}),
    ({"repeat_penalty": 1.1, "presence_penalty": 0.5}, {"repetition_penalty": 1.1, "presence_penalty": 0.5}),
    ({"repeat_penalty": 1.0}, {"repetition_penalty": None}),
    ({"num_gpu": 99, "num_thread": 4}, {"max_tokens": None}),     # a runner's options: accepted, no effect
])
def test_options(options, fields):
    spec = parse_chat({"model": DEMO, "messages": USER, "options": options}).spec
    assert {name: getattr(spec, name) for name in fields} == fields


@pytest.mark.parametrize("body, param", [
    ({"messages": USER}, "model"),
    ({"model": DEMO, "messages": "hi"}, "messages"),
    ({"model": DEMO, "messages": [{"role": {"a": 1}, "content": "Hi"}]}, "messages[0].role"),
    ({"model": DEMO, "messages": USER, "logprobs": 1}, "logprobs"),
    ({"model": DEMO, "messages": USER, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"model": DEMO, "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"model": DEMO, "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, "messages[0].images[0]"),
    ({"model": DEMO, "messages": USER, "options": {"temperature": 3}}, "options.temperature"),
    ({"model": DEMO, "messages": USER, "options": {"num_ctx": 0}}, "options.num_ctx"),
    ({"model": DEMO, "messages": USER, "options": {"num_predict": "x"}}, "options.num_predict"),
    ({"model": DEMO, "messages": USER, "options": []}, "options"),
    ({"model": DEMO, "messages": USER, "format": "yaml"}, "format"),
    ({"model": DEMO, "messages": USER, "think": True}, "think"),
    ({"model": DEMO, "messages": USER, "stream": "yes"}, "stream"),
    ({"model": DEMO, "messages": USER, "keep_alive": "soon"}, "keep_alive"),
])
def test_bad_chat_bodies_name_the_field(body, param):
    with pytest.raises(InvalidRequest) as refused:
        parse_chat(body)
    assert refused.value.param == param


@pytest.mark.parametrize("value, seconds", [
    ("10m", 600.0), (30, 30.0), (0, 0.0), (-5, -1.0), ("-1m", -1.0),
    (1e12, -1.0), (2**63, -1.0), (10**400, -1.0), ("9" * 400 + "h", -1.0),    # past Go's longest: forever
])
def test_keep_alive_is_bounded_so_the_longest_is_forever(value, seconds):
    assert parse_chat({"model": DEMO, "messages": USER, "keep_alive": value}).spec.keep_alive == seconds


def test_no_messages_is_the_load_verb_and_logprobs_are_parsed():
    assert parse_chat({"model": DEMO}).spec.messages == [] == parse_chat({"model": DEMO, "messages": []}).spec.messages
    assert parse_chat({"model": DEMO, "messages": USER, "logprobs": True, "top_logprobs": 3}).spec.logprobs == 3
    assert parse_chat({"model": DEMO, "messages": USER, "logprobs": True}).spec.logprobs == 0
    assert parse_chat({"model": DEMO, "messages": USER, "top_logprobs": 3}).spec.logprobs is None   # as Ollama's


def test_stream_is_the_default_and_format_is_a_constraint():
    req = parse_chat({"model": DEMO, "messages": USER, "format": {"type": "object"}})
    assert req.stream is True and req.spec.constraint is not None
    assert parse_chat({"model": DEMO, "messages": USER, "format": "json", "stream": False}).stream is False


def test_a_tool_round_trip_in_ollamas_shape_becomes_openais():
    messages = chat_messages([
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get", "arguments": {"c": 1}}}]},
        {"role": "tool", "content": "sunny", "tool_name": "get"},
    ], DEMO)
    call = messages[1]["tool_calls"][0]
    assert call["function"] == {"name": "get", "arguments": '{"c": 1}'}
    assert messages[2] == {"role": "tool", "content": "sunny", "tool_call_id": call["id"]}


@pytest.mark.parametrize("body, param", [
    ({"model": DEMO, "prompt": "x", "images": ["aGk="]}, "images[0]"),
    ({"model": DEMO, "prompt": "x", "template": "{{ .Prompt }}"}, "template"),
    ({"model": DEMO, "prompt": 5}, "prompt"),
    ({"model": DEMO, "prompt": "x", "raw": "yes"}, "raw"),
    ({"model": DEMO, "prompt": "x", "context": [1, 2]}, "context"),
])
def test_bad_generate_bodies_name_the_field(body, param):
    with pytest.raises(InvalidRequest) as refused:
        parse_generate(body)
    assert refused.value.param == param


def test_an_empty_generate_is_a_load_verb():
    assert parse_generate({"model": DEMO}).empty and not parse_generate({"model": DEMO, "prompt": "x"}).empty


@pytest.mark.parametrize("body, legacy, inputs", [
    ({"model": MINILM, "input": "a"}, False, ("a",)),
    ({"model": MINILM, "input": ["a", "b"]}, False, ("a", "b")),
    ({"model": MINILM, "prompt": "a"}, True, ("a",)),
])
def test_embed_inputs(body, legacy, inputs):
    assert parse_embed(body, legacy=legacy).inputs == inputs


# ---- with the official client --------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(module_server, demo_model_dir, minilm_dir):
    return module_server({DEMO: demo_model_dir, MINILM: minilm_dir})


@pytest.fixture(scope="module")
def client(server):
    with ollama.Client(host=server.url, timeout=120) as client:   # closed: no socket left to the collector
        yield client


def test_chat_whole_and_streamed(client):
    whole = client.chat(model=DEMO, messages=USER, stream=False, options={"num_predict": 8, "temperature": 0})
    assert whole.done and whole.message.role == "assistant" and whole.message.content
    assert whole.done_reason in ("stop", "length") and whole.eval_count >= 1 and whole.prompt_eval_count > 5
    assert whole.total_duration >= whole.eval_duration > 0
    parts = list(client.chat(model=DEMO, messages=USER, stream=True, options={"num_predict": 8, "temperature": 0}))
    assert parts[-1].done and not any(p.done for p in parts[:-1])
    assert "".join(p.message.content for p in parts) == whole.message.content     # greedy: the same answer
    tagged = client.chat(model=f"{DEMO}:latest", messages=USER, stream=False, options={"num_predict": 8,
                                                                                        "temperature": 0})
    assert tagged.message.content == whole.message.content                        # Ollama's default tag
    assert (tagged.model, whole.model) == (f"{DEMO}:latest", DEMO)                 # echoed as written


def test_chat_with_tools_and_a_tool_result(client):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                               "parameters": {"type": "object", "properties": {
                                                   "city": {"type": "string"}}, "required": ["city"]}}}]
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    answer = client.chat(model=DEMO, messages=messages, tools=tools, stream=False, options={"num_predict": 64})
    assert answer.done
    calls = answer.message.tool_calls or []
    for call in calls:
        assert call.function.name == "get_weather" and isinstance(call.function.arguments, dict)
    history = [*messages, {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny, 21 C", "tool_name": "get_weather"}]
    follow = client.chat(model=DEMO, messages=history, tools=tools, stream=False, options={"num_predict": 16})
    assert follow.done and follow.message.role == "assistant"


def test_chat_with_a_format_schema_is_valid_json(client):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}},
              "required": ["name"], "additionalProperties": False}
    answer = client.chat(model=DEMO, messages=[{"role": "user", "content": "Name a city as JSON."}], format=schema,
                         stream=False, options={"num_predict": 40})
    assert set(json.loads(answer.message.content)) == {"name"}


def test_generate_plain_raw_and_system(client):
    plain = client.generate(model=DEMO, prompt="Say hi.", system="Be brief.", options={"num_predict": 6})
    assert plain.done and plain.response and plain.eval_count >= 1
    raw = client.generate(model=DEMO, prompt="1, 2, 3,", raw=True, options={"num_predict": 4, "temperature": 0})
    assert raw.done and raw.response
    streamed = list(client.generate(model=DEMO, prompt="Say hi.", stream=True, options={"num_predict": 4}))
    assert streamed[-1].done and streamed[-1].done_reason in ("stop", "length")


def test_generate_with_a_suffix_names_a_model_without_fim_tokens(client):
    with pytest.raises(ollama.ResponseError) as refused:
        client.generate(model=DEMO, prompt="def f(", suffix="    return x")
    assert refused.value.status_code == 400 and DEMO in refused.value.error and "fill-in-the-middle" in \
        refused.value.error


def test_an_empty_generate_loads_and_keep_alive_0_unloads(client, server):
    server.post(f"/api/models/{DEMO}/unload", {"force": True})
    loaded = client.generate(model=DEMO, prompt="", keep_alive=-1)
    assert loaded.done_reason == "load" and server.model(DEMO)["state"] == "loaded"
    unloaded = client.generate(model=DEMO, prompt="", keep_alive=0)
    assert unloaded.done_reason == "unload" and server.model(DEMO)["state"] == "unloaded"


def test_a_chat_without_messages_loads_the_model_as_ollamas_does(client, server):
    server.post(f"/api/models/{DEMO}/unload", {"force": True})
    loaded = client.chat(model=f"{DEMO}:latest", messages=[])
    assert (loaded.done, loaded.done_reason, loaded.model) == (True, "load", f"{DEMO}:latest")
    assert loaded.message.role == "assistant" and loaded.message.content == ""
    assert server.model(DEMO)["state"] == "loaded"
    raw = server.post("/api/chat", {"model": DEMO, "keep_alive": 0})      # no messages at all: Ollama's unload
    assert raw.status_code == 200 and raw.json()["done_reason"] == "unload"
    assert server.model(DEMO)["state"] == "unloaded"
    with pytest.raises(ollama.ResponseError) as unknown:
        client.chat(model="nope", messages=[])
    assert unknown.value.status_code == 404 and 'model "nope" not found' in unknown.value.error
    with pytest.raises(ollama.ResponseError) as embedding:
        client.chat(model=MINILM, messages=[])
    assert embedding.value.status_code == 400


def test_chat_and_generate_logprobs_in_ollamas_shape(client):
    options = {"num_predict": 6, "temperature": 0}
    whole = client.chat(model=DEMO, messages=USER, stream=False, options=options, logprobs=True, top_logprobs=3)
    assert len(whole.logprobs) == whole.eval_count
    assert "".join(entry.token for entry in whole.logprobs) == whole.message.content
    for entry in whole.logprobs:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.logprob - 1e-5       # greedy: the likeliest was drawn
    parts = list(client.chat(model=DEMO, messages=USER, stream=True, options=options, logprobs=True,
                             top_logprobs=3))
    streamed = [entry for part in parts for entry in part.logprobs or ()]
    pairs = lambda entries: [(e.token, round(e.logprob, 4)) for e in entries]
    assert pairs(streamed) == pairs(whole.logprobs)
    bare = client.chat(model=DEMO, messages=USER, stream=False, options=options, logprobs=True)
    assert len(bare.logprobs) == bare.eval_count and all(not e.top_logprobs for e in bare.logprobs)
    assert client.chat(model=DEMO, messages=USER, stream=False, options=options).logprobs is None
    generated = client.generate(model=DEMO, prompt="Say hi.", options=options, logprobs=True, top_logprobs=1)
    assert len(generated.logprobs) == generated.eval_count and len(generated.logprobs[0].top_logprobs) == 1


def test_embed_takes_as_many_inputs_as_v1_embeddings(server):
    refused = server.post("/api/embed", {"model": MINILM, "input": ["x"] * 2049})
    assert refused.status_code == 400 and "2048" in refused.json()["error"] and "input" in refused.json()["error"]
    assert server.post("/v1/embeddings", {"model": MINILM, "input": ["x"] * 2049}).json()["error"]["param"] == "input"


def test_num_ctx_caps_the_request_without_a_reload(client, server):
    client.chat(model=DEMO, messages=USER, stream=False, options={"num_predict": 2})
    loads = server.model(DEMO)["load_seconds"]
    for num_ctx in (512, 2048, 1024):
        client.chat(model=DEMO, messages=USER, stream=False, options={"num_predict": 2, "num_ctx": num_ctx})
    assert server.model(DEMO)["state"] == "loaded" and server.model(DEMO)["load_seconds"] == loads
    with pytest.raises(ollama.ResponseError) as refused:   # the prompt and the answer must fit num_ctx
        client.chat(model=DEMO, messages=USER, stream=False, options={"num_predict": 64, "num_ctx": 32})
    assert refused.value.status_code == 400 and "32 tokens" in refused.value.error


def test_embed_and_the_older_embeddings(client):
    result = client.embed(model=MINILM, input=["first", "second"])
    assert len(result.embeddings) == 2 and len(result.embeddings[0]) == 384 and result.prompt_eval_count > 0
    old = client.embeddings(model=MINILM, prompt="first")
    assert old.embedding == pytest.approx(result.embeddings[0], abs=1e-5)


def test_a_long_input_is_cut_to_the_context_unless_truncate_is_false(client):
    long = "word " * 600                                # over MiniLM's 256 tokens
    cut = client.embed(model=MINILM, input=long)
    assert len(cut.embeddings[0]) == 384 and cut.prompt_eval_count == 256
    assert client.embeddings(model=MINILM, prompt=long).embedding == pytest.approx(cut.embeddings[0], abs=1e-5)
    with pytest.raises(ollama.ResponseError) as refused:
        client.embed(model=MINILM, input=long, truncate=False)
    assert refused.value.status_code == 400 and "256" in refused.value.error


def test_errors_are_ollamas_shape(server):
    r = httpx.post(server.url + "/api/chat", json={"model": "nope", "messages": USER}, timeout=30)
    assert r.status_code == 404 and set(r.json()) == {"error"} and "nope" in r.json()["error"]
    r = httpx.post(server.url + "/api/chat", json={"model": DEMO, "messages": USER, "options": {"top_p": 2}},
                   timeout=30)
    assert r.status_code == 400 and "options.top_p" in r.json()["error"]
    r = httpx.post(server.url + "/api/embed", json={"model": DEMO, "input": "x"}, timeout=30)
    assert r.status_code == 400 and set(r.json()) == {"error"}
