"""Request traces (issue 23) on a real server with the official SDKs: a trace's numbers against
what the client saw, a load's trace naming the eviction it caused, an operator's cancel ending the
stream with its error and giving the KV back, the body capture shown only to staff."""

import time

import httpx
import pytest

from tests.conftest import DEMO

KEY = "trace-test-key"


@pytest.fixture(scope="module")
def server(module_server, demo_model_dir, make_model):
    return module_server({DEMO: demo_model_dir, "tiny-a": make_model("trace-a", 20, seed=41),
                          "tiny-b": make_model("trace-b", 20, seed=42)},
                         OMLX_API_KEY=KEY, OMLX_MAX_LOADED_MODELS="2")


def trace_of(server, request_id: str) -> dict:
    """The finished trace (the API reads it from memory until the writer has stored it)."""
    reply = server.get(f"/api/requests/{request_id}")
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_a_streamed_chat_trace_counts_what_the_client_saw(server):
    client = server.openai()
    started = time.perf_counter()
    raw = client.chat.completions.with_raw_response.create(
        model=DEMO, messages=[{"role": "user", "content": "Count to five."}], max_tokens=12, stream=True,
        stream_options={"include_usage": True})
    request_id = raw.headers["x-omlx-request-id"]
    first_token, usage = None, None
    for chunk in raw.parse():
        if first_token is None and chunk.choices and chunk.choices[0].delta.content:
            first_token = time.perf_counter() - started
        if chunk.usage is not None:
            usage = chunk.usage
    trace = trace_of(server, request_id)
    assert trace["model"] == DEMO and trace["dialect"] == "openai" and trace["route"] == "/v1/chat/completions"
    assert trace["stream"] is True and trace["status"] == 200 and trace["error"] is None
    assert trace["prompt_tokens"] == usage.prompt_tokens and trace["completion_tokens"] == usage.completion_tokens
    assert trace["cached_tokens"] == usage.prompt_tokens_details.cached_tokens
    assert trace["finish_reason"] == "length" and trace["phase"] == "done"
    assert 0 < trace["ttft_ms"] <= first_token * 1000      # the server saw it first
    assert trace["decode_tps"] > 0 and trace["peak_kv_bytes"] > 0
    assert trace["key"] == "bootstrap"      # OMLX_API_KEY's name among the keys (pool/keys)
    assert "body" not in trace                               # no capture unless the model asks


def test_an_anthropic_message_is_traced_in_its_dialect(server):
    client = server.anthropic()
    raw = client.messages.with_raw_response.create(model=DEMO, max_tokens=5,
                                                   messages=[{"role": "user", "content": "hi"}])
    message = raw.parse()
    trace = trace_of(server, raw.headers["x-omlx-request-id"])
    assert trace["dialect"] == "anthropic" and trace["route"] == "/v1/messages" and trace["stream"] is False
    assert trace["prompt_tokens"] == message.usage.input_tokens + message.usage.cache_read_input_tokens
    assert trace["completion_tokens"] == message.usage.output_tokens


def test_a_refused_request_is_traced_with_its_error(server):
    reply = server.chat(DEMO, max_tokens=10**7)
    assert reply.status_code == 400
    listed = server.wait_for(
        lambda: server.get("/api/requests", params={"status": "400", "model": DEMO}).json()["data"])
    assert listed[0]["error"] == reply.json()["error"]["code"] == "context_length_exceeded"


def test_a_request_that_loads_its_model_names_the_eviction_it_caused(server):
    client = server.openai()
    for model in ("tiny-a", "tiny-b"):                  # two loaded: the cap
        client.completions.create(model=model, prompt="x", max_tokens=1)
    raw = client.completions.with_raw_response.create(model=DEMO, prompt="x", max_tokens=1)
    trace = trace_of(server, raw.headers["x-omlx-request-id"])
    assert trace["load_started"] is True and trace["load_model"] == DEMO and trace["load_ms"] > 0
    evicted = [e for e in server.events() if e["action"] == "unload" and e["requested_by"] == DEMO]
    assert evicted and trace["evictions"] == [evicted[0]["id"]]
    assert evicted[0]["detail"].startswith(f"to load '{DEMO}' for {trace['id']}")   # the row names the request
    assert evicted[0]["model"] == "tiny-a"              # the least recently used


