"""Where a fleet serves a request, end to end: two real hosts that meet in a real Redis, each allowed
one loaded model (OMLX_MAX_LOADED_MODELS=1) and a model budget of its own, and clients that talk to
one of them. Every test starts from nothing loaded anywhere (Fleet.unload_all)."""

import json
import time

import httpx
import pytest

from tests.fleet.hosts import (
    Fleet,
    error_of,
    fleet_state,
    model_row,
    requests_served,
    small_models,
    sse_data,
    states,
    wait_until,
)

MINILM = "all-MiniLM-L6-v2"
BUDGETS = {"a": "140MB", "b": "150MB"}
HUGE_MB = 160        # over both budgets


@pytest.fixture(scope="module")
def folders(make_model):
    small = small_models(make_model, "x", "y", "m", "n", "only-b")
    return {**small, "huge": make_model("fleet-huge", HUGE_MB, seed=49)}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, migrated_db, redis, folders, minilm_dir):
    """a: x, m, n, huge. b: y, m, n, only-b, huge, huge-on-b (huge's folder under another name), MiniLM."""
    f = folders
    fleet = Fleet(tmp_path_factory.mktemp("routing"), migrated_db, redis.new_url(), OMLX_MAX_LOADED_MODELS=1)
    try:
        fleet.start({"a": {"x": f["x"], "m": f["m"], "n": f["n"], "huge": f["huge"]},
                     "b": {"y": f["y"], "m": f["m"], "n": f["n"], "only-b": f["only-b"], "huge": f["huge"],
                           "huge-on-b": f["huge"], MINILM: minilm_dir}},
                    env={host: {"OMLX_MAX_MODEL_MEMORY": budget} for host, budget in BUDGETS.items()})
        yield fleet
    finally:
        fleet.close()


@pytest.fixture
def ab(fleet):
    fleet.unload_all()
    return fleet["a"], fleet["b"]


def served_by(response: httpx.Response, host: str, placement: str | None = None) -> None:
    assert response.status_code == 200, response.text
    assert response.headers["x-omlx-host"] == host, (response.headers, response.text[:300])
    if placement is not None:
        assert response.headers.get("x-omlx-placement") == placement, response.headers


# ---- loaded, fits, evicts, no room ----------------------------------------------------------------

def test_a_request_goes_to_the_host_that_has_the_model_loaded(fleet, ab):
    a, b = ab
    served_by(a.post("/api/models/m/load?host=b", {}), "b")
    fleet.wait_published()
    before = requests_served(b, "m")

    served_by(a.chat("m"), "b", "loaded")
    raw = a.openai().chat.completions.with_raw_response.create(
        model="m", max_tokens=2, messages=[{"role": "user", "content": "hello"}])
    assert raw.headers["x-omlx-host"] == "b" and raw.headers["x-omlx-placement"] == "loaded"
    assert raw.parse().choices[0].message.role == "assistant"

    assert requests_served(b, "m") == before + 2
    assert states(a)["m"] == "unloaded" and requests_served(a, "m") == 0      # a never loaded it


def test_a_new_model_goes_to_the_host_where_it_fits_without_evicting(fleet, ab):
    a, b = ab
    served_by(a.chat("x"), "a")                 # a is full (one model)
    fleet.wait_published()
    served_by(a.chat("n"), "b", "fits")
    assert states(a)["x"] == "loaded" and states(a)["n"] == "unloaded"
    assert states(b)["n"] == "loaded"

    fleet.unload_all()                          # and the other way round: b full, a empty
    served_by(b.chat("y"), "b")
    fleet.wait_published()
    served_by(b.chat("n"), "a", "fits")
    assert states(b)["y"] == "loaded" and states(b)["n"] == "unloaded"


