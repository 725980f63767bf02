"""An operator's cancel of a request still waiting for a concurrency slot: it leaves the queue and
gets a 503 `request_cancelled` in its dialect's envelope, while the request that held the slot goes
on; the trace says where it was and that it was cancelled."""

import threading

import httpx

from tests.conftest import DEMO

KEY = "trace-cancel-key"


def test_a_queued_request_is_cancelled_before_it_runs(start_server):
    server = start_server(OMLX_API_KEY=KEY, OMLX_MAX_CONCURRENT="1")
    holder = server.stream(DEMO)                           # holds the model's one slot
    replies: list[httpx.Response] = []
    waiting = threading.Thread(target=lambda: replies.append(server.post(
        "/v1/messages", {"model": DEMO, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})))
    waiting.start()
    queued = server.wait_for(lambda: [t for t in server.get("/api/requests/live").json()["data"]
                                      if t["route"] == "/v1/messages" and t["phase"] == "queued"])
    assert queued[0]["dialect"] == "anthropic" and queued[0]["model"] == DEMO
    assert httpx.post(server.url + f"/api/requests/{queued[0]['id']}/cancel", json={},
                      headers={"Authorization": "Bearer nope"}, timeout=30).status_code == 401
    assert server.post(f"/api/requests/{queued[0]['id']}/cancel", {}).status_code == 200
    waiting.join(60)
    reply = replies[0]
    assert reply.status_code == 529 and reply.json()["error"]["type"] == "overloaded_error"   # Anthropic's 503
    assert "cancelled" in reply.json()["error"]["message"]
    trace = server.get(f"/api/requests/{queued[0]['id']}").json()
    assert trace["cancelled"] is True and trace["error"] == "request_cancelled" and trace["status"] == 529
    assert trace["slot_ms"] is None and trace["completion_tokens"] == 0
    assert server.model(DEMO)["active_requests"] == 1    # the holder runs on
    holder.close()
