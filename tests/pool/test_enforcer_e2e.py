"""The real enforcer loop, driven by the fake probe ($OMLX_HOME/fake_probe.json) for exact numbers,
then by real memory with real fixture models."""

import json
import threading

import httpx
import pytest

GB = 10**9
CHAT = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def models(make_model):
    return {name: make_model(f"enf-{name}", 20, seed=10 + i) for i, name in enumerate("abc")}


def set_usage(server, **reading):
    (server.home / "fake_probe.json").write_text(json.dumps(reading))


def tick(server) -> dict:
    r = server.post("/api/enforcer/tick", {})
    assert r.status_code == 200, r.text
    return r.json()


def ask(server, model, **body):
    return server.post("/v1/chat/completions", {"model": model, "messages": CHAT, "max_tokens": 2, **body})


def states(server):
    return {m["id"]: m["state"] for m in server.pool()["models"]}


def reasons(server):
    return [e["reason"] for e in server.get("/api/evictions").json()["events"]]


def stream_in_background(server, model):
    lines = []

    def run():
        with httpx.stream("POST", server.url + "/v1/completions", timeout=60,
                          json={"model": model, "prompt": "x", "max_tokens": 100000, "stream": True}) as r:
            lines.extend(r.iter_lines())
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    server.wait_for(lambda: server.model(model)["active_requests"] == 1 and server.model(model)["state"] == "loaded")
    return lines, thread


@pytest.fixture
def server(start_server, models):
    s = start_server(models, demo=False, OMLX_MEMORY_PROBE="fake", OMLX_MEMORY_CEILING="10GB",
                     OMLX_ADMISSION_WAIT="1")
    set_usage(s, rss=1 * GB, cache=0)
    return s


def test_lines_and_level_in_the_snapshot(server):
    memory = tick(server)["memory"]
    assert (memory["ceiling_bytes"], memory["soft_bytes"], memory["hard_bytes"]) == (10 * GB, 9 * GB, 9.5 * GB)
    assert memory["level"] == "ok" and not memory["admission_paused"] and memory["usage_bytes"] == 1 * GB


def test_soft_keeps_the_last_unpinned_model_and_pauses_admission(server):
    ask(server, "a"), ask(server, "b")
    set_usage(server, rss=int(9.2 * GB), cache=0)
    result = tick(server)
    assert result["level"] == "soft" and result["memory"]["admission_paused"]
    assert [(a["kind"], a["model"]) for a in result["actions"]] == [("unload", "a")]  # LRU first, b stays
    assert states(server) == {"a": "unloaded", "b": "loaded", "c": "unloaded"}
    assert "pressure_soft" in reasons(server)
    assert tick(server)["actions"] == []  # the last unpinned model is kept at soft

    r = ask(server, "b")  # waits OMLX_ADMISSION_WAIT, then is told
    assert r.status_code == 503 and r.json()["error"]["code"] == "memory_pressure"
    assert int(r.headers["Retry-After"]) >= 1

    set_usage(server, rss=1 * GB, cache=0)
    assert tick(server)["level"] == "ok"
    assert ask(server, "b").status_code == 200


def test_a_waiting_request_is_admitted_when_pressure_clears(server):
    ask(server, "a")
    set_usage(server, rss=int(9.2 * GB), cache=0)
    tick(server)
    result = {}
    waiter = threading.Thread(target=lambda: result.setdefault("r", ask(server, "a")))
    server.env["OMLX_ADMISSION_WAIT"] = "1"
    waiter.start()
    set_usage(server, rss=1 * GB, cache=0)
    tick(server)
    waiter.join(30)
    assert result["r"].status_code == 200


def test_reclaim_comes_first(server):
    ask(server, "a")
    set_usage(server, rss=int(9.2 * GB), cache=int(0.5 * GB))
    kinds = [a["kind"] for a in tick(server)["actions"]]
    assert kinds[0] == "reclaim"
    assert "cache_reclaim" in reasons(server)


def test_hard_evicts_the_last_idle_model_and_aborts_the_busy_one(server):
    ask(server, "a")
    lines, thread = stream_in_background(server, "b")
    set_usage(server, rss=int(9.7 * GB), cache=0)
    result = tick(server)
    assert result["level"] == "hard"
    assert [(a["kind"], a["model"]) for a in result["actions"]] == [("unload", "a"), ("abort_requests", "b")]
    thread.join(20)
    data = [l for l in lines if l.startswith("data: ")]
    assert '"memory_pressure"' in data[-2] and data[-1] == "data: [DONE]"
    # the abort kept b loaded; once idle, the next tick at hard may evict it like any idle model
    assert {"pressure_hard", "requests_aborted"} <= set(reasons(server))


def test_emergency_by_two_polls_aborts_even_pinned_requests(server):
    server.post("/admin/model/a/settings", {"is_pinned": True})
    lines_a, thread_a = stream_in_background(server, "a")
    lines_b, thread_b = stream_in_background(server, "b")
    set_usage(server, rss=10 * GB + 1, cache=0)
    first = tick(server)
    assert first["level"] == "hard"  # at the ceiling once: not yet an emergency
    assert ("abort_requests", "b") in [(a["kind"], a["model"]) for a in first["actions"]]
    thread_a.join(20)  # the next poll (woken by b's request ending) is the second at the ceiling
    assert any('"memory_pressure"' in l for l in lines_a)  # pinned models' requests too
    assert "emergency" in reasons(server)
    assert states(server)["a"] == "loaded"  # pinned: aborted, never unloaded
    thread_b.join(20)


def test_emergency_by_margin_in_one_poll(server):
    server.post("/admin/model/a/settings", {"is_pinned": True})
    lines, thread = stream_in_background(server, "a")
    set_usage(server, rss=13 * GB, cache=0)  # over the ceiling by more than 2 GiB
    result = tick(server)
    assert result["level"] == "emergency"
    assert ("abort_requests", "a") in [(a["kind"], a["model"]) for a in result["actions"]]
    thread.join(20)
    assert any('"memory_pressure"' in l for l in lines)
    assert states(server)["a"] == "loaded"


def test_prefill_guard_refuses_up_front(server):
    ask(server, "a")
    set_usage(server, rss=int(9.49 * GB), cache=0)
    long_prompt = "word " * 4000
    r = server.post("/v1/completions", {"model": "a", "prompt": long_prompt, "max_tokens": 1})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "prefill_memory_exceeded" and error["estimated_bytes"] > error["limit_bytes"]


def test_hard_aborts_a_load_in_progress_with_409(start_server, make_model):
    big = make_model("enf-big", 600, seed=19)
    server = start_server({"big": big}, demo=False, OMLX_MEMORY_PROBE="fake", OMLX_MEMORY_CEILING="10GB")
    set_usage(server, rss=1 * GB, cache=0)
    result = {}
    loader = threading.Thread(target=lambda: result.setdefault("r", ask(server, "big")))
    loader.start()
    server.wait_for(lambda: server.model("big")["state"] == "loading", interval=0.01)
    set_usage(server, rss=int(9.7 * GB), cache=0)
    actions = tick(server)["actions"]
    assert ("abort_load", "big") in [(a["kind"], a["model"]) for a in actions]
    loader.join(60)
    r = result["r"]
    assert r.status_code == 409 and r.json()["error"]["code"] == "load_aborted", r.text
    assert server.model("big")["state"] == "unloaded"  # not cached as a failure: it may be retried
    assert "load_aborted" in reasons(server)