def test_an_eviction_goes_to_the_host_whose_victim_was_used_least_recently(fleet, ab):
    a, b = ab
    served_by(a.chat("y"), "b", "fits")         # b's y, then a's x: b's is the older
    served_by(a.chat("x"), "a")
    fleet.wait_published()
    served_by(a.chat("n"), "b", "evicts")       # not a (the smaller id), whose x is newer
    assert states(b)["y"] == "unloaded" and states(b)["n"] == "loaded"
    assert states(a)["x"] == "loaded" and states(a)["n"] == "unloaded"

    fleet.wait_published()                      # now a's x is the older: m goes there
    served_by(b.chat("m"), "a", "evicts")
    assert states(a)["x"] == "unloaded" and states(a)["m"] == "loaded"
    assert states(b)["n"] == "loaded"


def test_a_model_that_fits_nowhere_is_a_507_naming_each_hosts_reason(fleet, ab):
    a, b = ab
    for entry in (a, b):
        r = entry.chat("huge")
        assert r.status_code == 507, r.text
        error = error_of(r)
        assert error["code"] == "insufficient_memory", error
        message = error["message"]
        assert "'huge'" in message and "on a:" in message and "on b:" in message, message
        on_a, on_b = message.split("on a:")[1].split("on b:")
        assert "140.0 MB" in on_a and "150.0 MB" in on_b, message     # each host's own budget
    assert "loaded" not in states(a).values() and "loaded" not in states(b).values()


# ---- a model only another host has ----------------------------------------------------------------

def test_a_model_only_b_has_is_served_through_a_on_every_route(fleet, ab):
    a, b = ab
    assert not {"only-b", MINILM} & set(states(a))
    served_by(a.chat("only-b"), "b", "fits")

    card = a.get("/v1/models/only-b")
    served_by(card, "b")
    assert card.json()["id"] == "only-b"
    assert {"only-b", MINILM, "x", "y"} <= {m["id"] for m in a.get("/v1/models").json()["data"]}

    raw = a.anthropic().messages.with_raw_response.create(
        model="only-b", max_tokens=2, messages=[{"role": "user", "content": "hello"}])
    assert raw.headers["x-omlx-host"] == "b", raw.headers
    assert raw.parse().role == "assistant"

    r = a.post("/v1/embeddings", {"model": MINILM, "input": ["the sea", "the mountains"]})
    served_by(r, "b")
    assert [len(d["embedding"]) for d in r.json()["data"]] == [384, 384]

    assert not {"only-b", MINILM} & set(states(a))         # nothing of it ever on a
    assert requests_served(b, "only-b") >= 2 and requests_served(b, MINILM) >= 1


def test_ollamas_routes_see_the_whole_fleet(fleet, ab):
    """Open WebUI's calls, at a: /api/tags lists b's models too, a chat names `only-b:latest`, /api/ps shows
    it loaded on b, and the unload verb reaches b."""
    a, b = ab
    tags = [m["name"] for m in a.get("/api/tags").json()["models"]]
    assert {"only-b:latest", f"{MINILM}:latest", "x:latest", "y:latest"} <= set(tags) and len(tags) == len(set(tags))
    chat = a.post("/api/chat", {"model": "only-b:latest", "messages": [{"role": "user", "content": "hi"}],
                                "stream": False, "options": {"num_predict": 2}})
    served_by(chat, "b", "fits")
    assert chat.json()["model"] == "only-b:latest" and chat.json()["done"] is True
    fleet.wait_published()
    assert [m["name"] for m in a.get("/api/ps").json()["models"]] == ["only-b:latest"]
    assert [m["name"] for m in b.get("/api/ps").json()["models"]] == ["only-b:latest"]
    served_by(a.post("/api/embed", {"model": f"{MINILM}:latest", "input": "the sea"}), "b")
    unload = a.post("/api/generate", {"model": "only-b:latest", "prompt": "", "keep_alive": 0})
    served_by(unload, "b")
    assert unload.json()["done_reason"] == "unload" and states(b)["only-b"] == "unloaded"


