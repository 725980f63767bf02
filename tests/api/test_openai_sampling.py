"""Sampling fields through the ASGI application in this process with the official openai client: logprobs in OpenAI's
shapes (streamed too), n choices, logit_bias, the penalties, the fields' 400s, and the tool fields
carried without breaking a request."""

import json

import pytest

from tests.conftest import DEMO

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(module_asgi_server, demo_model_dir):
    return module_asgi_server({DEMO: demo_model_dir})


def assert_sane(entries, top: int):
    """Each logprob <= 0; greedy: the chosen token is the most likely one, with the same logprob."""
    assert entries
    for e in entries:
        assert e.logprob <= 0 and len(e.top_logprobs) == top
        assert all(t.logprob <= 0 for t in e.top_logprobs)
        assert [t.logprob for t in e.top_logprobs] == sorted((t.logprob for t in e.top_logprobs), reverse=True)
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token
        if top:
            assert e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == pytest.approx(e.logprob)


def test_chat_logprobs_in_openai_shape(server):
    reply = server.openai().chat.completions.create(model=DEMO, messages=QUESTION, max_tokens=10, temperature=0,
                                                    logprobs=True, top_logprobs=3)
    choice = reply.choices[0]
    entries = choice.logprobs.content
    assert_sane(entries, 3)
    assert len(entries) == reply.usage.completion_tokens
    assert "".join(e.token for e in entries).strip() == choice.message.content.strip()

    plain = server.openai().chat.completions.create(model=DEMO, messages=QUESTION, max_tokens=10, temperature=0)
    assert plain.choices[0].logprobs is None
    assert plain.choices[0].message.content == choice.message.content    # asking changes nothing else

    only_chosen = server.openai().chat.completions.create(model=DEMO, messages=QUESTION, max_tokens=4,
                                                          temperature=0, logprobs=True)
    assert_sane(only_chosen.choices[0].logprobs.content, 0)


def test_streamed_chat_logprobs_cover_every_token(server):
    stream = server.openai().chat.completions.create(model=DEMO, messages=QUESTION, max_tokens=10, temperature=0,
                                                     logprobs=True, top_logprobs=2, stream=True,
                                                     stream_options={"include_usage": True})
    entries, text, usage = [], "", None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.logprobs is not None:
                entries += choice.logprobs.content
    assert_sane(entries, 2)
    assert len(entries) == usage.completion_tokens and "Paris" in text


def test_completions_logprobs_in_openai_shape(server):
    reply = server.openai().completions.create(model=DEMO, prompt="The capital of France is", max_tokens=6,
                                               temperature=0, logprobs=2)
    lp = reply.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert all(v <= 0 for v in lp.token_logprobs)
    for token, chosen, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) <= 2 and all(v <= 0 for v in top.values())
        assert top[token] == pytest.approx(chosen) and max(top.values()) == pytest.approx(chosen)   # greedy
    assert lp.text_offset[0] == 0
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]

    streamed = server.openai().completions.create(model=DEMO, prompt="The capital of France is", max_tokens=6,
                                                  temperature=0, logprobs=2, stream=True)
    tokens, offsets = [], []
    for chunk in streamed:
        if chunk.choices[0].logprobs is not None:
            tokens += chunk.choices[0].logprobs.tokens
            offsets += chunk.choices[0].logprobs.text_offset
    assert tokens == lp.tokens and offsets == lp.text_offset


def test_n_choices_share_the_prompt_and_count_it_once(server):
    client = server.openai()
    one = client.chat.completions.create(model=DEMO, messages=QUESTION, max_tokens=8, temperature=0)
    three = client.chat.completions.create(model=DEMO, messages=QUESTION, max_tokens=8, temperature=0, n=3)
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert {c.message.content for c in three.choices} == {one.choices[0].message.content}
    assert three.usage.prompt_tokens == one.usage.prompt_tokens
    assert three.usage.completion_tokens == 3 * one.usage.completion_tokens

    sampled = client.completions.create(model=DEMO, prompt="Once upon a time", max_tokens=12, temperature=1.5,
                                        seed=5, n=3)
    assert [c.index for c in sampled.choices] == [0, 1, 2]
    assert len({c.text for c in sampled.choices}) > 1          # each choice draws its own tokens


def test_streamed_n_choices_each_finish_and_the_usage_sums_them(server):
    stream = server.openai().chat.completions.create(model=DEMO, messages=QUESTION, max_tokens=8, temperature=0,
                                                     n=2, stream=True, stream_options={"include_usage": True},
                                                     logprobs=True)
    texts, finishes, counts, usage = {0: "", 1: ""}, {}, {0: 0, 1: 0}, None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            counts[choice.index] += len(choice.logprobs.content) if choice.logprobs else 0
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert texts[0] == texts[1] and "Paris" in texts[0]
    assert set(finishes) == {0, 1}
    assert usage.completion_tokens == counts[0] + counts[1]


