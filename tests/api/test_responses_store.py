"""A stored response is written before it is acknowledged: with the database unavailable (another
process holds its write lock past OMLX_DB_BUSY_TIMEOUT, as in test_storage_faults_api.py), a
`store`d response is a 503 `response_not_stored`, or a stream's `error` and `response.failed` events
in place of `response.completed`; never an id the store does not have. On a Daphne process of its
own: the lock is another process's."""

import json
import sqlite3

import pytest

from tests.conftest import DEMO

BUSY = 1          # OMLX_DB_BUSY_TIMEOUT, seconds


@pytest.fixture
def server(start_server):
    server = start_server(OMLX_DB_BUSY_TIMEOUT=str(BUSY))
    assert server.chat(DEMO).status_code == 200                   # loaded before the lock
    return server


def body(**fields) -> dict:
    return {"model": DEMO, "input": "Say hi.", "max_output_tokens": 3, **fields}


def events_of(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def locked(server) -> sqlite3.Connection:
    lock = sqlite3.connect(server.home / "omlx.sqlite3", timeout=10, isolation_level=None)   # past a write of its own
    lock.execute("BEGIN EXCLUSIVE")
    return lock


def test_a_response_the_store_cannot_keep_gets_no_id(server):
    lock = locked(server)
    try:
        refused = server.post("/v1/responses", body())
        streamed = server.post("/v1/responses", body(stream=True))
        unstored = server.post("/v1/responses", body(store=False))
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    assert refused.status_code == 503, refused.text
    error = refused.json()["error"]
    assert error["code"] == "response_not_stored" and "store: false" in error["message"]
    assert int(refused.headers["Retry-After"]) >= 1

    events = events_of(streamed.text)
    kinds = [e["type"] for e in events]
    assert "response.completed" not in kinds and "response.incomplete" not in kinds
    assert kinds[-2:] == ["error", "response.failed"] and events[-2]["code"] == "response_not_stored"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert server.get(f"/v1/responses/{events[0]['response']['id']}").status_code == 404

    assert unstored.status_code == 200                              # nothing to store: answered
    kept = server.post("/v1/responses", body())                    # the database is back
    assert kept.status_code == 200 and server.get(f"/v1/responses/{kept.json()['id']}").status_code == 200
