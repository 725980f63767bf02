"""/ws/pool/ through the real ASGI application (origin check, sessions, routing) with Channels'
WebsocketCommunicator; the page's access rule through Django's AsyncClient."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.test import AsyncClient, RequestFactory

from dashboard import views
from pool import services
from pool.models import EvictionEvent
from tests.dashboard.conftest import OTHER, SMALL


async def connected(site, **kw):
    ws = site.ws(**kw)
    ok, detail = await ws.connect(timeout=10)
    assert ok, f"refused: {detail}"
    first = await ws.receive_json_from(timeout=10)
    return ws, first


async def answer(ws, message=None, *, raw: str | None = None, timeout: float = 10) -> dict:
    """Send one message and return its answer: the reply snapshot or the error (broadcasts in between are skipped)."""
    if raw is not None:
        await ws.send_to(text_data=raw)
    else:
        await ws.send_json_to(message)
    deadline = time.monotonic() + timeout
    while True:
        msg = await ws.receive_json_from(timeout=max(0.1, deadline - time.monotonic()))
        if msg["type"] == "error" or msg.get("reply_to"):
            return msg


async def until(ws, predicate, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        msg = await ws.receive_json_from(timeout=max(0.1, deadline - time.monotonic()))
        if msg["type"] == "snapshot" and predicate(msg):
            return msg


def row(snapshot: dict, model_id: str) -> dict:
    return next(m for m in snapshot["models"] if m["id"] == model_id)


async def test_snapshot_on_connect(site):
    ws, snap = await connected(site)
    assert snap["type"] == "snapshot"
    assert {m["id"] for m in snap["models"]} == {SMALL, OTHER}
    assert {"usage_bytes", "model_budget_bytes", "level", "admission_paused"} <= set(snap["memory"])
    assert snap["events"] == []
    await ws.disconnect()


async def test_pin_and_unpin_persist_and_reach_every_dashboard(site):
    ws, _ = await connected(site)
    watcher, _ = await connected(site)
    router = site.runtime().router

    snap = await answer(ws, {"action": "pin", "model": SMALL})
    assert snap["type"] == "snapshot" and snap["reply_to"] == "pin"
    assert row(snap, SMALL)["pinned"] is True
    assert (await services.get_model_settings(router=router, name=SMALL))["is_pinned"] is True
    await until(watcher, lambda s: row(s, SMALL)["pinned"])

    snap = await answer(ws, {"action": "unpin", "model": SMALL})
    assert row(snap, SMALL)["pinned"] is False
    assert (await services.get_model_settings(router=router, name=SMALL))["is_pinned"] is False
    await until(watcher, lambda s: not row(s, SMALL)["pinned"])
    await ws.disconnect()
    await watcher.disconnect()


async def test_set_ttl(site):
    ws, _ = await connected(site)
    router = site.runtime().router
    snap = await answer(ws, {"action": "set_ttl", "model": SMALL, "ttl_seconds": 60})
    assert row(snap, SMALL)["ttl_seconds"] == 60
    assert (await services.get_model_settings(router=router, name=SMALL))["ttl_seconds"] == 60

    snap = await answer(ws, {"action": "set_ttl", "model": SMALL, "ttl_seconds": None})
    assert row(snap, SMALL)["ttl_seconds"] is None

    for bad in ({"ttl_seconds": -5}, {"ttl_seconds": "soon"}, {}):
        error = await answer(ws, {"action": "set_ttl", "model": SMALL, **bad})
        assert error["type"] == "error" and "ttl_seconds" in error["message"], error
    await ws.disconnect()


async def test_load_then_unload(site):
    ws, _ = await connected(site)
    snap = await answer(ws, {"action": "load", "model": SMALL})
    assert snap["reply_to"] == "load" and row(snap, SMALL)["state"] in ("loading", "loaded")
    snap = await until(ws, lambda s: row(s, SMALL)["state"] == "loaded")
    assert row(snap, SMALL)["measured_bytes"]

    unloaded = lambda s: row(s, SMALL)["state"] == "unloaded" and s["events"]
    snap = await answer(ws, {"action": "unload", "model": SMALL})
    snap = snap if unloaded(snap) else await until(ws, unloaded)
    event = snap["events"][0]
    assert event["model"] == SMALL and event["reason"] == "manual"
    assert await EvictionEvent.objects.filter(model_id=SMALL, reason="manual").aexists()
    await ws.disconnect()


async def test_unload_of_a_busy_model_needs_force(site):
    ws, _ = await connected(site)
    pool = site.runtime().host.pool
    await pool.load(SMALL)
    async with pool.lease(SMALL):
        error = await answer(ws, {"action": "unload", "model": SMALL})
        assert error["type"] == "error" and error["code"] == "model_busy"
        assert "force" in error["message"]
        error = await answer(ws, {"action": "unload", "model": SMALL, "force": "yes"})
        assert error["type"] == "error" and "'force'" in error["message"]
        snap = await answer(ws, {"action": "unload", "model": SMALL, "force": True})
        assert snap["type"] == "snapshot" and row(snap, SMALL)["state"] in ("unloading", "unloaded")
    # an unload that takes longer than the reply's wait carries on; the broadcasts show its end
    await until(ws, lambda s: row(s, SMALL)["state"] == "unloaded")
    assert pool.entries[SMALL].state == "unloaded"
    await ws.disconnect()


async def test_a_refused_load_is_an_error(site):
    site.configure(OMLX_MAX_MODEL_MEMORY="10MB")
    ws, _ = await connected(site)
    error = await answer(ws, {"action": "load", "model": SMALL})
    assert error["type"] == "error" and error["code"] == "model_too_large", error
    assert "budget" in error["message"]
    snap = await answer(ws, {"action": "pin", "model": SMALL})   # still connected
    assert row(snap, SMALL)["state"] == "unloaded"
    await ws.disconnect()


async def test_eviction_reaches_the_dashboard(site):
    site.configure(OMLX_MAX_MODEL_MEMORY="45MB")   # one 20 MB model (+25% headroom) at a time
    ws, _ = await connected(site)
    await answer(ws, {"action": "load", "model": SMALL})
    await until(ws, lambda s: row(s, SMALL)["state"] == "loaded")
    await answer(ws, {"action": "load", "model": OTHER})
    snap = await until(ws, lambda s: row(s, OTHER)["state"] == "loaded" and s["events"])
    event = snap["events"][0]
    assert (event["model"], event["reason"], event["requested_by"]) == (SMALL, "lru", OTHER)
    assert row(snap, SMALL)["state"] == "unloaded"
    await ws.disconnect()


@pytest.mark.parametrize("raw, expected", [
    ("{not json", "malformed JSON"),
    ("[1, 2]", "JSON object"),
    ('{"action": "explode", "model": "tiny"}', "unknown action"),
    ('{"action": "pin"}', "'model'"),
    ('{"action": "pin", "model": "no-such-model"}', "does not exist"),
])
async def test_bad_messages_are_answered_and_the_connection_kept(site, raw, expected):
    ws, _ = await connected(site)
    error = await answer(ws, raw=raw)
    assert error["type"] == "error" and expected in error["message"], error
    snap = await answer(ws, {"action": "pin", "model": SMALL})
    assert row(snap, SMALL)["pinned"] is True
    await ws.disconnect()


@pytest.mark.parametrize("origin, host", [
    ("http://evil.example", "127.0.0.1:8000"),       # another site: not an allowed host
    ("http://localhost:9999", "127.0.0.1:8000"),     # an allowed host, but another origin (another local app)
    (None, "127.0.0.1:8000"),                         # no Origin at all
])
async def test_a_foreign_origin_is_refused(site, origin, host):
    ws = site.ws(origin=origin, host=host)
    ok, _ = await ws.connect(timeout=10)
    assert not ok
    await ws.disconnect()


async def _session_cookie(*, staff: bool) -> str:
    from django.conf import settings

    user = await get_user_model().objects.acreate_user(f"user-{staff}", password="pw", is_staff=staff)
    client = AsyncClient()
    await client.aforce_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


async def test_with_an_api_key_the_websocket_needs_a_staff_session(site):
    site.configure(OMLX_API_KEY="secret")
    anonymous = site.ws()
    assert (await anonymous.connect(timeout=10))[0] is False
    await anonymous.disconnect()

    not_staff = site.ws(cookie=await _session_cookie(staff=False))
    assert (await not_staff.connect(timeout=10))[0] is False
    await not_staff.disconnect()

    ws, snap = await connected(site, cookie=await _session_cookie(staff=True))
    assert snap["type"] == "snapshot"
    await ws.disconnect()


async def test_without_a_key_only_loopback_peers_are_let_in(site):
    remote = site.ws(client="192.168.1.20")
    assert (await remote.connect(timeout=10))[0] is False
    await remote.disconnect()
    site.configure(OMLX_HOST="0.0.0.0")
    local = site.ws()
    assert (await local.connect(timeout=10))[0] is False   # a server on every interface is never open
    await local.disconnect()


async def test_the_page_follows_the_same_rule(site):
    page = await AsyncClient().get("/", headers={"Accept": "text/html"})
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="dashboard-config"' in html and "vendor/uplot/uPlot.iife.min.js" in html

    request = RequestFactory().get("/", REMOTE_ADDR="10.1.2.3", headers={"Accept": "text/html"})
    request.user = AnonymousUser()
    remote = views.index(request)
    assert remote.status_code == 302 and remote["Location"] == "/admin/login/?next=/"

    site.configure(OMLX_API_KEY="secret")
    locked = await AsyncClient().get("/", headers={"Accept": "text/html"})
    assert locked.status_code == 302 and locked["Location"] == "/admin/login/?next=/"

    staff = AsyncClient()
    await staff.aforce_login(await get_user_model().objects.acreate_user("admin", password="pw", is_staff=True))
    page = await staff.get("/", headers={"Accept": "text/html"})
    assert page.status_code == 200 and "log out admin" in page.content.decode()
    heartbeat = await AsyncClient().get("/")    # not a browser: Ollama's liveness answer, open to all
    assert heartbeat.status_code == 200 and heartbeat.content == b"Ollama is running"


async def test_a_load_never_blocks_the_connection(site, monkeypatch):
    """Other messages are answered while a model loads: the load is held at its weights until the
    other answer has come back, so an answer that waited for the load would never come."""
    from pool.engines import generator

    weights_may_load = threading.Event()
    fill_weights = generator.fill_weights

    def held(model, group_bytes, progress=None):
        assert weights_may_load.wait(30), "the test never released the load"
        return fill_weights(model, group_bytes, progress)
    monkeypatch.setattr(generator, "fill_weights", held)
    ws, _ = await connected(site)
    loading = await answer(ws, {"action": "load", "model": SMALL})
    assert row(loading, SMALL)["state"] == "loading"
    snap = await answer(ws, {"action": "set_ttl", "model": OTHER, "ttl_seconds": 30})
    assert row(snap, OTHER)["ttl_seconds"] == 30 and row(snap, SMALL)["state"] == "loading"
    weights_may_load.set()
    await until(ws, lambda s: row(s, SMALL)["state"] == "loaded")
    await asyncio.sleep(0)
    await ws.disconnect()