def test_logit_bias_forbids_and_forces_tokens(server):
    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(server.home / "models" / DEMO)

    def bias(text: str, value: float) -> dict:
        (token_id,) = tokenizer.encode(text)
        return {str(token_id): value}

    client = server.openai()
    first = client.chat.completions.create(model=DEMO, messages=QUESTION, max_tokens=6, temperature=0, logprobs=True)
    token = first.choices[0].logprobs.content[0].token
    forbidden = client.chat.completions.create(model=DEMO, messages=QUESTION, max_tokens=6, temperature=0,
                                               logprobs=True, logit_bias=bias(token, -100))
    assert forbidden.choices[0].logprobs.content[0].token != token

    forced = client.completions.create(model=DEMO, prompt="Hello", max_tokens=4, temperature=0,
                                       logit_bias=bias(" cat", 100))
    assert forced.choices[0].text.split() == ["cat"] * 4


def test_penalties_change_a_repetitive_answer(server):
    ask = dict(model=DEMO, messages=[{"role": "user", "content": "Write the word cat five times."}],
               max_tokens=14, temperature=0)
    client = server.openai()
    plain = client.chat.completions.create(**ask).choices[0].message.content
    penalised = client.chat.completions.create(**ask, presence_penalty=1.5, frequency_penalty=1.0)
    assert penalised.choices[0].message.content != plain
    repeated = server.post("/v1/chat/completions", {**ask, "repetition_penalty": 1.8})
    assert repeated.status_code == 200 and repeated.json()["choices"][0]["message"]["content"] != plain


