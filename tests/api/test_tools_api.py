"""Tool calling on /v1/chat/completions through the ASGI application in this process with the
official openai client, on the demo model (SmolLM2-135M: its chat template has no tool support, so
the server's fallback format applies): a forced call's arguments validate against the function's parameters, the result
fed back gets an answer, streamed call deltas reassemble, and the fields' 400s. Then /v1/models'
capabilities and context lengths, and a chat request naming an embedding model."""

import json
from pathlib import Path

import jsonschema
import openai
import pytest

from pool.catalog.kinds import CHAT, EMBEDDINGS, model_card
from tests.conftest import DEMO

MINILM = "all-MiniLM-L6-v2"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city's name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a timezone",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}},
                   "required": ["timezone"], "additionalProperties": False}}}
TOOLS = [WEATHER, TIME]
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture(scope="module")
def server(module_asgi_server, demo_model_dir, minilm_dir):
    return module_asgi_server({DEMO: demo_model_dir, MINILM: minilm_dir})


def assert_valid_call(call, name=None):
    assert call.type == "function" and call.id
    assert call.function.name in PARAMETERS and (name is None or call.function.name == name)
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, PARAMETERS[call.function.name])
    return arguments


def test_required_tool_call_round_trip(server):
    client = server.openai()
    reply = client.chat.completions.create(model=DEMO, messages=ASK, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=80, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None
    assert len(choice.message.tool_calls) == 1          # parallel_tool_calls false: one call
    call = choice.message.tool_calls[0]
    assert_valid_call(call)

    history = ASK + [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21})}]
    answer = client.chat.completions.create(model=DEMO, messages=history, tools=TOOLS, max_tokens=30,
                                            temperature=0)
    final = answer.choices[0]
    assert final.finish_reason in ("stop", "length")
    assert final.message.content and not final.message.tool_calls
    assert answer.usage.prompt_tokens > reply.usage.prompt_tokens     # the call and its result were rendered


def test_a_named_tool_choice_picks_that_function(server):
    reply = server.openai().chat.completions.create(
        model=DEMO, messages=ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=80, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert_valid_call(call, "get_time")


def test_streamed_tool_call_deltas_reassemble_to_the_same_call(server):
    client = server.openai()
    body = dict(model=DEMO, messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                max_tokens=80, temperature=0)
    whole = client.chat.completions.create(**body).choices[0].message.tool_calls[0]
    with client.chat.completions.stream(**body) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    streamed = choice.message.tool_calls[0]
    assert (streamed.function.name, json.loads(streamed.function.arguments)) == \
        (whole.function.name, json.loads(whole.function.arguments))

    # the raw chunks: calls only in delta.tool_calls, indexed; the last chunk says tool_calls
    reasons, calls = [], {}
    for chunk in client.chat.completions.create(**body, stream=True):
        for c in chunk.choices:
            reasons.append(c.finish_reason)
            assert not (c.delta.content or "").strip().startswith("<tool_call>")
            for d in c.delta.tool_calls or ():
                calls.setdefault(d.index, "")
                calls[d.index] += d.function.arguments or ""
    assert reasons[-1] == "tool_calls" and list(calls) == [0]
    assert json.loads(calls[0]) == json.loads(whole.function.arguments)


def test_tool_choice_none_gives_text(server):
    reply = server.openai().chat.completions.create(model=DEMO, messages=ASK, tools=TOOLS, tool_choice="none",
                                                    max_tokens=20, temperature=0)
    choice = reply.choices[0]
    assert choice.message.content and not choice.message.tool_calls
    assert choice.finish_reason in ("stop", "length")
    plain = server.openai().chat.completions.create(model=DEMO, messages=ASK, max_tokens=20, temperature=0)
    assert reply.usage.prompt_tokens == plain.usage.prompt_tokens     # "none": the tools are not shown


def test_a_forced_call_outranks_response_format(server):
    reply = server.post("/v1/chat/completions", {
        "model": DEMO, "messages": ASK, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 80,
        "response_format": {"type": "json_object"}, "parallel_tool_calls": False}).json()
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls", reply
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


@pytest.mark.parametrize("body, param", [
    ({"tools": "get_weather"}, "tools"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"name": "get weather"}}]}, "tools[0].function.name"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
     "tools[0].function.parameters"),
    ({"tools": TOOLS, "tool_choice": "any"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_news"}}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice"),
    ({"tools": TOOLS, "parallel_tool_calls": 1}, "parallel_tool_calls"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {      # a forced call it cannot enforce
        "type": "object", "properties": {"xs": {"type": "array", "uniqueItems": True}}}}}],
      "tool_choice": "required"}, "tools"),
    ({"messages": ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{not json"}}]}]},
     "messages[1].tool_calls[0].function.arguments"),
])
def test_bad_tools_are_400s_naming_the_field(server, body, param):
    client = server.openai()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**{"model": DEMO, "messages": ASK, "max_tokens": 2, **body})
    assert e.value.status_code == 400
    assert e.value.body["param"] == param, e.value.body


