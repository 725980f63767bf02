"""Request limits through the ASGI application in this process: the model's context caps prompt + max_tokens
(OpenAI's and Anthropic's 400s), a prompt too large is refused before it is tokenised and leaves no resident
memory behind, the documented count and length limits, SSE keep-alives during a long prefill, and error
messages that name the right thing (no chat template for a completion prompt, no absolute paths from a failed
load)."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import uuid

import anthropic
import httpx
import openai
import psutil
import pytest

from pool.api.keepalive import KEEPALIVE, until_first
from tests.conftest import DEMO

CTX = "ctx256"              # the demo model with max_position_embeddings 256
BROKEN = "broken"           # a folder whose weights file is garbage
EOS_BANNED = {"2": -100}    # the demo tokenizer's EOS: an answer runs until a limit ends it
HI = [{"role": "user", "content": "hi"}]


def _ctx_model(folder, demo_model_dir, context: int):
    folder.mkdir()
    for file in demo_model_dir.iterdir():
        if file.name != "config.json":
            (folder / file.name).symlink_to(file)
    config = json.loads((demo_model_dir / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": context}))
    return folder


def _broken_model(folder, demo_model_dir):
    folder.mkdir()
    for file in demo_model_dir.iterdir():
        if file.suffix != ".safetensors":
            shutil.copy(file, folder / file.name)
    (folder / "model.safetensors").write_bytes(b"garbage" * 10)    # mlx names the file in its error
    # without `quantization` discovery reads no safetensors header (a garbage one is another matter)
    config = json.loads((folder / "config.json").read_text())
    config.pop("quantization", None)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def server(module_asgi_server, tmp_path_factory, demo_model_dir, stand_in_demo_dir):
    made = tmp_path_factory.mktemp("limits-models")
    # CTX generates up to its context: the demo's two-layer stand-in does it in a tenth of the time
    return module_asgi_server({DEMO: demo_model_dir, CTX: _ctx_model(made / CTX, stand_in_demo_dir, 256),
                          BROKEN: _broken_model(made / BROKEN, demo_model_dir)}, OMLX_SSE_KEEPALIVE="0.2")


def _error(response: httpx.Response, status: int = 400) -> dict:
    assert response.status_code == status, response.text[:500]
    return response.json()["error"]


def _words(n: int) -> str:
    """About n tokens of text (a word is three of the demo tokenizer's), different each call (no
    prompt cache hit)."""
    return uuid.uuid4().hex + " " + " ".join(f"word{i % 50}" for i in range(n // 3))


# ---- the context -----------------------------------------------------------------------------------

def test_a_prompt_that_cannot_fit_is_context_length_exceeded(server):
    chat = server.post("/v1/chat/completions", {"model": CTX, "messages": [{"role": "user", "content": _words(600)}],
                                                "max_tokens": 4})
    error = _error(chat)
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert error["message"].startswith("This model's maximum context length is 256 tokens. However, your "
                                       "messages resulted in ")
    assert error["prompt_tokens"] > 256 and error["context_length"] == 256
    completion = _error(server.post("/v1/completions", {"model": CTX, "prompt": _words(600), "max_tokens": 4}))
    assert completion["code"] == "context_length_exceeded" and completion["param"] == "prompt"
    assert "your prompt resulted in" in completion["message"]
    # the official client reads it as a 400 with OpenAI's code
    with pytest.raises(openai.BadRequestError) as e:
        server.openai().chat.completions.create(model=CTX, messages=[{"role": "user", "content": _words(600)}])
    assert e.value.code == "context_length_exceeded"


@pytest.mark.parametrize("field, value", [("max_tokens", 400), ("max_tokens", 1099511627776),
                                          ("max_completion_tokens", 1099511627776)])
def test_a_max_tokens_that_cannot_fit_beside_the_prompt_is_refused_at_once(server, field, value):
    started = time.monotonic()
    error = _error(server.post("/v1/chat/completions", {"model": CTX, "messages": HI, field: value}))
    assert time.monotonic() - started < 30
    assert error["code"] == "context_length_exceeded" and error["param"] == "max_tokens"
    assert f"in the messages, {value} in the completion" in error["message"]


def test_without_max_tokens_generation_stops_at_the_context(server):
    reply = server.post("/v1/completions", {"model": CTX, "prompt": _words(150), "logit_bias": EOS_BANNED,
                                            "temperature": 0})
    assert reply.status_code == 200, reply.text
    usage = reply.json()["usage"]
    assert reply.json()["choices"][0]["finish_reason"] == "length"
    assert usage["prompt_tokens"] + usage["completion_tokens"] == 256
    # a max_tokens that fits is the client's
    reply = server.post("/v1/completions", {"model": CTX, "prompt": "Hello", "max_tokens": 5, "logit_bias": EOS_BANNED})
    assert reply.json()["usage"]["completion_tokens"] == 5


def test_anthropic_context_errors_in_anthropics_words(server):
    c = server.anthropic()
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model=CTX, max_tokens=4, messages=[{"role": "user", "content": _words(600)}])
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert e.value.body["error"]["message"].startswith("prompt is too long: ")
    assert e.value.body["error"]["message"].endswith(" tokens > 255 maximum")
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model=CTX, max_tokens=4096, messages=HI)
    message = e.value.body["error"]["message"]
    assert message.startswith("input length and `max_tokens` exceed context limit: ") and "+ 4096 > 256" in message


# ---- size before tokenising, and the memory a refusal leaves ---------------------------------------

def test_a_10mb_prompt_is_refused_before_tokenising_and_leaves_no_resident_memory(start_server):
    server = start_server()   # a Daphne process: the test measures the server's resident memory
    process = psutil.Process(server.proc.pid)
    assert server.chat(DEMO).status_code == 200       # the model loaded and warm
    big = "hello world " * (10 * 2**20 // 12)
    before = process.memory_info().rss
    started = time.monotonic()
    error = _error(server.post("/v1/chat/completions", {"model": DEMO, "messages": [{"role": "user", "content": big}],
                                                        "max_tokens": 4}))
    took = time.monotonic() - started
    time.sleep(0.5)
    grew = process.memory_info().rss - before
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert "OMLX_PROMPT_CHARS_PER_TOKEN" in error["message"] and "131072" in error["message"]
    # tokenising it took 24 s and left 641 MiB resident (measured before the size check)
    assert took < 10, took
    assert grew < 48 * 2**20, f"{grew / 2**20:.0f} MiB"
    # the same on /v1/completions and /v1/messages/count_tokens
    assert _error(server.post("/v1/completions", {"model": DEMO, "prompt": big}))["code"] == "context_length_exceeded"
    counted = server.post("/v1/messages/count_tokens", {"model": DEMO, "messages": [{"role": "user", "content": big}]})
    assert counted.status_code == 400 and counted.json()["error"]["message"].startswith("prompt is too long")
    assert server.chat(DEMO).status_code == 200


def test_megabytes_of_tools_are_refused_by_their_size_before_tokenising(server):
    """The chat template renders the tools into the prompt: 6 MB of them were tokenised first (seconds
    and hundreds of MiB), then refused by their tokens."""
    description = "a tool that does something useful " * 1400           # 128 of them: ~6 MB
    functions = [{"type": "function", "function": {"name": f"f{i}", "description": description,
                                                   "parameters": {"type": "object"}}} for i in range(128)]
    started = time.monotonic()
    with pytest.raises(openai.BadRequestError) as refused:
        server.openai().chat.completions.create(model=DEMO, messages=HI, max_tokens=2, tools=functions)
    error = refused.value.body
    assert error["code"] == "context_length_exceeded" and error["param"] == "tools"
    assert error["prompt_characters"] > 6_000_000 and "131072 characters" in error["message"]
    with pytest.raises(anthropic.BadRequestError) as refused_too:
        server.anthropic().messages.create(model=DEMO, max_tokens=2, messages=HI, tools=[
            {"name": f"f{i}", "description": description, "input_schema": {"type": "object"}} for i in range(128)])
    assert "characters > 131072 maximum" in refused_too.value.message
    ollama = server.post("/api/chat", {"model": DEMO, "messages": HI, "stream": False, "tools": functions})
    assert ollama.status_code == 400 and "131072 characters" in ollama.json()["error"]
    assert time.monotonic() - started < 10


# ---- documented limits -------------------------------------------------------------------------------

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("body, param, words", [
    ({"stop": ["x" * 257]}, "stop", "at most 256 characters"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4 stop strings"),
    ({"messages": HI * 2049}, "messages", "at most 2048"),
    ({"tools": [{"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}}
                for i in range(129)]}, "tools", "at most 128"),
    ({"n": 9}, "n", "between 1 and 8"),
])
def test_openai_limits_are_400s_naming_the_field(server, body, param, words):
    error = _error(server.post("/v1/chat/completions", {"model": DEMO, "messages": HI, "max_tokens": 2, **body}))
    assert error["param"] == param and words in error["message"], error


@pytest.mark.parametrize("body, param, words", [
    ({"stop_sequences": ["x" * 257]}, "stop_sequences", "at most 256 characters"),
    ({"messages": HI * 2049}, "messages", "at most 2048"),
    ({"tools": [{"name": f"f{i}", "input_schema": {"type": "object"}} for i in range(129)]}, "tools", "at most 128"),
])
def test_anthropic_limits_are_400s_naming_the_field(server, body, param, words):
    response = server.post("/v1/messages", {"model": DEMO, "messages": HI, "max_tokens": 2, **body})
    assert response.status_code == 400, response.text[:300]
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"].startswith(param) and words in error["message"]


def test_a_body_over_the_size_limit_is_refused(server):
    body = b'{"model": "%s", "prompt": "' % DEMO.encode() + b"x" * (64 * 2**20) + b'"}'
    error = _error(server.post("/v1/completions", content=body, headers={"Content-Type": "application/json"}))
    assert "larger than 64 MiB" in error["message"]


# ---- keep-alives while a long prompt is read ----------------------------------------------------------

def _long_prompt() -> str:
    return _words(450)         # a second or more of prefill for the demo model on a CPU: five keep-alives or more


def test_openai_stream_sends_comments_until_the_first_token(server):
    body = {"model": DEMO, "messages": [{"role": "user", "content": _long_prompt()}], "max_tokens": 3,
            "stream": True, "cache_prompt": False}
    with server.stream_request("POST", "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        # a load's progress comments come first when the model loads for this request (test_load_progress_stream.py)
        lines = [line for line in r.iter_lines() if line and not line.startswith(": loading ")]
    first_text = next(i for i, line in enumerate(lines) if '"content": "' in line and '"content": ""' not in line)
    keepalives = [i for i, line in enumerate(lines) if line == ": keep-alive"]
    assert lines[0].startswith("data: ") and '"role": "assistant"' in lines[0]     # the first chunk is unchanged
    assert keepalives and max(keepalives) < first_text, lines[:8]
    assert lines[-1] == "data: [DONE]"
    # the official client reads the same stream
    stream = server.openai().chat.completions.create(
        model=DEMO, messages=[{"role": "user", "content": _long_prompt()}], max_tokens=3, stream=True)
    chunks = list(stream)
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")


def test_completions_stream_sends_comments_too(server):
    body = {"model": DEMO, "prompt": _long_prompt(), "max_tokens": 2, "stream": True}
    with server.stream_request("POST", "/v1/completions", json=body, timeout=120) as r:
        lines = [line for line in r.iter_lines() if line]
    assert ": keep-alive" in lines and lines.index(": keep-alive") < next(
        i for i, line in enumerate(lines) if line.startswith("data: {"))


def test_anthropic_stream_sends_pings_until_the_first_token(server):
    body = {"model": DEMO, "max_tokens": 3, "stream": True, "messages": [{"role": "user", "content": _long_prompt()}]}
    with server.stream_request("POST", "/v1/messages", json=body, timeout=120) as r:
        events = [line.removeprefix("event: ") for line in r.iter_lines() if line.startswith("event: ")]
    assert events[0] == "message_start"
    assert events[1] == "ping" and events[2] == "ping", events[:6]
    assert events[-1] == "message_stop"
    # the SDK's stream reader skips them
    c = server.anthropic()
    with c.messages.stream(model=DEMO, max_tokens=3, messages=[{"role": "user", "content": _long_prompt()}]) as s:
        final = s.get_final_message()
    assert final.usage.output_tokens > 0


@pytest.mark.parametrize("delays, interval, expected", [
    ([0.3, 0, 0], 0.1, "KKxxx"),         # late first chunk: keep-alives, then chunks as they come
    ([0, 0.3, 0], 0.1, "xxx"),           # none after the first chunk, however late the next one is
    ([0.3], None, "x"),                  # off
    ([], 0.1, ""),                       # no chunks at all
])
def test_until_first(delays, interval, expected):
    async def chunks():
        for delay in delays:
            await asyncio.sleep(delay)
            yield "x"

    async def run():
        return "".join(["K" if item is KEEPALIVE else item async for item in until_first(chunks(), interval)])
    said = asyncio.run(run())
    assert said.replace("K", "") == expected.replace("K", "") and ("K" in said) == ("K" in expected), said


def test_closing_the_stream_during_keepalives_cancels_the_wait():
    cancelled = asyncio.Event()

    async def chunks():
        try:
            await asyncio.sleep(30)
            yield "x"
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def run():
        stream = until_first(chunks(), 0.05)
        assert await anext(stream) is KEEPALIVE
        await stream.aclose()
        await asyncio.wait_for(cancelled.wait(), 2)
    asyncio.run(run())


# ---- messages that name the right thing -------------------------------------------------------------

def test_a_bad_completion_prompt_is_not_called_a_chat_template_error(server):
    # a lone surrogate: no tokenizer takes it (the body is refused as it is read, pool/strict_json.py)
    error = _error(server.post("/v1/completions",
                               content=b'{"model": "%s", "prompt": "bad \\ud800 text"}' % DEMO.encode(),
                               headers={"Content-Type": "application/json"}))
    assert "template" not in error["message"] and "surrogate" in error["message"]
    # a prompt that does not fit names the prompt, not messages or a template
    error = _error(server.post("/v1/completions", {"model": CTX, "prompt": _words(600)}))
    assert error["param"] == "prompt" and "template" not in error["message"] and "messages" not in error["message"]


def test_a_failed_load_shows_no_absolute_paths(server):
    response = server.post("/v1/chat/completions", {"model": BROKEN, "messages": HI, "max_tokens": 2})
    error = _error(response, 409)
    assert error["code"] == "model_unavailable"
    assert str(server.home) not in error["message"] and "/tmp" not in error["message"], error["message"]
    assert f"{BROKEN}/model.safetensors" in error["message"], error["message"]
    again = _error(server.post("/v1/chat/completions", {"model": BROKEN, "messages": HI, "max_tokens": 2}), 409)
    assert str(server.home) not in again["message"]
    failure = next(m for m in server.pool()["models"] if m["id"] == BROKEN)["failure"]
    assert failure and str(server.home) not in failure
