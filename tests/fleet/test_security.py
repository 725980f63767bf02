"""Who may use the fleet's hop: a client cannot pass for a host (`x-omlx-forwarded` without the fleet
key, or with a wrong one, is a 403), a client's API key is checked where it enters the fleet even for a
model another host serves, the hop itself needs no client key on the serving host, a host record in
Redis that is not signed with the fleet key is never routed to, and `serve` will not start a fleet host
without its key. Two real hosts with API keys of their own, a real Redis."""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import redis as redis_client

from pool.fleet.seal import seal
from tests.conftest import ROOT, free_port
from tests.fleet.hosts import FLEET_KEY, Fleet, error_of, hosts_seen, requests_served, small_models, states

KEYS = {"a": "key-of-a", "b": "key-of-b"}
HI = {"model": "only-b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
ANTHROPIC_HI = {**HI, "model": "only-b"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, migrated_db, redis, make_model):
    folders = small_models(make_model, "x", "only-b")
    fleet = Fleet(tmp_path_factory.mktemp("security"), migrated_db, redis.new_url())
    try:
        fleet.start({"a": {"x": folders["x"]}, "b": {"only-b": folders["only-b"]}},
                    env={host: {"OMLX_API_KEY": key} for host, key in KEYS.items()})
        yield fleet
    finally:
        fleet.close()


def bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def nothing_reached_b(b, before: float) -> None:
    assert requests_served(b, "only-b") == before and states(b)["only-b"] == "unloaded"


# ---- a client is not a host -----------------------------------------------------------------------

@pytest.mark.parametrize("fleet_key", [None, "", "not-the-fleet-key", FLEET_KEY + "x"])
def test_a_client_that_says_it_was_forwarded_is_refused(fleet, fleet_key):
    b = fleet["b"]
    before = requests_served(b, "only-b")
    forged = {**bearer(KEYS["b"]), "x-omlx-forwarded": "a"}     # b's own client, with b's key
    if fleet_key is not None:
        forged["x-omlx-fleet-key"] = fleet_key
    for method, path, body in (("POST", "/v1/chat/completions", HI), ("GET", "/v1/models/only-b", None),
                               ("GET", "/api/pool", None), ("POST", "/api/models/only-b/load", {})):
        r = b.fetch(method, path, json=body, headers=forged, timeout=30)
        assert r.status_code == 403, (path, r.status_code, r.text)
        error = error_of(r)
        assert error["code"] == "forbidden" and "x-omlx-forwarded" in error["message"], (path, error)

    r = b.fetch("POST", "/v1/messages", json=ANTHROPIC_HI, headers={**forged, "anthropic-version": "2023-06-01"})
    assert r.status_code == 403 and r.json()["type"] == "error", r.text                 # Anthropic's envelope
    assert r.json()["error"]["type"] == "permission_error", r.text
    nothing_reached_b(b, before)


def test_the_fleet_key_is_what_a_hop_carries_instead_of_the_clients_key(fleet):
    b = fleet["b"]
    as_a_host = {"x-omlx-forwarded": "a", "x-omlx-fleet-key": FLEET_KEY}      # no API key at all
    r = b.fetch("POST", "/v1/chat/completions", json=HI, headers=as_a_host, timeout=60)
    assert r.status_code == 200 and r.headers["x-omlx-host"] == "b", r.text
    assert b.fetch("POST", "/v1/chat/completions", json=HI, timeout=60).status_code == 401   # without it


# ---- the client's key, checked where it enters ------------------------------------------------------

def test_a_client_without_the_key_is_refused_at_a_even_for_a_model_on_b(fleet):
    a, b = fleet["a"], fleet["b"]
    fleet.unload_all()
    before = requests_served(b, "only-b")
    for headers in ({}, bearer("wrong"), bearer(KEYS["b"]), {"x-api-key": KEYS["b"]}):   # b's key is not a's
        r = a.fetch("POST", "/v1/chat/completions", json=HI, headers=headers, timeout=60)
        assert r.status_code == 401 and error_of(r)["code"] == "invalid_api_key", (headers, r.text)
        r = a.fetch("GET", "/v1/models/only-b", headers=headers, timeout=60)
        assert r.status_code == 401, (headers, r.text)
        r = a.fetch("POST", "/api/models/only-b/load?host=b", json={}, headers=headers, timeout=60)
        assert r.status_code == 401, (headers, r.text)
    r = a.fetch("POST", "/v1/messages", json=ANTHROPIC_HI, headers={"anthropic-version": "2023-06-01"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", r.text
    nothing_reached_b(b, before)


def test_a_client_with_as_key_is_served_on_b(fleet):
    a, b = fleet["a"], fleet["b"]
    before = requests_served(b, "only-b")
    r = a.fetch("POST", "/v1/chat/completions", json=HI, headers=bearer(KEYS["a"]), timeout=60)
    assert r.status_code == 200 and r.headers["x-omlx-host"] == "b", r.text
    raw = a.anthropic().messages.with_raw_response.create(**ANTHROPIC_HI)          # x-api-key: a's key
    assert raw.headers["x-omlx-host"] == "b" and raw.parse().role == "assistant"
    assert requests_served(b, "only-b") == before + 2
    assert "only-b" not in states(a)


def test_a_browser_page_with_the_key_is_served_on_b(fleet):
    """A page (it sends Origin) that carries a's key passes a's checks; the hop must not turn it into a
    cross-site request at b, which never saw the key."""
    a = fleet["a"]
    page = {**bearer(KEYS["a"]), "Origin": a.url}
    r = a.fetch("POST", "/v1/chat/completions", json=HI, headers=page, timeout=60)
    assert r.status_code == 200 and r.headers["x-omlx-host"] == "b", r.text
    r = a.fetch("POST", "/api/models/only-b/unload?host=b", json={}, headers=page, timeout=60)
    assert r.status_code == 200 and r.headers["x-omlx-host"] == "b", r.text


# ---- a host record no host of the fleet wrote ----------------------------------------------------

class Bait(threading.Thread):
    """A listener that answers every connection with `{}` and keeps what each one sent."""

    def __init__(self):
        super().__init__(daemon=True)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.received: list[bytes] = []
        self.start()

    def run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    self.received.append(conn.recv(65536))
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
                                 b"Connection: close\r\n\r\n{}")
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


def forged_record(genuine: dict, host: str, url: str) -> dict:
    """b's record as another "host" at `url` with a model named `bait`, loaded."""
    snapshot = json.loads(json.dumps(genuine["snapshot"]))
    for model in snapshot["models"]:
        if model["id"] == "only-b":
            model.update(id="bait", state="loaded")
    return {**genuine, "host": host, "url": url, "sent_at": time.time(), "snapshot": snapshot}


def test_a_host_record_not_signed_with_the_fleet_key_is_never_routed_to(fleet):
    a = fleet["a"]
    store = redis_client.Redis.from_url(fleet.env["OMLX_REDIS_URL"])
    stored = json.loads(store.get("omlx:fleet:host:b"))
    genuine = json.loads(stored["record"]) if "hmac" in stored else stored
    bait = Bait()
    forged = {"omlx:fleet:host:evil": json.dumps(forged_record(genuine, "evil", bait.url)),     # unsigned
              "omlx:fleet:host:evil2": seal(json.dumps(forged_record(genuine, "evil2", bait.url)),
                                            key=b"not-the-fleet-key", host_id="evil2")}
    try:
        for key, value in forged.items():
            store.set(key, value, px=60_000)
        for _ in range(3):                            # over several reads of the fleet
            r = a.fetch("POST", "/v1/chat/completions", json={**HI, "model": "bait"}, headers=bearer(KEYS["a"]),
                        timeout=30)
            assert r.status_code == 404 and error_of(r)["code"] == "model_not_found", r.text
            assert a.fetch("GET", "/api/tags", headers=bearer(KEYS["a"]), timeout=30).status_code == 200
            assert hosts_seen(a) == {"a", "b"}
            time.sleep(0.5)
        assert bait.received == [], bait.received[0][:300]     # not a prompt, not the fleet key
        log = a.log_text()
        assert log.count("omlx:fleet:host:evil is ignored: unsigned") == 1, log[-3000:]
        assert log.count("omlx:fleet:host:evil2 is ignored: badly signed") == 1, log[-3000:]
    finally:
        store.delete(*forged)
        store.close()
        bait.close()


# ---- serve's own refusals ---------------------------------------------------------------------------

def _serve(tmp_path, **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OMLX_")}
    clean.update(OMLX_HOME=str(tmp_path / "home"), PYTHONUNBUFFERED="1", **env)
    return subprocess.run([sys.executable, "manage.py", "serve", "--port", str(free_port())], cwd=ROOT, env=clean,
                          capture_output=True, text=True, timeout=90)


def test_serve_refuses_to_start_a_fleet_host_without_the_fleet_key(tmp_path, redis_url):
    done = _serve(tmp_path, OMLX_REDIS_URL=redis_url)
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    said = done.stderr.strip()
    assert "OMLX_REDIS_URL is set but OMLX_FLEET_KEY is not" in said and len(said.splitlines()) == 1, said
    assert "Traceback" not in said and "serving on" not in done.stdout


def test_serve_refuses_to_start_a_fleet_host_whose_redis_does_not_answer(tmp_path):
    nowhere = f"redis://127.0.0.1:{free_port()}/0"      # nothing listens there
    done = _serve(tmp_path, OMLX_REDIS_URL=nowhere, OMLX_FLEET_KEY=FLEET_KEY)
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    said = done.stderr.strip()
    assert "cannot reach the fleet's Redis" in said and len(said.splitlines()) == 1, said
