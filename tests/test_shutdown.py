"""SIGTERM with requests in flight, through a real `manage.py serve`: the server stops accepting,
lets running requests finish for OMLX_SHUTDOWN_GRACE, ends the rest with the API's error, and
exits 0 with its engines stopped and its database closed cleanly."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import threading
import time

import httpx
import pytest

from tests.conftest import Server

TINY = "tiny"


def _in_thread(fn) -> dict:
    """Run fn in a thread; the dict gets its "result" (or "error") when it ends."""
    out: dict = {}

    def run():
        try:
            out["result"] = fn()
        except Exception as e:  # noqa: BLE001 - the test looks at it
            out["error"] = e
    out["thread"] = threading.Thread(target=run, daemon=True)
    out["thread"].start()
    return out


def _refuses_connections(server: Server) -> bool:
    try:
        httpx.get(server.url + "/health", timeout=1)
    except httpx.ConnectError:
        return True
    except httpx.HTTPError:
        return False
    return False


def _query(server: Server, sql: str, *args) -> tuple:
    with contextlib.closing(sqlite3.connect(server.home / "omlx.sqlite3")) as conn:
        return conn.execute(sql, args).fetchone()


def _closed_cleanly(server: Server) -> None:
    # the last connection to close checkpoints the WAL and removes it
    assert not (server.home / "omlx.sqlite3-wal").exists(), "the database was not closed (its WAL is left)"
    assert _query(server, "pragma integrity_check") == ("ok",)
    log = server.log_text()
    assert "stopped: engines ended, database closed" in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]


@pytest.fixture
def tiny_server(start_server, make_model):
    def start(**env) -> Server:
        return start_server({TINY: make_model("tiny-20", 20)}, demo=False, **env)
    return start


def test_sigterm_ends_a_stream_and_a_queued_request_after_the_grace_and_exits_0(tiny_server):
    grace = 3
    server = tiny_server(OMLX_SHUTDOWN_GRACE=str(grace), OMLX_MAX_CONCURRENT="1")
    server.post("/admin/model/tiny/settings", {"is_pinned": True})   # a write the shutdown must keep
    stream = server.stream(TINY)
    queued = _in_thread(lambda: httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "model": TINY, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}))
    server.wait_for(lambda: server.model(TINY)["queued"] == 1)

    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 3
    while not _refuses_connections(server):
        assert time.monotonic() < deadline, "still accepting connections after SIGTERM"
        time.sleep(0.1)
    assert stream._thread.is_alive()   # the running stream is given its grace

    stream.join(grace + 10)
    assert stream.ended_with_error("server_shutting_down"), stream.lines[-3:]
    queued["thread"].join(grace + 10)
    answer = queued["result"]
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "server_shutting_down", answer.text
    assert answer.headers["Retry-After"]
    assert server.proc.wait(grace + 15) == 0
    took = time.monotonic() - started
    assert grace <= took < grace + 10, took
    _closed_cleanly(server)
    assert _query(server, "select is_pinned from pool_modelsettings where model_id = ?", TINY) == (1,)


def test_a_request_that_finishes_within_the_grace_gets_its_answer(tiny_server):
    server = tiny_server(OMLX_SHUTDOWN_GRACE="60")
    with httpx.Client(base_url=server.url, timeout=60) as client:   # keeps its connection open
        assert client.get("/health").status_code == 200
        running = _in_thread(lambda: httpx.post(server.url + "/v1/completions", timeout=60, json={
            "model": TINY, "prompt": "x", "max_tokens": 30}))
        server.wait_for(lambda: server.model(TINY)["active_requests"] == 1)

        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        server.wait_for(lambda: _refuses_connections(server), timeout=5)
        refused = client.get("/health")   # an open connection is told, not left hanging
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "server_shutting_down"

        running["thread"].join(60)
        answer = running["result"]
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 30
        assert server.proc.wait(30) == 0
        assert time.monotonic() - started < 30   # it left as soon as nothing was running, not after 60 s
    _closed_cleanly(server)


def test_a_second_signal_skips_the_grace(tiny_server):
    server = tiny_server(OMLX_SHUTDOWN_GRACE="120")
    stream = server.stream(TINY)
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(1)
    server.proc.send_signal(signal.SIGINT)
    assert server.proc.wait(20) == 0
    assert time.monotonic() - started < 15
    stream.join(10)
    assert stream.ended_with_error("server_shutting_down"), stream.lines[-3:]
    _closed_cleanly(server)
