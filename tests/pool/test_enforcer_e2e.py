"""The real enforcer loop, driven by the fake probe ($OMLX_HOME/fake_probe.json) for exact numbers.

The loop runs on its own while a test also asks for ticks (POST /api/enforcer/tick), so either may
be the one that acts: the tests check outcomes (states, events, what clients got), not which tick."""

import json
import threading

import pytest

STAND_IN_DEMO = True   # shapes, errors and faults, not answers: tests/conftest.py demo_folder

GB = 10**9


@pytest.fixture(scope="module")
def models(make_model):
    return {name: make_model(f"enf-{name}", 20, seed=10 + i) for i, name in enumerate("abc")}


def set_usage(server, **reading):
    (server.home / "fake_probe.json").write_text(json.dumps(reading))


def tick(server) -> dict:
    r = server.post("/api/enforcer/tick", {})
    assert r.status_code == 200, r.text
    return r.json()


def reasons(server) -> list[str]:
    return [e["reason"] for e in server.events()]


@pytest.fixture
def server(start_server, models):
    # The scenarios here are about models; the prompt cache rung has its own tests
    # (test_enforcer_core, test_prompt_cache), and would free nothing the fixed fake readings show.
    s = start_server(models, demo=False, OMLX_MEMORY_PROBE="fake", OMLX_MEMORY_CEILING="10GB",
                     OMLX_ADMISSION_WAIT="1", OMLX_PROMPT_CACHE_BYTES="off")
    set_usage(s, rss=1 * GB, cache=0)
    return s


def test_lines_and_level_in_the_snapshot(server):
    memory = tick(server)["memory"]
    assert (memory["ceiling_bytes"], memory["soft_bytes"], memory["hard_bytes"]) == (10 * GB, 9 * GB, 9.5 * GB)
    assert memory["level"] == "ok" and not memory["admission_paused"] and memory["usage_bytes"] == 1 * GB


def test_soft_keeps_the_last_unpinned_model_and_pauses_admission(server):
    server.chat("a"), server.chat("b")
    set_usage(server, rss=int(9.2 * GB), cache=0)
    result = tick(server)
    assert result["level"] == "soft" and result["memory"]["admission_paused"]
    assert server.states() == {"a": "unloaded", "b": "loaded", "c": "unloaded"}  # LRU first, b stays
    assert [(e["model"], e["reason"]) for e in server.events()] == [("a", "pressure_soft")]
    assert tick(server)["actions"] == []  # the last unpinned model is kept at soft

    r = server.chat("b")  # waits OMLX_ADMISSION_WAIT, then is told
    assert r.status_code == 503 and r.json()["error"]["code"] == "memory_pressure"
    assert int(r.headers["Retry-After"]) >= 1

    set_usage(server, rss=1 * GB, cache=0)
    assert tick(server)["level"] == "ok"
    assert server.chat("b").status_code == 200


def test_a_waiting_request_is_admitted_when_pressure_clears(server):
    server.chat("a")
    set_usage(server, rss=int(9.2 * GB), cache=0)
    tick(server)
    result = {}
    waiter = threading.Thread(target=lambda: result.setdefault("r", server.chat("a")))
    waiter.start()
    set_usage(server, rss=1 * GB, cache=0)
    tick(server)
    waiter.join(30)
    assert result["r"].status_code == 200


def test_reclaim_comes_first(server):
    server.chat("a")
    set_usage(server, rss=int(9.2 * GB), cache=int(0.5 * GB))
    kinds = [a["kind"] for a in tick(server)["actions"]]
    assert kinds[0] == "reclaim"
    assert "cache_reclaim" in reasons(server)


def test_hard_evicts_the_last_idle_model_and_aborts_the_busy_one(server):
    server.chat("a")
    busy = server.stream("b")
    set_usage(server, rss=int(9.7 * GB), cache=0)
    assert tick(server)["memory"]["level"] == "hard"
    busy.join()
    assert busy.ended_with_error("memory_pressure")
    assert server.states()["a"] == "unloaded"
    by_model = {(e["model"], e["reason"]) for e in server.events()}
    assert {("a", "pressure_hard"), ("b", "requests_aborted")} <= by_model
    # the abort itself kept b loaded: its event is no unload (once idle, a later tick may evict it)
    assert next(e for e in server.events() if e["reason"] == "requests_aborted")["freed_bytes"] is None


def test_emergency_by_two_polls_aborts_even_pinned_requests(server):
    server.post("/admin/model/a/settings", {"is_pinned": True})
    stream_a, stream_b = server.stream("a"), server.stream("b")
    set_usage(server, rss=10 * GB + 1, cache=0)  # at the ceiling, not 2 GiB over it
    tick(server)
    stream_b.join()  # the first poll at the ceiling is hard: b, unpinned, loses its request
    assert stream_b.ended_with_error("memory_pressure")
    tick(server)  # the second poll in a row at the ceiling is an emergency
    stream_a.join()
    assert stream_a.ended_with_error("memory_pressure")  # pinned models' requests too
    assert ("a", "emergency") in {(e["model"], e["reason"]) for e in server.events()}
    assert server.states()["a"] == "loaded"  # pinned: aborted, never unloaded


def test_emergency_by_margin_in_one_poll(server):
    server.post("/admin/model/a/settings", {"is_pinned": True})
    stream = server.stream("a")
    set_usage(server, rss=13 * GB, cache=0)  # over the ceiling by more than 2 GiB
    assert tick(server)["memory"]["level"] == "emergency"
    stream.join()
    assert stream.ended_with_error("memory_pressure")
    assert ("a", "emergency") in {(e["model"], e["reason"]) for e in server.events()}
    assert server.states()["a"] == "loaded"


def test_prefill_guard_refuses_up_front(start_server, models):
    server = start_server(models, demo=False, OMLX_MEMORY_PROBE="fake", OMLX_MEMORY_CEILING="1GB")
    set_usage(server, rss=int(0.89 * GB), cache=0)  # under soft: admission is open
    assert server.chat("a").status_code == 200
    r = server.post("/v1/completions", {"model": "a", "prompt": "word " * 8000, "max_tokens": 1})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "prefill_memory_exceeded" and error["param"] == "prompt"
    assert error["estimated_bytes"] > error["limit_bytes"] > 0
    assert server.post("/v1/completions", {"model": "a", "prompt": "word", "max_tokens": 1}).status_code == 200


def test_hard_aborts_a_load_in_progress_with_409(start_server, make_model):
    big = make_model("enf-big", 600, seed=19)
    server = start_server({"big": big}, demo=False, OMLX_MEMORY_PROBE="fake", OMLX_MEMORY_CEILING="10GB")
    set_usage(server, rss=1 * GB, cache=0)
    result = {}
    loader = threading.Thread(target=lambda: result.setdefault("r", server.chat("big")))
    loader.start()
    server.wait_for(lambda: server.model("big")["state"] == "loading", interval=0.01)
    set_usage(server, rss=int(9.7 * GB), cache=0)
    tick(server)
    loader.join(60)
    r = result["r"]
    assert r.status_code == 409 and r.json()["error"]["code"] == "load_aborted", r.text
    assert server.model("big")["state"] == "unloaded"  # not cached as a failure: it may be retried
    assert "load_aborted" in reasons(server)
