"""Hosts that go away, end to end: `kill -9` of the serving host in the middle of a stream, or while it
loads the model before its answer began, and a host that stops publishing (it leaves the fleet within
OMLX_FLEET_TTL and comes back by itself when it publishes again, or is restarted). Real hosts, a real
Redis; every wait bounded. Last, the fleet member's own loop, in this process: that it stops when told."""

import asyncio
import json
import os
import signal
import threading
import time
from types import SimpleNamespace

import httpx
import pytest

from pool.fleet.member import FleetMember
from pool.policy.vocabulary import Change
from tests.background_stream import BackgroundStream
from tests.fleet.hosts import Fleet, error_of, hosts_seen, model_row, small_models, sse_data, states, wait_until

BIG_MB = 400        # a load that takes a moment: long enough to kill its host in the middle of it
TTL = 2.0


@pytest.fixture
def new_fleet(tmp_path, migrated_db, redis_url):
    """new_fleet(models, env=None, **common_env) -> a started Fleet on this test's Redis database."""
    made: list[Fleet] = []

    def make(models: dict, env: dict | None = None, **common) -> Fleet:
        made.append(Fleet(tmp_path / f"fleet{len(made)}", migrated_db, redis_url, **common))
        return made[-1].start(models, env)
    yield make
    for fleet in made:
        fleet.close()


@pytest.fixture
def big(make_model):
    return make_model("fleet-big", BIG_MB, seed=48)


class Request(threading.Thread):
    """One chat request to a host, in the background: `.result()` waits for its status, headers and lines."""

    def __init__(self, server, body: dict):
        super().__init__(daemon=True)
        self.server, self.body = server, body
        self.status, self.headers, self.lines, self.error = None, {}, [], None
        self.start()

    def run(self) -> None:
        try:
            with httpx.stream("POST", self.server.url + "/v1/chat/completions", json=self.body, timeout=90) as r:
                self.status, self.headers = r.status_code, dict(r.headers)
                self.lines = list(r.iter_lines())
        except httpx.HTTPError as e:
            self.error = e

    def result(self, timeout: float = 90):
        self.join(timeout)
        assert not self.is_alive(), "the request did not end"
        assert self.error is None, repr(self.error)
        return self


def kill_while_loading(fleet: Fleet, host: str, model: str) -> None:
    """kill -9 of `host` as soon as its pool shows `model` loading (and not yet loaded)."""
    def started() -> str | None:
        state = model_row(fleet[host], model)["state"]
        return state if state in ("loading", "loaded") else None
    state = wait_until(started, 30, f"{host} to start loading {model}", interval=0.005)
    fleet.kill(host)
    assert state == "loading", f"{host} had {model} {state} before it could be killed"


# ---- a host killed in the middle of a stream ----------------------------------------------------------

def test_kill_9_of_the_serving_host_mid_stream_ends_the_clients_stream_with_an_error_then_done(new_fleet,
                                                                                               make_model):
    folders = small_models(make_model, "x", "only-b")
    fleet = new_fleet({"a": {"x": folders["x"]}, "b": {"only-b": folders["only-b"]}})
    a, b = fleet["a"], fleet["b"]
    stream = BackgroundStream(a, "only-b")        # a long completion, through a, served by b
    wait_until(lambda: len(sse_data(stream.lines)) >= 3 and model_row(b, "only-b")["active_requests"] == 1, 60,
               lambda: f"the stream to run on b: {stream.lines[-3:]}")
    fleet.kill("b")
    stream.join(20)                               # it ends: no hang
    assert stream.ended_with_error("host_unavailable"), stream.lines[-4:]
    error = json.loads(sse_data(stream.lines)[-2])["error"]
    assert "The host b " in error["message"] and "stopped answering" in error["message"], error
    assert a.get("/health").status_code == 200 and a.chat("x").status_code == 200    # a serves on


# ---- a host killed while it loads, before its answer began --------------------------------------------