# ---- /v1/models ---------------------------------------------------------------------------------

def test_models_list_capabilities_and_context_length(server, demo_model_dir):
    client = server.openai()
    models = {m.id: m.model_dump() for m in client.models.list()}
    demo, minilm = models[DEMO], models[MINILM]
    assert demo["capabilities"] == ["chat", "completions", "tools", "structured_output"]
    assert demo["context_length"] == json.loads((demo_model_dir / "config.json").read_text())[
        "max_position_embeddings"]
    assert minilm["capabilities"] == ["embeddings"]
    assert minilm["context_length"] == 256        # sentence-transformers' max_seq_length, not BERT's 512
    assert client.models.retrieve(MINILM).model_dump()["capabilities"] == ["embeddings"]
    one = server.get(f"/v1/models/{DEMO}").json()
    assert (one["capabilities"], one["context_length"]) == (demo["capabilities"], demo["context_length"])


def test_a_chat_request_for_an_embedding_model_is_refused_before_it_loads(server):
    with pytest.raises(openai.BadRequestError) as e:
        server.openai().chat.completions.create(model=MINILM, messages=ASK, max_tokens=2)
    assert e.value.body["param"] == "model" and e.value.body["code"] == "model_kind_mismatch"
    assert server.model(MINILM)["state"] == "unloaded"


@pytest.mark.parametrize("kind, config, sentence, length", [
    (CHAT, {"max_position_embeddings": 8192}, None, 8192),
    (CHAT, {"n_positions": 1024}, None, 1024),                           # GPT-2 style
    (CHAT, {"text_config": {"max_position_embeddings": 32768}}, None, 32768),   # a VLM's text model
    (CHAT, {"max_position_embeddings": None, "seq_length": 2048}, None, 2048),
    (CHAT, {}, None, None),
    (CHAT, {"max_position_embeddings": "long"}, None, None),
    (EMBEDDINGS, {"max_position_embeddings": 512}, {"max_seq_length": 256}, 256),
    (EMBEDDINGS, {"max_position_embeddings": 512}, {"max_seq_length": 1024}, 512),
    (EMBEDDINGS, {"max_position_embeddings": 512}, None, 512),
    (EMBEDDINGS, {}, {"max_seq_length": 128}, 128),
])
def test_context_length_from_the_config(tmp_path, kind, config, sentence, length):
    (tmp_path / "config.json").write_text(json.dumps(config))
    if sentence is not None:
        (tmp_path / "sentence_bert_config.json").write_text(json.dumps(sentence))
    assert kind.context_length(tmp_path, config) == length
    assert model_card(tmp_path, kind)["context_length"] == length


def test_capabilities_by_kind():
    assert "tools" in CHAT.capabilities and EMBEDDINGS.capabilities == ("embeddings",)
    assert model_card(Path("/nonexistent"), EMBEDDINGS) == {"capabilities": ["embeddings"], "context_length": None}


