"""Per-model concurrency through the ASGI application in this process: one request runs, one waits, the next is a
503 with Retry-After; a client that gives up while queued leaves the queue. The running request is a stream
held open until the test closes it: how fast this machine generates changes nothing."""

import json
import threading

import httpx

from tests.conftest import DEMO


def test_one_runs_one_waits_the_third_is_a_503_and_a_client_gone_leaves_the_queue(start_asgi_server):
    server = start_asgi_server(OMLX_MAX_CONCURRENT=1, OMLX_QUEUE_PER_MODEL=1)
    assert server.chat(DEMO).status_code == 200           # loaded: the queue below forms without a load
    counts = lambda: (server.model(DEMO)["running"], server.model(DEMO)["queued"])
    results: dict[str, httpx.Response] = {}

    running = server.stream(DEMO)
    server.wait_for(lambda: counts() == (1, 0), interval=0.02)

    # a client that gives up while queued: its place is freed, not kept until the slot comes
    seen, gave_up = set(), threading.Event()

    def watch():
        while not gave_up.is_set():
            seen.add(counts())
    watcher = threading.Thread(target=watch)
    watcher.start()
    with server.http(timeout=httpx.Timeout(60, read=3)) as gone:
        try:
            gone.post("/v1/completions", json={"model": DEMO, "prompt": "hi", "max_tokens": 2})
            raise AssertionError("the queued request was answered while the model was busy")
        except httpx.ReadTimeout:
            pass
        finally:
            gave_up.set()
            watcher.join()
    assert (1, 1) in seen, seen
    server.wait_for(lambda: counts() == (1, 0), timeout=5, interval=0.02)

    body = {"model": DEMO, "prompt": "Once upon a time", "max_tokens": 2}
    queued = threading.Thread(target=lambda: results.__setitem__("queued", server.post("/v1/completions", body)))
    queued.start()
    server.wait_for(lambda: counts() == (1, 1), interval=0.02)
    refused = server.chat(DEMO)
    assert refused.status_code == 503, refused.text
    assert refused.headers["Retry-After"] == "2"
    error = refused.json()["error"]
    assert (error["code"], error["type"]) == ("model_queue_full", "server_error")
    assert (error["running"], error["queued"]) == (1, 1)

    assert counts() == (1, 1)                             # the refused one took no place
    running.close()                                        # the running request ends: its slot passes on
    queued.join(120)
    assert any(line.startswith("data: {") for line in running.lines)
    assert results["queued"].status_code == 200, results["queued"].text
    assert results["queued"].json()["choices"][0]["finish_reason"] in ("length", "stop")
    server.wait_for(lambda: server.model(DEMO)["active_requests"] == 0, timeout=10)
    assert counts() == (0, 0) and server.model(DEMO)["active_requests"] == 0
    metrics = server.get("/metrics").text
    assert f'queued_requests{{model="{DEMO}"}} 0.0' in metrics
    assert 'admission_rejections_total{reason="model_queue_full"} 1.0' in metrics, json.dumps(metrics[-2000:])
