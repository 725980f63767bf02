"""/ws/pool/ in a fleet (OMLX_REDIS_URL; the run's shared Redis), through the real ASGI application:
the whole fleet on connect, every host's record as it is published, and actions that name another
host sent to that host's operator API with the fleet key (a stand-in HTTP server plays that host).
Alone, none of it: no fleet messages, and an action naming another host is refused."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
from channels.layers import get_channel_layer

from tests.conftest import free_port
from tests.dashboard.conftest import SMALL
from tests.dashboard.test_consumers import answer, connected, row

KEY = "consumer-fleet-key"


@pytest.fixture
def other_host():
    """A stand-in for another host's HTTP API: records each POST; a path with "full" answers 507."""
    calls: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            calls.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                          "body": json.loads(body or b"{}")})
            status, reply = ((507, {"error": {"message": "no room for it", "code": "insufficient_memory"}})
                             if "full" in self.path else (200, {"status": "ok"}))
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield SimpleNamespace(url=f"http://127.0.0.1:{server.server_port}", calls=calls)
    server.shutdown()
    server.server_close()


@pytest.fixture
def fleet_site(site, redis_url):
    site.configure(OMLX_REDIS_URL=redis_url, OMLX_FLEET_KEY=KEY, OMLX_HOST_ID="alpha")
    return site


async def publish(site, host: str, url: str, models: list[str]) -> None:
    """A record for another host, as its FleetMember would publish it (this host's, renamed)."""
    member = site.runtime().fleet
    record = member.record()
    template = record["snapshot"]["models"][0]
    snapshot = {**record["snapshot"], "models": [{**template, "id": m, "state": "unloaded", "pinned": False}
                                                 for m in models]}
    await member.registry.publish(host, {**record, "host": host, "url": url, "snapshot": snapshot, "prefixes": {}})


async def called(host, count: int, timeout: float = 10) -> dict:
    """The stand-in's `count`th call: a load or unload is awaited 0.2 s, then goes on without the page."""
    deadline = time.monotonic() + timeout
    while len(host.calls) < count:
        assert time.monotonic() < deadline, f"{len(host.calls)} calls, not {count}"
        await asyncio.sleep(0.02)
    return host.calls[count - 1]


async def next_of(ws, kind: str, predicate=lambda m: True, timeout: float = 5) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        msg = await ws.receive_json_from(timeout=max(0.1, deadline - time.monotonic()))
        if msg["type"] == kind and predicate(msg):
            return msg


async def test_the_page_gets_the_whole_fleet_on_connect_then_every_record(fleet_site, other_host):
    ws, snap = await connected(fleet_site)
    assert snap["type"] == "snapshot"
    fleet = await ws.receive_json_from(timeout=10)
    assert fleet["type"] == "fleet" and fleet["fleet"] is True and fleet["host"] == "alpha"
    assert [h["host"] for h in fleet["hosts"]] == ["alpha"]
    assert {m["id"] for m in fleet["hosts"][0]["snapshot"]["models"]} == {m["id"] for m in snap["models"]}
    assert fleet["stale_seconds"] == 4.0        # three publish intervals of a second, and one more

    own = await next_of(ws, "fleet.host", lambda m: m["record"]["host"] == "alpha")
    assert own["record"]["snapshot"]["type"] == "snapshot" and own["record"]["sent_at"] > 0
    await publish(fleet_site, "beta", other_host.url, ["remote-only"])
    beta = await next_of(ws, "fleet.host", lambda m: m["record"]["host"] == "beta")
    assert beta["record"]["url"] == other_host.url
    assert [m["id"] for m in beta["record"]["snapshot"]["models"]] == ["remote-only"]

    await publish(fleet_site, "beta", other_host.url, ["remote-only"])    # lives OMLX_FLEET_TTL, 3 s
    second, _ = await connected(fleet_site)     # a page opened now gets both at once
    fleet = await next_of(second, "fleet")
    assert [h["host"] for h in fleet["hosts"]] == ["alpha", "beta"]
    await ws.disconnect()
    await second.disconnect()


