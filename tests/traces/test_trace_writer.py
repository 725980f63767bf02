"""The trace writer on a real server: traces stay within OMLX_TRACE_ROWS under a burst of 400
short requests (six and a half times the bound), and they are written off the request's path: with
the writer held behind another process's database lock, streams still finish and their traces are
answered from memory, and they reach the database once the lock goes. With OMLX_TRACES=off nothing
is traced."""

import sqlite3
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.conftest import DEMO

STAND_IN_DEMO = True   # shapes, errors and faults, not answers: tests/conftest.py demo_folder

BOUND = 60
BURST = 400


def traces_in_db(server, **params) -> list[dict]:
    return server.get("/api/requests", params={"limit": 500, **params}).json()["data"]


def test_a_burst_of_requests_keeps_the_traces_within_their_bound(start_server):
    server = start_server(OMLX_TRACE_ROWS=str(BOUND), OMLX_PROMPT_CACHE_BYTES="off")   # traces, not the cache
    body = {"model": DEMO, "prompt": "x", "max_tokens": 1}
    seen: list[int] = []

    def send(client: httpx.Client, i: int) -> str:
        reply = client.post("/v1/completions", json=body)
        assert reply.status_code == 200, reply.text
        if i % 40 == 0:
            seen.append(len(traces_in_db(server)))      # never more than the bound, even mid-burst
        return reply.headers["x-omlx-request-id"]

    try:
        with httpx.Client(base_url=server.url, timeout=120, limits=httpx.Limits(max_connections=16)) as client, \
                ThreadPoolExecutor(16) as pool:
            ids = list(pool.map(lambda i: send(client, i), range(BURST)))
    except Exception as e:     # one unexplained failure on record: keep what the server said with it
        raise AssertionError(f"the burst failed: {e!r}\nthe server's log:\n{server.log_text()[-4000:]}") from e
    assert len(set(ids)) == BURST
    server.wait_for(lambda: server.get("/api/requests/summary").json()["writer"]["pending"] == 0)
    kept = traces_in_db(server)
    assert len(kept) == BOUND and max(seen) <= BOUND
    writer = server.get("/api/requests/summary").json()["writer"]
    assert writer["written"] + writer["dropped"] + writer["failed"] == BURST and writer["failed"] == 0


def test_a_blocked_writer_does_not_hold_the_streams(start_server):
    server = start_server(OMLX_DB_BUSY_TIMEOUT="120")       # the writer waits on the lock, it does not fail
    client = server.openai()
    client.completions.create(model=DEMO, prompt="x", max_tokens=1)      # loaded
    lock = sqlite3.connect(server.home / "omlx.sqlite3", timeout=30, isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")                          # another process holds the write lock
    try:
        def stream(_) -> tuple[str, int]:
            raw = client.completions.with_raw_response.create(model=DEMO, prompt="Once upon a time", max_tokens=16,
                                                               stream=True, stream_options={"include_usage": True})
            usage = [c.usage for c in raw.parse() if c.usage is not None][-1]
            return raw.headers["x-omlx-request-id"], usage.completion_tokens

        with ThreadPoolExecutor(8) as pool:
            done = list(pool.map(stream, range(24)))
        writer = server.get("/api/requests/summary").json()["writer"]
        assert writer["failed"] == 0 and writer["written"] <= 1   # held: at most the warm-up's went in
        for request_id, tokens in done:                          # every stream ended meanwhile
            trace = server.get(f"/api/requests/{request_id}").json()
            assert trace["completion_tokens"] == tokens == 16 and trace["phase"] == "done"
        assert not {r for r, _ in done} & {t["id"] for t in traces_in_db(server)}
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    server.wait_for(lambda: {r for r, _ in done} <= {t["id"] for t in traces_in_db(server)})


def test_traces_off_keeps_none(start_server):
    server = start_server(OMLX_TRACES="off")
    reply = server.chat(DEMO)
    assert reply.status_code == 200 and "x-omlx-request-id" not in reply.headers
    assert traces_in_db(server) == [] and "request_ttft_seconds_count" not in server.get("/metrics").text