def test_an_operator_cancels_a_stream_and_its_kv_is_given_back(server):
    body = {"model": DEMO, "prompt": "x", "max_tokens": 8000, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, headers=server.headers,
                      timeout=60) as response:
        request_id = response.headers["x-omlx-request-id"]
        lines = response.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        live = server.wait_for(lambda: [t for t in server.get("/api/requests/live").json()["data"]
                                        if t["id"] == request_id and t["phase"] == "decoding"])
        assert live[0]["prefill_done"] == live[0]["prefill_total"] > 0
        server.wait_for(lambda: [t for t in server.get("/api/requests/live").json()["data"]
                                 if t["id"] == request_id and t["completion_tokens"] > 1])   # counted as they come
        assert server.model(DEMO)["kv_bytes"] > 0
        assert server.post(f"/api/requests/{request_id}/cancel", {}).json()["cancelled"] is True
        rest = [line for line in lines if line.startswith("data: ")]
    assert '"request_cancelled"' in rest[-2] and rest[-1] == "data: [DONE]"
    server.wait_for(lambda: server.model(DEMO)["kv_bytes"] == 0)
    trace = trace_of(server, request_id)
    assert trace["cancelled"] is True and trace["error"] == "request_cancelled" and trace["status"] == 200
    assert server.post(f"/api/requests/{request_id}/cancel", {}).status_code == 404   # over


def test_cancel_is_for_staff_and_the_server_key(server):
    reply = httpx.post(server.url + "/api/requests/req_0/cancel", json={}, timeout=30)
    assert reply.status_code in (401, 403)


def test_bodies_are_captured_up_to_the_models_cap_for_staff(server):
    assert server.post(f"/admin/model/{DEMO}/settings", {"trace_body_bytes": 20}).status_code == 200
    try:
        raw = server.openai().chat.completions.with_raw_response.create(
            model=DEMO, messages=[{"role": "user", "content": "A secret prompt"}], max_tokens=8)
        answer = raw.parse().choices[0].message.content
        trace = trace_of(server, raw.headers["x-omlx-request-id"])
    finally:
        server.post(f"/admin/model/{DEMO}/settings", {"trace_body_bytes": None})
    body = trace["body"]
    assert len(body["request"].encode()) == 20 and body["truncated"] is True
    assert answer.startswith(body["response"]) and len(body["response"].encode()) <= 20


def test_the_list_pages_and_filters_and_the_summary_counts(server):
    client = server.openai()
    ids = [client.completions.with_raw_response.create(model=DEMO, prompt="x", max_tokens=2)
           .headers["x-omlx-request-id"] for _ in range(3)]
    assert server.chat(DEMO, max_tokens=10**7).status_code == 400
    server.wait_for(lambda: server.get("/api/requests", params={"limit": 1, "status": "error"}).json()["data"])
    server.wait_for(lambda: ids[-1] in
                     {t["id"] for t in server.get("/api/requests", params={"limit": 5}).json()["data"]})
    first = server.get("/api/requests", params={"limit": 2, "model": DEMO}).json()
    assert len(first["data"]) == 2 and first["next"] == first["data"][-1]["id"]
    second = server.get("/api/requests", params={"limit": 2, "model": DEMO, "before": first["next"]}).json()
    assert second["data"] and not {t["id"] for t in second["data"]} & {t["id"] for t in first["data"]}
    assert server.get("/api/requests", params={"limit": "many"}).status_code == 400
    rows = server.get("/api/requests/summary").json()["windows"]["5m"]
    demo = next(r for r in rows if r["model"] == DEMO)
    assert demo["count"] >= 3 and demo["errors"] >= 1 and demo["ttft_ms"]["p50"] > 0
    metrics = server.get("/metrics").text
    assert f'request_ttft_seconds_count{{key="bootstrap",model="{DEMO}"}}' in metrics
    assert "request_queue_wait_seconds_bucket" in metrics and "request_decode_tokens_per_second_sum" in metrics


def test_a_client_that_goes_away_is_traced_as_disconnected(server):
    body = {"model": DEMO, "prompt": "x", "max_tokens": 8000, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, headers=server.headers,
                      timeout=60) as response:
        request_id = response.headers["x-omlx-request-id"]
        next(line for line in response.iter_lines() if line.startswith("data: {"))
    trace = server.wait_for(lambda: server.get(f"/api/requests/{request_id}").json().get("ended") and
                            server.get(f"/api/requests/{request_id}").json())
    assert trace["disconnected"] is True and trace["cancelled"] is False and trace["finish_reason"] is None
    server.wait_for(lambda: server.model(DEMO)["kv_bytes"] == 0)