async def test_actions_that_name_another_host_call_it_with_the_fleet_key(fleet_site, other_host):
    fleet_site.configure(OMLX_FLEET_TTL=60)     # beta's record, published once, lasts the whole test
    ws, _ = await connected(fleet_site)
    await publish(fleet_site, "beta", other_host.url, ["remote-only", "full-model", "org/name x"])

    snap = await answer(ws, {"action": "load", "model": "remote-only", "host": "beta"})
    assert snap["type"] == "snapshot" and snap["reply_to"] == "load"
    call = await called(other_host, 1)
    assert call["path"] == "/api/models/remote-only/load" and call["body"] == {}
    assert call["headers"]["x-omlx-forwarded"] == "alpha" and call["headers"]["x-omlx-fleet-key"] == KEY

    await answer(ws, {"action": "unload", "model": "org/name x", "host": "beta", "force": True})
    call = await called(other_host, 2)
    assert call["path"] == "/api/models/org/name%20x/unload" and call["body"] == {"force": True}

    # settings: the host that has the model writes them, unless this host knows the model too
    await answer(ws, {"action": "pin", "model": "remote-only", "host": "beta"})
    assert other_host.calls[2]["path"] == "/admin/model/remote-only/settings"
    assert other_host.calls[2]["body"] == {"is_pinned": True}
    await answer(ws, {"action": "set_ttl", "model": "remote-only", "host": "beta", "ttl_seconds": 30})
    assert other_host.calls[3]["body"] == {"ttl_seconds": 30}
    snap = await answer(ws, {"action": "pin", "model": SMALL, "host": "beta"})
    assert row(snap, SMALL)["pinned"] is True and len(other_host.calls) == 4

    # a refusal comes back as the page's error, now or (a slow answer) later
    await ws.send_json_to({"action": "load", "model": "full-model", "host": "beta"})
    error = await next_of(ws, "error", timeout=10)
    assert error["code"] == "insufficient_memory", error
    assert error["message"] == "on beta: no room for it" and error["action"] == "load"

    # this host's own id is this host: no call
    snap = await answer(ws, {"action": "unpin", "model": SMALL, "host": "alpha"})
    assert row(snap, SMALL)["pinned"] is False and len(other_host.calls) == 5
    await ws.disconnect()


async def test_a_host_that_is_not_there_is_an_error(fleet_site):
    fleet_site.configure(OMLX_FLEET_TTL=60)
    ws, _ = await connected(fleet_site)
    error = await answer(ws, {"action": "load", "model": SMALL, "host": "ghost"})
    assert error["code"] == "host_unavailable" and "not in the fleet" in error["message"], error

    await publish(fleet_site, "gone", f"http://127.0.0.1:{free_port()}", ["remote-only"])
    await ws.send_json_to({"action": "load", "model": "remote-only", "host": "gone"})
    error = await next_of(ws, "error", timeout=10)
    assert error["code"] == "host_unavailable" and "did not answer" in error["message"], error
    error = await answer(ws, {"action": "pin", "model": "remote-only", "host": "gone"})
    assert error["code"] == "host_unavailable", error

    for bad in (7, "", ["beta"]):
        error = await answer(ws, {"action": "load", "model": SMALL, "host": bad})
        assert error["type"] == "error" and "'host'" in error["message"], error
    await ws.disconnect()


async def test_alone_the_page_gets_no_fleet_and_acts_here_only(site):
    ws, _ = await connected(site)
    await get_channel_layer().group_send("fleet", {"type": "fleet.host", "text": '{"host": "beta"}'})
    here = site.runtime().settings.host_id
    snap = await answer(ws, {"action": "pin", "model": SMALL, "host": here})
    assert row(snap, SMALL)["pinned"] is True
    error = await answer(ws, {"action": "load", "model": SMALL, "host": "beta"})
    assert error["type"] == "error" and "not part of a fleet" in error["message"], error
    deadline = time.monotonic() + 1
    while time.monotonic() < deadline:
        if await ws.receive_nothing(timeout=0.2):
            break
        assert (await ws.receive_json_from())["type"] in ("snapshot", "error")
    await ws.disconnect()
