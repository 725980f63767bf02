"""A frozen host (SIGSTOP: its sockets accept, nothing answers), end to end: a request routed to it is
tried on another host once the hop's read deadline (OMLX_HOP_READ_TIMEOUT, 3 s here) passes and the
host does not answer /health either; a request no other host can serve is a 503 `host_unavailable`;
streams it serves end with their dialect's error event. Each within the deadline plus the /health
wait and a margin, timed from the client's side. OMLX_FLEET_TTL is long here, so the frozen host
stays in the routing: the hop, not the record's expiry, must notice it."""

import json
import os
import signal
import threading
import time

import httpx
import pytest

from pool.fleet.silence import health_seconds
from tests.background_stream import BackgroundStream
from tests.fleet.hosts import Fleet, error_of, small_models, sse_data, wait_until

DEADLINE = 3.0
LOAD_MARGIN = 6.0           # the retry loads the model on the other host (a busy 2-core machine)
STREAM_MARGIN = 2.5
CLIENT_TIMEOUT = 30         # what the code before the read deadline ran into: a hang


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, migrated_db, redis, make_model):
    folders = small_models(make_model, "m", "only-b", "x")
    fleet = Fleet(tmp_path_factory.mktemp("frozen"), migrated_db, redis.new_url(), OMLX_FLEET_TTL=20,
                  OMLX_HOP_READ_TIMEOUT=DEADLINE)
    try:
        yield fleet.start({"a": {"m": folders["m"], "x": folders["x"]},
                           "b": {"m": folders["m"], "only-b": folders["only-b"]}})
    finally:
        for server in fleet.hosts.values():
            if server.alive():
                os.kill(server.proc.pid, signal.SIGCONT)
        fleet.close()


class Frozen:
    """`with Frozen(server):` SIGSTOP for the block, SIGCONT after it whatever happens."""

    def __init__(self, server):
        self.pid = server.proc.pid

    def __enter__(self):
        os.kill(self.pid, signal.SIGSTOP)
        return self

    def __exit__(self, *exc):
        os.kill(self.pid, signal.SIGCONT)


def timed(call) -> tuple[object, float]:
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


def chat(server, model: str) -> httpx.Response:
    return httpx.post(server.url + "/v1/chat/completions", timeout=CLIENT_TIMEOUT,
                      json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})


def test_a_request_to_a_frozen_host_is_tried_on_another_within_the_bound(fleet):
    a, b = fleet["a"], fleet["b"]
    assert b.post("/api/models/m/load?host=b", {}).status_code == 200
    fleet.wait_published()
    assert chat(a, "m").headers["x-omlx-host"] == "b"           # where it is loaded

    bound = DEADLINE + health_seconds(DEADLINE) + LOAD_MARGIN
    with Frozen(b):
        r, seconds = timed(lambda: chat(a, "m"))
    print(f"\nnon-stream request to a frozen host, retried elsewhere: {seconds:.2f} s (bound {bound:g} s)")
    assert r.status_code == 200 and r.headers["x-omlx-host"] == "a", r.text
    assert seconds <= bound, f"{seconds:.1f} s"
    assert "sent nothing for 3 s" in a.log_text()
    fleet.wait_joined()


def test_a_request_only_a_frozen_host_can_serve_is_a_503_within_the_bound(fleet):
    a = fleet["a"]
    bound = DEADLINE + health_seconds(DEADLINE) + STREAM_MARGIN
    with Frozen(fleet["b"]):
        r, seconds = timed(lambda: chat(a, "only-b"))
    print(f"\nnon-stream request only a frozen host can serve: {r.status_code} in {seconds:.2f} s (bound {bound:g} s)")
    assert r.status_code == 503 and error_of(r)["code"] == "host_unavailable", r.text
    assert seconds <= bound, f"{seconds:.1f} s"
    fleet.wait_joined()


class OllamaStream(threading.Thread):
    """A long /api/generate stream (NDJSON) through a host, its lines as they come."""

    def __init__(self, server, model: str):
        super().__init__(daemon=True)
        self.server, self.model, self.lines = server, model, []
        self.start()

    def run(self) -> None:
        body = {"model": self.model, "prompt": "x", "options": {"num_predict": 8000}}
        with httpx.stream("POST", self.server.url + "/api/generate", json=body, timeout=CLIENT_TIMEOUT) as r:
            self.lines.extend(r.iter_lines())


def test_streams_a_host_serves_when_it_freezes_end_with_their_dialects_error_within_the_bound(fleet):
    a, b = fleet["a"], fleet["b"]
    openai, ollama = BackgroundStream(a, "only-b"), OllamaStream(a, "only-b")
    wait_until(lambda: len(sse_data(openai.lines)) >= 3 and len(ollama.lines) >= 3, 60,
               lambda: f"both streams to run on b: {openai.lines[-2:]} {ollama.lines[-2:]}")
    bound = DEADLINE + health_seconds(DEADLINE) + STREAM_MARGIN
    with Frozen(b):
        _, seconds = timed(lambda: (openai.join(CLIENT_TIMEOUT), ollama.join(CLIENT_TIMEOUT)))
    print(f"\ntwo streams from a host that froze mid-stream ended in {seconds:.2f} s (bound {bound:g} s)")
    assert not ollama.is_alive()
    assert openai.ended_with_error("host_unavailable"), openai.lines[-4:]
    last = json.loads(ollama.lines[-1])
    assert set(last) == {"error"} and "The host b " in last["error"], ollama.lines[-3:]
    assert seconds <= bound, f"{seconds:.1f} s"
    fleet.wait_joined()