@pytest.mark.parametrize("route, fields, param", [
    ("chat", {"n": 0}, "n"),
    ("chat", {"n": 9}, "n"),
    ("chat", {"n": True}, "n"),
    ("chat", {"n": "2"}, "n"),
    ("chat", {"logprobs": 3}, "logprobs"),
    ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("chat", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("chat", {"top_logprobs": 2}, "top_logprobs"),
    ("chat", {"logprobs": False, "top_logprobs": 2}, "top_logprobs"),
    ("completions", {"logprobs": 6}, "logprobs"),
    ("completions", {"logprobs": True}, "logprobs"),
    ("chat", {"logit_bias": {"abc": 1}}, "logit_bias"),
    ("chat", {"logit_bias": {"-5": 1}}, "logit_bias"),
    ("chat", {"logit_bias": {"5": 101}}, "logit_bias"),
    ("chat", {"logit_bias": {"5": "1"}}, "logit_bias"),
    ("chat", {"logit_bias": [5]}, "logit_bias"),
    ("chat", {"logit_bias": {"999999": 1}}, "logit_bias"),            # outside the vocabulary
    ("chat", {"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
    ("chat", {"presence_penalty": 2.5}, "presence_penalty"),
    ("chat", {"frequency_penalty": -3}, "frequency_penalty"),
    ("chat", {"frequency_penalty": "1"}, "frequency_penalty"),
    ("chat", {"repetition_penalty": 0}, "repetition_penalty"),
    ("chat", {"repetition_penalty": -1}, "repetition_penalty"),
    ("chat", {"repetition_penalty": True}, "repetition_penalty"),
    ("chat", {"tools": {"name": "x"}}, "tools"),
    ("chat", {"tools": [{"type": "function"}]}, "tools[0].function"),
    ("chat", {"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
     "tools[0].function.parameters"),
    ("chat", {"tool_choice": "always"}, "tool_choice"),
    ("chat", {"tool_choice": "required"}, "tool_choice"),                  # without tools
    ("chat", {"tools": [{"type": "function", "function": {"name": "f"}}],
              "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
    ("chat", {"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ("chat", {"messages": [{"role": "tool", "content": "1", "tool_call_id": 7}]}, "messages[0].tool_call_id"),
    ("chat", {"messages": [{"role": "assistant", "content": None, "tool_calls": [{"function": "f"}]}]},
     "messages[0].tool_calls[0]"),
])
def test_bad_sampling_fields_are_400s_naming_the_field(server, route, fields, param):
    body = {"model": DEMO, "max_tokens": 2, **({"messages": QUESTION} if route == "chat" else {"prompt": "x"}),
            **fields}
    r = server.post("/v1/chat/completions" if route == "chat" else "/v1/completions", body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error


@pytest.mark.parametrize("field", ["presence_penalty", "frequency_penalty", "repetition_penalty", "top_logprobs"])
def test_a_number_too_large_for_a_float_is_a_400(server, field):
    raw = ('{"model": "%s", "messages": [{"role": "user", "content": "x"}], "logprobs": true, "%s": 1e999}'
           % (DEMO, field)).encode()
    r = server.post("/v1/chat/completions", content=raw, headers={"Content-Type": "application/json"})
    # the strict JSON reader refuses it before any field is read (it would read as infinity)
    error = r.json()["error"]
    assert r.status_code == 400 and error["type"] == "invalid_request_error" and "1e999" in error["message"], r.text


def test_tool_fields_and_tool_history_are_carried_without_breaking_a_request(server):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}}}}}]
    history = QUESTION + [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    reply = server.openai().chat.completions.create(model=DEMO, messages=history, tools=tools, tool_choice="auto",
                                                    parallel_tool_calls=False, max_tokens=4)
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")



def test_a_constraint_reaches_every_choice_and_its_logprobs_stay_json(server):
    """response_format's constraint (pool/api/openai/structured.py) gives each of n choices a processor of
    its own; tokens it rules out have logprob -inf, which JSON cannot say: OpenAI's -9999.0 instead."""
    r = server.post("/v1/chat/completions", {"model": DEMO, "messages": QUESTION, "max_tokens": 6, "n": 2,
                                             "temperature": 0, "logprobs": True, "top_logprobs": 20,
                                             "response_format": {"type": "json_object"}})
    assert r.status_code == 200, r.text
    body = json.loads(r.content, parse_constant=lambda name: pytest.fail(f"{name} in the body"))
    contents = [c["message"]["content"] for c in body["choices"]]
    assert contents[0] == contents[1] and contents[0].startswith("{")
    tops = [t["logprob"] for c in body["choices"] for e in c["logprobs"]["content"] for t in e["top_logprobs"]]
    assert min(tops) == -9999.0 and max(tops) <= 0


@pytest.mark.parametrize("chat, fields, expected", [
    (True, {}, dict(n=1, logprobs=None, logit_bias=(), presence_penalty=0.0, repetition_penalty=None)),
    (True, {"n": 3, "logprobs": True}, dict(n=3, logprobs=0)),
    (True, {"logprobs": True, "top_logprobs": 20}, dict(logprobs=20)),
    (True, {"logprobs": False}, dict(logprobs=None)),
    (True, {"logprobs": None, "top_logprobs": None}, dict(logprobs=None)),
    (False, {"logprobs": 0}, dict(logprobs=0)),
    (False, {"logprobs": 5}, dict(logprobs=5)),
    (True, {"logit_bias": {"7": -100, "3": 2.5}}, dict(logit_bias=((3, 2.5), (7, -100.0)))),
    (True, {"presence_penalty": -2, "frequency_penalty": 1.5, "repetition_penalty": 1.1},
     dict(presence_penalty=-2.0, frequency_penalty=1.5, repetition_penalty=1.1)),
    (True, {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required",
            "parallel_tool_calls": False}, dict(tool_choice="required", parallel_tool_calls=False)),
])
def test_sampling_fields_parse_into_the_spec(chat, fields, expected):
    from pool.api.openai.parse import parse_completion

    body = {"model": DEMO, **({"messages": QUESTION} if chat else {"prompt": "x"}), **fields}
    spec = parse_completion(body, chat=chat).spec
    assert {name: getattr(spec, name) for name in expected} == expected


def test_logprobs_render_in_openai_shapes():
    from pool.api.openai.shapes import chat_logprobs, completion_logprobs
    from pool.engines.protocol import TokenLogprob

    entries = [TokenLogprob("Hi", -0.5, (72, 105), (("Hi", -0.5, (72, 105)), ("Yo", float("-inf"), (89, 111)))),
               TokenLogprob("!", -1.0, (33,), (("!", -1.0, (33,)),))]
    assert chat_logprobs(entries) == {"content": [
        {"token": "Hi", "logprob": -0.5, "bytes": [72, 105],
         "top_logprobs": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105]},
                          {"token": "Yo", "logprob": -9999.0, "bytes": [89, 111]}]},
        {"token": "!", "logprob": -1.0, "bytes": [33],
         "top_logprobs": [{"token": "!", "logprob": -1.0, "bytes": [33]}]},
    ]}
    assert completion_logprobs(entries, offset=4) == {
        "tokens": ["Hi", "!"], "token_logprobs": [-0.5, -1.0],
        "top_logprobs": [{"Hi": -0.5, "Yo": -9999.0}, {"!": -1.0}], "text_offset": [4, 6]}
    assert chat_logprobs([]) == {"content": []}