# ---- count_tokens (the serving door's, behind /v1/messages/count_tokens) ---------------------------

def test_count_tokens_takes_no_slot_and_counts_the_rendered_tools(start_asgi_server):
    server = start_asgi_server(OMLX_MAX_CONCURRENT=1, OMLX_QUEUE_PER_MODEL=0)
    body = {"model": DEMO, "messages": ASK,
            "tools": [{"name": "get_weather", "description": "The current weather in a city",
                       "input_schema": WEATHER["function"]["parameters"]}]}
    stream = server.stream(DEMO)           # holds the model's one slot; no request may queue
    try:
        assert server.chat(DEMO).status_code == 503                  # a completion is refused...
        counted = server.post("/v1/messages/count_tokens", body)     # ...a count is not
        assert counted.status_code == 200, counted.text
        plain = server.post("/v1/messages/count_tokens", {"model": DEMO, "messages": ASK}).json()
    finally:
        stream.close()
    assert counted.json()["input_tokens"] > plain["input_tokens"] + 50     # the tools' system message
    answer = server.post("/v1/messages", {**body, "max_tokens": 1}).json()
    usage = answer["usage"]
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == counted.json()["input_tokens"]
    openai_way = server.openai().chat.completions.create(model=DEMO, messages=ASK, max_tokens=1)
    assert openai_way.usage.prompt_tokens == plain["input_tokens"]


# ---- a forced call cut by max_tokens: dropped, never the fallback format's markup ----------------

CUT = 8          # max_tokens that end a forced call inside its arguments
MARKUP = ("<tool_call>", "</tool_call>")


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_call_cut_by_max_tokens_is_dropped(server, tool_choice):
    """Issue 24: the cut call came back as `<tool_call>...` in content. Now: no call, empty content,
    finish_reason "length"; streamed, no content delta and no tool_calls delta."""
    client = server.openai()
    body = dict(model=DEMO, messages=ASK, tools=TOOLS, tool_choice=tool_choice, max_tokens=CUT, temperature=0)
    reply = client.chat.completions.create(**body)
    choice = reply.choices[0]
    assert reply.usage.completion_tokens == CUT
    assert (choice.finish_reason, choice.message.content, choice.message.tool_calls) == ("length", "", None)
    texts, reasons, calls = [], [], []
    for chunk in client.chat.completions.create(**body, stream=True):
        for c in chunk.choices:
            texts.append(c.delta.content or "")
            reasons.append(c.finish_reason)
            calls.extend(c.delta.tool_calls or ())
    assert ("".join(texts), calls, reasons[-1]) == ("", [], "length")


def test_a_forced_tool_use_cut_by_max_tokens_is_dropped_on_the_messages_api(server):
    tool = {"name": "get_weather", "description": WEATHER["function"]["description"],
            "input_schema": WEATHER["function"]["parameters"]}
    message = server.anthropic().messages.create(model=DEMO, messages=ASK, tools=[tool], max_tokens=CUT,
                                                 tool_choice={"type": "tool", "name": "get_weather"})
    assert message.stop_reason == "max_tokens"
    assert [b.type for b in message.content] in ([], ["text"])
    assert not any(m in b.text for b in message.content for m in MARKUP)


def test_a_forced_function_call_cut_by_max_output_tokens_is_dropped_on_the_responses_api(server):
    tool = {"type": "function", **WEATHER["function"]}
    response = server.openai().responses.create(model=DEMO, input=ASK[0]["content"], tools=[tool],
                                                tool_choice={"type": "function", "name": "get_weather"},
                                                max_output_tokens=CUT)
    assert (response.status, response.incomplete_details.reason) == ("incomplete", "max_output_tokens")
    assert [o for o in response.output if o.type == "function_call"] == []
    assert not any(m in response.output_text for m in MARKUP)
