"""The OpenAI routes through the ASGI application in this process, with the official openai client and plain HTTP."""

import threading
import time

import openai
import pytest

from tests.conftest import DEMO

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(module_asgi_server, demo_model_dir, make_model):
    return module_asgi_server({DEMO: demo_model_dir, "tiny": make_model("tiny-20", 20)})


def test_health_and_models(server):
    assert server.get("/health").json() == {"status": "ok"}
    client = server.openai()
    ids = [m.id for m in client.models.list().data]
    assert DEMO in ids and "tiny" in ids
    assert client.models.retrieve(DEMO).id == DEMO


def test_demo_model_says_paris(server):
    reply = server.openai().chat.completions.create(model=DEMO, messages=QUESTION, max_tokens=16, temperature=0)
    assert "Paris" in reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_streaming_with_usage(server):
    stream = server.openai().chat.completions.create(model=DEMO, messages=QUESTION, max_tokens=16, temperature=0,
                                                     stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_length_and_stop(server):
    client = server.openai()
    short = client.completions.create(model="tiny", prompt="Hello", max_tokens=3)
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 3
    stopped = client.chat.completions.create(model=DEMO, messages=QUESTION, max_tokens=16, temperature=0,
                                             stop=["France"])
    assert stopped.choices[0].finish_reason == "stop"
    assert "France" not in stopped.choices[0].message.content


def test_completions_stream(server):
    stream = server.openai().completions.create(model="tiny", prompt="Hello", max_tokens=4, stream=True)
    chunks = list(stream)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_seed_repeats(server):
    client = server.openai()
    a = client.completions.create(model="tiny", prompt="Hi", max_tokens=6, temperature=1.0, seed=7)
    b = client.completions.create(model="tiny", prompt="Hi", max_tokens=6, temperature=1.0, seed=7)
    assert a.choices[0].text == b.choices[0].text


@pytest.mark.parametrize("body, param", [
    ({"messages": QUESTION}, "model"),
    ({"model": DEMO}, "messages"),
    ({"model": DEMO, "messages": []}, "messages"),
    ({"model": DEMO, "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"model": DEMO, "messages": [{"role": {"a": 1}, "content": "Hi"}]}, "messages[0].role"),     # was a 500
    ({"model": DEMO, "messages": [{"role": ["user"], "content": "Hi"}]}, "messages[0].role"),
    ({"model": DEMO, "messages": QUESTION, "max_tokens": 0}, "max_tokens"),
    ({"model": DEMO, "messages": QUESTION, "max_tokens": "ten"}, "max_tokens"),
    ({"model": DEMO, "messages": QUESTION, "temperature": 9}, "temperature"),
    ({"model": DEMO, "messages": QUESTION, "top_p": 0}, "top_p"),
    ({"model": DEMO, "messages": QUESTION, "stop": 5}, "stop"),
    ({"model": DEMO, "messages": QUESTION, "stream": "yes"}, "stream"),
    ({"model": DEMO, "messages": QUESTION, "keep_alive": "soon"}, "keep_alive"),
    ({"model": DEMO, "messages": QUESTION, "seed": -1}, "seed"),
    ({"model": DEMO, "messages": QUESTION, "seed": 2**64}, "seed"),
    ({"model": DEMO, "messages": QUESTION, "n": True}, "n"),
    ({"model": DEMO, "messages": QUESTION, "stream_options": {"include_usage": "no"}}, "include_usage"),
])
def test_bad_fields_are_400_naming_the_field(server, body, param):
    r = server.post("/v1/chat/completions", body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert set(error) >= {"message", "type", "param", "code"}


@pytest.mark.parametrize("role", [{"a": 1}, ["user"], 1, None])
def test_a_role_that_is_no_string_is_a_400_naming_it_in_every_dialect(server, role):
    messages = [{"role": role, "content": "Hi"}]
    with pytest.raises(openai.BadRequestError) as refused:
        server.openai().chat.completions.create(model=DEMO, messages=messages, max_tokens=2)
    assert refused.value.body["param"] == "messages[0].role"
    anthropic = server.post("/v1/messages", {"model": DEMO, "max_tokens": 2, "messages": messages})
    assert anthropic.status_code == 400 and anthropic.json()["error"]["message"].startswith("messages.0.role")
    ollama = server.post("/api/chat", {"model": DEMO, "stream": False, "messages": messages})
    assert ollama.status_code == 400 and "messages[0].role" in ollama.json()["error"]


def test_malformed_json(server):
    r = server.post("/v1/chat/completions", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("raw", [
    b'{"model": "tiny", "prompt": "x", "temperature": NaN}',
    b'{"model": "tiny", "prompt": "x", "keep_alive": Infinity}',
    b'{"model": "tiny", "prompt": "x", "top_p": -Infinity}',
    b"[" * 100_000,
    b'{"model": "tiny", "messages": ' + b'{"a": ' * 2000 + b"1" + b"}" * 2000 + b"}",
], ids=["nan", "infinity", "minus-infinity", "deep-list", "deep-objects"])
def test_non_finite_numbers_and_deep_nesting_are_400s(server, raw):
    r = server.post("/v1/completions", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text[:300]
    assert server.get("/api/pool").status_code == 200        # and nothing of it reached the snapshot


def test_a_bad_seed_never_wedges_the_model(server):
    for seed in (-1, 2**64):
        assert server.post("/v1/completions", {"model": "tiny", "prompt": "x", "seed": seed}).status_code == 400
    r = server.post("/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 2, "seed": 2**64 - 1})
    assert r.status_code == 200, r.text


def test_answers_a_retry_cannot_change_tell_the_sdks_not_to_retry(start_asgi_server, make_model):
    server = start_asgi_server({"big": make_model("api-big", 60)}, OMLX_MAX_MODEL_MEMORY="50MB")
    r = server.chat("big")
    assert r.status_code == 507 and r.headers["x-should-retry"] == "false"
    client = server.openai(max_retries=2)
    with pytest.raises(openai.APIStatusError) as refused:
        client.completions.create(model="big", prompt="x", max_tokens=1)
    assert refused.value.status_code == 507
    metrics = server.get("/metrics").text
    assert 'requests_total{model="big"} 2.0' in metrics.splitlines()   # the SDK sent it once, not three times


def test_unknown_model_404_lists_ids(server):
    r = server.post("/v1/chat/completions", {"model": "nope", "messages": QUESTION})
    assert r.status_code == 404
    error = r.json()["error"]
    assert error["code"] == "model_not_found" and DEMO in error["message"] and "tiny" in error["message"]
    assert server.get("/v1/models/nope").status_code == 404
    with pytest.raises(openai.NotFoundError):
        server.openai().chat.completions.create(model="nope", messages=QUESTION)


def test_ollamas_latest_names_resolve_in_every_dialect(server):
    """Codex's Ollama mode lists /api/tags (`name:latest`) and sends that name to /v1/responses."""
    name = f"{DEMO}:latest"
    client = server.openai()
    reply = client.chat.completions.create(model=name, messages=QUESTION, max_tokens=2)
    assert reply.model == DEMO
    assert client.completions.create(model="tiny:latest", prompt="Hello", max_tokens=2).model == "tiny"
    assert client.models.retrieve(name).id == DEMO
    response = client.responses.create(model=name, input="Hi", max_output_tokens=16)
    assert response.status in ("completed", "incomplete")
    message = server.anthropic().messages.create(model=name, max_tokens=2, messages=QUESTION)
    assert message.content is not None
    with pytest.raises(openai.NotFoundError):       # a tag that is no model's stays a 404
        client.chat.completions.create(model=f"{DEMO}:7b", messages=QUESTION, max_tokens=2)


def test_wrong_method_405(server):
    r = server.get("/v1/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    assert server.post("/v1/models", {}).status_code == 405


def test_unknown_api_path_is_enveloped(server):
    r = server.get("/v1/nothing-here")
    assert r.status_code == 404 and "error" in r.json()


@pytest.mark.parametrize("path", ["/nothing-here", "/models", "/v2/chat/completions", "/static/nope.js", "/ws/x"])
def test_every_unknown_path_is_a_json_404_and_the_dashboard_stays_a_page(server, path):
    for method in ("GET", "POST"):
        r = server.fetch(method, path, headers={"Accept": "text/html"}, timeout=10)
        assert r.status_code == 404 and r.headers["content-type"] == "application/json", (method, path, r.text[:200])
        assert r.json()["error"]["code"] == "not_found" and path in r.json()["error"]["message"]
    page = server.fetch("GET", "/", headers={"Accept": "text/html"}, timeout=10)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")


def test_health_answers_while_generating(server):
    """The event loop never blocks: /health stays fast during a long generation."""
    done = threading.Event()

    def long_generation():
        server.post("/v1/completions", {"model": DEMO, "prompt": "Once upon a time", "max_tokens": 40})
        done.set()

    worker = threading.Thread(target=long_generation)
    worker.start()
    time.sleep(0.5)
    latencies = []
    while not done.is_set() and len(latencies) < 20:
        started = time.monotonic()
        assert server.get("/health").status_code == 200
        latencies.append(time.monotonic() - started)
        time.sleep(0.05)
    worker.join()
    assert latencies and max(latencies) < 1.0, latencies


def test_disconnect_stops_generation(server):
    """A client that goes away mid-stream: the engine forgets the request."""
    body = {"model": DEMO, "prompt": "Once upon a time", "max_tokens": 500, "stream": True}
    with server.stream_request("POST", "/v1/completions", timeout=60, json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                assert server.model(DEMO)["active_requests"] == 1
                break  # closes the connection
    server.wait_for(lambda: server.model(DEMO)["active_requests"] == 0, timeout=5)


def test_a_body_over_the_limit_is_a_clear_400(server):
    r = server.post("/v1/completions", content=b'{"model": "tiny", "prompt": "' + b"x" * (65 * 2**20) + b'"}',
                    headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "larger than" in r.json()["error"]["message"]
