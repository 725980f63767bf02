"""Access, the rules as tables of cases: which hosts are loopback and which Host headers are allowed for a
bind, who may use the API and see which metrics, when a CSRF check applies, what counts as JSON, what a
closing server answers, and metrics without model ids. Each rule against the application is in
test_access_asgi.py, against a `manage.py serve` process in test_access_serve.py."""

from __future__ import annotations

import pytest

from omlx_site.inflight import closing_messages
from pool.api.auth import AGGREGATE, FULL, api_allowed, metrics_view, needs_csrf_check
from pool.api.operator.public_metrics import without_model_ids
from pool.api.route import is_json
from pool.network import allowed_hosts, host_pattern, is_loopback, machine_names


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.9.9.9", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("LOCALHOST", True), ("0.0.0.0", False), ("::", False), ("192.168.1.5", False), ("fe80::1%eth0", False),
    ("example.com", False), ("localhost.evil.example", False), ("", False), (None, False),
])
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


MACHINE = ["box", "box.local", "192.168.1.5", "[fe80::1]"]


@pytest.mark.parametrize("bind, extra, expected", [
    ("127.0.0.1", [], ["localhost", "127.0.0.1", "[::1]"]),
    ("localhost", [], ["localhost", "127.0.0.1", "[::1]"]),
    ("127.0.0.2", ["my.box"], ["localhost", "127.0.0.1", "[::1]", "127.0.0.2", "my.box"]),
    ("::1", [], ["localhost", "127.0.0.1", "[::1]"]),
    # a specific address: it, and the machine's names (not its other addresses)
    ("192.168.1.5", [], ["localhost", "127.0.0.1", "[::1]", "192.168.1.5", "box", "box.local"]),
    # every interface: the machine's names and addresses, never "*"
    ("0.0.0.0", [], ["localhost", "127.0.0.1", "[::1]", *MACHINE]),
    ("::", [".example.com"], ["localhost", "127.0.0.1", "[::1]", *MACHINE, ".example.com"]),
    ("0.0.0.0", ["*"], ["localhost", "127.0.0.1", "[::1]", *MACHINE, "*"]),   # the documented way to turn it off
])
def test_allowed_hosts(bind, extra, expected):
    assert allowed_hosts(bind, extra, MACHINE) == expected


def test_machine_names_are_host_patterns():
    names = machine_names()
    assert names and "*" not in names and "" not in names
    assert all(not n.startswith("[") or (n.endswith("]") and "%" not in n) for n in names)
    assert host_pattern("fe80::1%eth0") == "[fe80::1]" and host_pattern("10.0.0.1") == "10.0.0.1"


@pytest.mark.parametrize("key_set, key_valid, staff, peer_loopback, allowed", [
    (True, True, False, False, True),      # the key, from anywhere
    (True, False, False, True, False),     # a key is set: loopback alone is not enough
    (True, False, True, False, True),      # a staff session
    (False, False, False, True, True),     # no key: loopback clients
    (False, False, False, False, False),   # no key: not from another machine
    (False, False, True, False, True),     # ... unless staff
])
def test_api_allowed(key_set, key_valid, staff, peer_loopback, allowed):
    assert api_allowed(key_set=key_set, key_valid=key_valid, staff=staff, peer_loopback=peer_loopback) is allowed


@pytest.mark.parametrize("key_set, key_valid, peer_loopback, public, view", [
    (True, False, True, False, None),
    (True, True, False, False, FULL),
    (True, False, False, True, AGGREGATE),   # public: no model ids without the key
    (True, True, False, True, FULL),
    (False, False, True, False, FULL),
    (False, False, False, False, None),
    (False, False, False, True, AGGREGATE),
])
def test_metrics_view(key_set, key_valid, peer_loopback, public, view):
    assert metrics_view(key_set=key_set, key_valid=key_valid, staff=False, peer_loopback=peer_loopback,
                        public=public) == view


@pytest.mark.parametrize("method, key_valid, browser, check", [
    ("POST", False, True, True), ("PUT", False, True, True), ("DELETE", False, True, True),
    ("patch", False, True, True),
    ("GET", False, True, False), ("HEAD", False, True, False), ("OPTIONS", False, True, False),
    ("POST", True, True, False),     # the key: not an ambient credential
    ("POST", False, False, False),   # no cookie, no Origin: a script (curl, an SDK)
])
def test_needs_csrf_check(method, key_valid, browser, check):
    assert needs_csrf_check(method, key_valid=key_valid, browser=browser) is check


@pytest.mark.parametrize("content_type, ok", [
    ("application/json", True), ("APPLICATION/JSON", True), ("application/vnd.api+json", True),
    ("text/plain", False), ("application/x-www-form-urlencoded", False), ("multipart/form-data", False),
    ("", False), ("application/jsonp", False),
])
def test_is_json(content_type, ok):
    assert is_json(content_type) is ok


def test_closing_messages():
    start, body = closing_messages(started=False, sse=False, path="/v1/chat/completions")
    assert start["status"] == 503 and (b"retry-after", b"5") in start["headers"]
    assert b'"server_shutting_down"' in body["body"] and not body.get("more_body")
    (chunk,) = closing_messages(started=True, sse=True, path="/v1/completions")
    assert chunk["body"].startswith(b'data: {"error"') and chunk["body"].endswith(b"data: [DONE]\n\n")
    (event,) = closing_messages(started=True, sse=True, path="/v1/messages")
    assert event["body"].startswith(b"event: error\n") and b"[DONE]" not in event["body"]
    start, _ = closing_messages(started=False, sse=False, path="/v1/messages")
    assert start["status"] == 529
    assert closing_messages(started=True, sse=False, path="/api/pool") == [{"type": "http.response.body", "body": b""}]


def test_without_model_ids():
    text = (b'# HELP requests_total R.\n# TYPE requests_total counter\nrequests_total{model="secret/m"} 3.0\n'
            b'# HELP memory_usage_bytes U.\n# TYPE memory_usage_bytes gauge\nmemory_usage_bytes 5.0\n'
            b'# HELP evictions_total E.\n# TYPE evictions_total counter\nevictions_total{reason="lru"} 1.0\n')
    out = without_model_ids(text).decode()
    assert "secret" not in out and "memory_usage_bytes 5.0" in out and 'evictions_total{reason="lru"} 1.0' in out
