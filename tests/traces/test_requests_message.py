"""The websocket's `requests` message (docs/api.md#requests), through the real ASGI application: a
finished request shows among the recent ones, without its body, and nothing is sent on connect
but the snapshot."""

import time

from django.test import AsyncClient

from tests.dashboard.conftest import SMALL, site  # noqa: F401 - the fixture


async def test_a_finished_request_reaches_the_page(site):  # noqa: F811
    ws = site.ws()
    ok, detail = await ws.connect(timeout=10)
    assert ok, detail
    assert (await ws.receive_json_from(timeout=10))["type"] == "snapshot"
    reply = await AsyncClient().post("/v1/completions", {"model": SMALL, "prompt": "x", "max_tokens": 3},
                                     content_type="application/json")
    assert reply.status_code == 200, reply.content
    request_id = reply.headers["x-omlx-request-id"]
    deadline = time.monotonic() + 30
    while True:
        msg = await ws.receive_json_from(timeout=max(0.1, deadline - time.monotonic()))
        if msg["type"] == "requests" and any(t["id"] == request_id for t in msg["recent"]):
            break
    trace = next(t for t in msg["recent"] if t["id"] == request_id)
    assert trace["model"] == SMALL and trace["phase"] == "done" and trace["route"] == "/v1/completions"
    assert trace["completion_tokens"] == reply.json()["usage"]["completion_tokens"] and "body" not in trace
    assert msg["in_flight"] == [] and msg["time"] > 0
    await ws.disconnect()