def test_an_operator_call_goes_to_the_host_it_names(fleet, ab):
    a, b = ab
    served_by(b.post("/api/models/m/load?host=a", {}), "a")
    assert states(a)["m"] == "loaded" and states(b)["m"] == "unloaded"
    r = a.post("/api/models/only-b/load?host=a", {})     # a has no such folder
    assert r.status_code == 404, r.text
    served_by(b.post("/api/models/m/unload?host=a", {}), "a")
    assert states(a)["m"] == "unloaded"


def test_what_a_model_is_needs_no_room_for_it(fleet, ab):
    """Its card, its settings and its load plan, asked at a host without its folder, of a model too
    large for the one host that has it: answered there, not refused for want of memory."""
    a, b = ab
    assert b.get("/v1/models/huge-on-b").status_code == 200        # b itself answers
    for path in ("/v1/models/huge-on-b", "/admin/model/huge-on-b/settings", "/api/models/huge-on-b/load-plan"):
        r = a.get(path)
        assert r.status_code == 200, (path, r.status_code, r.text)
        assert r.headers["x-omlx-host"] == "b", (path, r.headers)
    assert a.get("/api/models/huge-on-b/load-plan").json()["fits"] is False


# ---- prompt prefixes --------------------------------------------------------------------------------

def test_a_chat_goes_back_to_the_host_whose_prompt_cache_holds_its_start(fleet, ab):
    a, b = ab
    served_by(a.post("/api/models/m/load?host=b", {}), "b")
    fleet.wait_published()
    first = [{"role": "user", "content": "Tell me about the sea."}]
    r = a.chat("m", messages=first)
    served_by(r, "b", "loaded")
    reply = r.json()["choices"][0]["message"]["content"]

    served_by(b.post("/api/models/m/load?host=a", {}), "a")       # now loaded on both, both idle
    wait_until(lambda: next(h for h in fleet_state(a)["hosts"] if h["host"] == "b")["prefix_keys"] >= 1, 10,
               "b to publish the chat's prefix key")
    fleet.wait_published()
    second = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": "And the hills?"}]
    served_by(a.chat("m", messages=second), "b", "prefix")
    # another chat goes to the least busy host: on a tie, a
    served_by(b.chat("m", messages=[{"role": "user", "content": "Something else."}]), "a", "loaded")


# ---- streams through the hop ------------------------------------------------------------------------

def test_a_stream_through_a_arrives_whole_and_in_order(fleet, ab):
    a, _ = ab
    body = {"model": "only-b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 12, "stream": True}
    with httpx.stream("POST", a.url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.headers
        assert r.headers["x-omlx-host"] == "b" and r.headers["x-omlx-placement"] == "fits", r.headers
        data = sse_data(list(r.iter_lines()))
    assert data[-1] == "[DONE]", data
    chunks = [json.loads(d) for d in data[:-1]]
    assert len(chunks) >= 3 and all(c["object"] == "chat.completion.chunk" for c in chunks), chunks
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop"), chunks[-1]


def test_a_stream_through_a_is_relayed_as_it_comes_and_a_client_that_goes_ends_it_on_b(fleet, ab):
    a, b = ab
    body = {"model": "only-b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8000, "stream": True}
    with httpx.stream("POST", a.url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["x-omlx-host"] == "b", r.headers
        lines = r.iter_lines()
        got = []
        while len(sse_data(got)) < 6:
            got.append(next(lines))
        # these chunks reached the client while b still generates: relayed one by one, not buffered
        assert model_row(b, "only-b")["active_requests"] == 1
        more = time.monotonic() + 1
        while time.monotonic() < more:
            got.append(next(lines))
        assert "[DONE]" not in sse_data(got) and model_row(b, "only-b")["active_requests"] == 1, \
            "the long stream ended by itself"
    # the client closed its connection to a: a closes the hop, and b ends the request
    wait_until(lambda: model_row(b, "only-b")["active_requests"] == 0, 10,
               lambda: f"b to end the request: {model_row(b, 'only-b')}")
    assert model_row(b, "only-b")["state"] == "loaded"
    served_by(a.chat("only-b"), "b")                   # and the hop's pool is fine afterwards