def test_kill_9_during_a_load_retries_on_another_host_that_has_the_folder(new_fleet, make_model, big):
    x = small_models(make_model, "x")["x"]
    fleet = new_fleet({"a": {"x": x, "big": big}, "b": {"big": big}}, OMLX_MAX_LOADED_MODELS=1)
    a = fleet["a"]
    assert a.chat("x").status_code == 200          # a is full: big goes to b, where it fits
    fleet.wait_published()
    request = Request(a, {"model": "big", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                          "stream": True})
    kill_while_loading(fleet, "b", "big")
    done = request.result()
    assert done.status == 200 and done.headers["x-omlx-host"] == "a", (done.status, done.headers, done.lines)
    data = sse_data(done.lines)
    assert data[-1] == "[DONE]" and not any('"error"' in d for d in data), data
    assert states(a)["big"] == "loaded" and states(a)["x"] == "unloaded"
    assert "did not answer" in a.log_text()


def test_kill_9_during_a_load_with_no_other_host_that_has_the_folder_is_a_503(new_fleet, make_model, big):
    x = small_models(make_model, "x")["x"]
    fleet = new_fleet({"a": {"x": x}, "b": {"big": big}})
    a = fleet["a"]
    request = Request(a, {"model": "big", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    kill_while_loading(fleet, "b", "big")
    done = request.result()
    assert done.status == 503, (done.status, done.lines)
    error = json.loads("\n".join(done.lines))["error"]
    assert error["code"] == "host_unavailable" and "'big'" in error["message"] and " b " in error["message"], error
    assert int(done.headers["retry-after"]) >= 1, done.headers
    assert "big" not in states(a)


# ---- a host that stops publishing ---------------------------------------------------------------------

def test_a_host_that_stops_publishing_leaves_within_the_ttl_and_rejoins_by_itself(new_fleet, make_model):
    folders = small_models(make_model, "x", "only-b")
    fleet = new_fleet({"a": {"x": folders["x"]}, "b": {"only-b": folders["only-b"]}}, OMLX_FLEET_TTL=TTL)
    a, b = fleet["a"], fleet["b"]
    assert a.chat("only-b").headers["x-omlx-host"] == "b"

    os.kill(b.proc.pid, signal.SIGSTOP)                    # alive but silent: it publishes nothing
    try:
        leaves_within_the_ttl(a, "b")
    finally:
        os.kill(b.proc.pid, signal.SIGCONT)
    fleet.wait_joined(timeout=10)                          # back by itself
    assert a.chat("only-b").headers["x-omlx-host"] == "b"

    fleet.kill("b")                                        # gone, without a goodbye
    leaves_within_the_ttl(a, "b")
    r = a.chat("only-b")                                   # the fleet no longer has it
    assert r.status_code == 404 and error_of(r)["code"] == "model_not_found", r.text

    fleet.restart("b")                                     # same host id and port
    fleet.wait_joined(timeout=15)
    r = a.chat("only-b")
    assert r.status_code == 200 and r.headers["x-omlx-host"] == "b", r.text

    assert b.stop() == 0                                   # a graceful stop leaves at once, not after the TTL
    assert hosts_seen(a) == {"a"}


def leaves_within_the_ttl(viewer, host: str) -> None:
    since = time.monotonic()
    wait_until(lambda: host not in hosts_seen(viewer), TTL + 5, f"{host} to leave the fleet")
    assert time.monotonic() - since <= TTL + 2, f"{host} left after {time.monotonic() - since:.1f} s (TTL {TTL:g} s)"


@pytest.mark.parametrize("steps", [0, 1, 2])
async def test_the_fleet_loop_ends_when_stopped_as_a_pool_change_wakes_it(steps):
    """SIGTERM stops the fleet member first (Runtime.stop). The requests that end then are pool changes
    that wake its loop; a wake in the same moment as the cancel must not be taken instead of it (Python
    3.11's asyncio.wait_for returns the woken wait and drops the cancel), or `serve` never exits."""
    conf = SimpleNamespace(host_id="h", advertise_url="http://h", fleet_key="k", redis_url="", database_url="",
                           fleet_ttl=3.0)
    member = FleetMember(SimpleNamespace(settings=conf, traces=SimpleNamespace(watch=lambda listener: None)))
    member.start()
    await asyncio.sleep(0.2)                          # it waits for its next publish
    member.changed(SimpleNamespace(kind=Change.SETTINGS, model=None))
    for _ in range(steps):
        await asyncio.sleep(0)
    stopping = asyncio.ensure_future(member.stop())
    done, _ = await asyncio.wait({stopping}, timeout=3)
    if not done:
        stopping.cancel()                             # a second cancel gets through: the test's own cleanup
        await asyncio.wait({stopping}, timeout=3)
    assert done, "FleetMember.stop() still waits for its loop, which missed the cancel and runs on"
