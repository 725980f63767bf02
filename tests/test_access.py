"""Access, as an attacker would try it: the rules as tables of cases, then each rule with httpx
against the ASGI application in this process (a foreign Host, an evil Origin riding a staff session,
form posts, missing, wrong, misplaced and Basic keys, the websocket's key and Origin), and against a
real `manage.py serve` process where only a process shows it (a non-loopback bind without a key,
slow clients, secrets in the log)."""

from __future__ import annotations

import base64
import os
import re
import socket
import subprocess
import sys
import time

import httpx
import pytest

from omlx_site.inflight import closing_messages
from pool.api.auth import AGGREGATE, FULL, api_allowed, metrics_view, needs_csrf_check
from pool.api.operator.public_metrics import without_model_ids
from pool.api.route import is_json
from pool.network import allowed_hosts, host_pattern, is_loopback, machine_names
from tests.conftest import ROOT, Server, ServerCalls, free_port

KEY = "k3y-Zq9-access-test"
TINY = "tiny"


# ---- the rules, as tables ------------------------------------------------------------------------

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


# ---- through the application ---------------------------------------------------------------------

def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


WRONG_KEYS = [
    ("no key", {}, ""),
    ("wrong Bearer", {"Authorization": "Bearer nope"}, ""),
    ("wrong x-api-key", {"x-api-key": KEY + "x"}, ""),
    ("a prefix of the key", {"Authorization": f"Bearer {KEY[:-1]}"}, ""),
    ("key in the query", {}, f"?api_key={KEY}&key={KEY}&token={KEY}"),
    ("Basic auth", {"Authorization": _basic("user", KEY)}, ""),
    ("Basic auth, key as user", {"Authorization": _basic(KEY, "")}, ""),
    ("scheme without space", {"Authorization": f"Bearer{KEY}"}, ""),
]

HI = [{"role": "user", "content": "hi"}]
ROUTES = [("GET", "/v1/models", None),
          ("POST", "/v1/chat/completions", {"model": TINY, "max_tokens": 1, "messages": HI}),
          ("GET", "/api/pool", None), ("POST", f"/api/models/{TINY}/unload", {}),
          ("GET", f"/admin/model/{TINY}/settings", None), ("POST", f"/admin/model/{TINY}/settings", {"notes": "x"}),
          ("GET", "/api/telemetry", None), ("GET", "/metrics", None)]


@pytest.fixture(scope="module")
def keyed(module_asgi_server, make_model):
    return module_asgi_server({TINY: make_model("tiny-20", 20)}, OMLX_API_KEY=KEY)


def _call(server: ServerCalls, method: str, path: str, body, headers: dict, query: str = "") -> httpx.Response:
    return server.fetch(method, path + query, json=body, headers=headers, timeout=60)


def test_with_a_key_every_route_refuses_every_wrong_way_to_send_it(keyed):
    for method, path, body in ROUTES:
        for name, headers, query in WRONG_KEYS:
            r = _call(keyed, method, path, body, headers, query)
            assert r.status_code == 401, (name, method, path, r.status_code, r.text)
            assert r.json()["error"]["code"] == "invalid_api_key"
        for headers in ({"Authorization": f"Bearer {KEY}"}, {"x-api-key": KEY}):
            r = _call(keyed, method, path, body, headers)
            assert r.status_code == 200, (method, path, headers, r.text)
    assert keyed.fetch("GET", "/health", timeout=10).status_code == 200   # health checks need no key
    admin = keyed.fetch("GET", "/admin/", headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
    assert admin.status_code == 302 and admin.headers["location"].startswith("/admin/login/")


def test_metrics_need_the_key_unless_public_and_then_name_no_model(start_asgi_server, make_model):
    tiny = {TINY: make_model("tiny-20", 20)}
    closed = start_asgi_server(tiny, demo=False, OMLX_API_KEY=KEY)
    assert closed.chat(TINY).status_code == 200   # a per-model series exists
    assert closed.fetch("GET", "/metrics", timeout=10).status_code == 401
    assert f'model="{TINY}"' in closed.get("/metrics").text

    public = start_asgi_server(tiny, demo=False, OMLX_API_KEY=KEY, OMLX_METRICS_PUBLIC="1")
    assert public.chat(TINY).status_code == 200
    anonymous = public.fetch("GET", "/metrics", timeout=10)
    assert anonymous.status_code == 200 and "memory_usage_bytes" in anonymous.text
    assert TINY not in anonymous.text and "model=" not in anonymous.text
    assert f'model="{TINY}"' in public.get("/metrics").text


@pytest.mark.parametrize("path", ["/api/pool", "/v1/models", "/metrics", "/health", f"/admin/model/{TINY}/settings"])
def test_a_foreign_host_is_refused_with_the_envelope(keyed, path):
    for host in ("evil.example", f"evil.example:{keyed.port}", "127.0.0.1.evil.example", "0.0.0.0", "[::2]",
                 "testserver"):   # Django's test client name: in-process only
        r = keyed.get(path, headers={"Host": host})
        assert r.status_code == 400, (host, r.text)
        assert r.headers["content-type"] == "application/json"
        assert r.json()["error"]["code"] == "disallowed_host", r.text
    for host in (f"127.0.0.1:{keyed.port}", f"localhost:{keyed.port}"):
        assert keyed.get(path, headers={"Host": host}).status_code in (200, 404), host


def test_a_foreign_host_gets_a_page_off_the_api_and_named_hosts_are_let_in(start_asgi_server, make_model):
    server = start_asgi_server({TINY: make_model("tiny-20", 20)}, demo=False,
                               OMLX_ALLOWED_HOSTS="my.box, .lan.example")
    page = server.fetch("GET", "/", headers={"Host": "evil.example"}, timeout=10)
    assert page.status_code == 400 and page.headers["content-type"].startswith("text/html")
    for host in ("my.box", "gpu.lan.example", "lan.example"):
        assert server.get("/api/pool", headers={"Host": host}).status_code == 200, host
    assert server.get("/api/pool", headers={"Host": "my.box.evil.example"}).status_code == 400


def _login(server: ServerCalls, username="admin", password="pw-Access-1") -> httpx.Client:
    """A browser with a staff session: a superuser in the server's database (the one this process's
    ORM uses while the server is active), logged in through the admin."""
    from django.contrib.auth.models import User
    from django.db import connections

    server.get("/health")     # active: its database is the ORM's
    User.objects.create_superuser(username, "a@example.com", password)
    connections.close_all()
    browser = server.http(timeout=60)
    form = browser.get("/admin/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)[1]
    done = browser.post("/admin/login/?next=/admin/", data={"username": username, "password": password,
                                                             "csrfmiddlewaretoken": token})
    assert done.status_code == 302 and "sessionid" in browser.cookies, done.text[:500]
    return browser


def test_an_evil_origin_cannot_use_a_staff_session(keyed):
    keyed.post(f"/api/models/{TINY}/load", {})
    browser = _login(keyed)
    evil = {"Origin": "http://evil.example", "Content-Type": "application/json"}
    same = {"Origin": keyed.url, "Content-Type": "application/json"}
    attempts = [("POST", f"/api/models/{TINY}/unload", b'{"force": true}'),
                ("POST", f"/admin/model/{TINY}/settings", b'{"is_pinned": true}'),
                ("PUT", f"/admin/model/{TINY}/settings", b'{"is_pinned": true}'),
                ("POST", "/api/rediscover", b"{}"),
                ("POST", "/v1/chat/completions", b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}]}')]
    for method, path, body in attempts:
        for headers in (evil, {"Origin": "null", "Content-Type": "application/json"},
                        {"Origin": f"http://localhost:{keyed.port + 1}", "Content-Type": "application/json"},
                        same):   # the right Origin without the CSRF token: still refused
            r = browser.request(method, path, content=body, headers=headers)
            assert r.status_code == 403, (method, path, headers, r.text)
            assert r.json()["error"]["code"] == "csrf_failed", r.text
    state = keyed.model(TINY)
    assert state["state"] == "loaded" and state["pinned"] is False   # nothing changed

    # the staff session still reads, and a page of this origin with its CSRF token may change things
    assert browser.get("/api/pool").status_code == 200
    token = browser.cookies["csrftoken"]
    r = browser.post(f"/admin/model/{TINY}/settings", content=b'{"notes": "from the page"}',
                     headers={**same, "X-CSRFToken": token})
    assert r.status_code == 200 and r.json()["notes"] == "from the page", r.text
    # the key is never ambient: a script with it is exempt even with an odd Origin
    r = browser.post(f"/api/models/{TINY}/unload", content=b"{}", headers={**evil, "x-api-key": KEY})
    assert r.status_code == 200 and r.json()["state"] == "unloaded", r.text


FORMS = {   # what a page on another site can send without a CORS preflight
    "form": lambda body: {"data": {"json": body.decode()}},
    "multipart form": lambda body: {"data": {"a": "b"}, "files": {"json": ("body.json", body, "application/json")}},
    "text/plain": lambda body: {"content": body, "headers": {"Content-Type": "text/plain"}},
    "no content type": lambda body: {"content": body},
}


@pytest.mark.parametrize("form", FORMS)
def test_state_changing_calls_take_only_json(start_asgi_server, make_model, form):
    server = start_asgi_server({TINY: make_model("tiny-20", 20)}, demo=False)
    for path, body in ((f"/api/models/{TINY}/load", b'{"x": 1}'),
                       (f"/admin/model/{TINY}/settings", b'{"is_pinned": true}'),
                       ("/v1/chat/completions", b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}]}'),
                       ("/v1/completions", b'{"model": "tiny", "prompt": "x"}')):
        r = server.fetch("POST", path, timeout=30, **FORMS[form](body))
        assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_media_type", (path, r.text)
    assert server.model(TINY)["state"] == "unloaded" and server.model(TINY)["pinned"] is False


def test_without_a_key_a_cross_site_page_cannot_drive_the_loopback_server(start_asgi_server, make_model):
    """No key and no cookie: the browser's Origin alone marks the request, and it must match."""
    server = start_asgi_server({TINY: make_model("tiny-20", 20)}, demo=False)
    r = server.fetch("POST", f"/admin/model/{TINY}/settings", json={"is_pinned": True},
                     headers={"Origin": "http://evil.example"}, timeout=30)
    assert r.status_code == 403 and r.json()["error"]["code"] == "csrf_failed"
    r = server.fetch("POST", "/v1/chat/completions", headers={"Origin": "http://evil.example"}, timeout=30,
                     json={"model": TINY, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 403
    assert server.model(TINY)["pinned"] is False and server.model(TINY)["state"] == "unloaded"
    assert server.post(f"/admin/model/{TINY}/settings", {"is_pinned": True}).status_code == 200   # curl, a script


def _handshake(server: Server, *, origin: str | None, headers: dict | None = None, address: str) -> bytes:
    lines = ["GET /ws/pool/ HTTP/1.1", f"Host: {address}:{server.port}", "Upgrade: websocket",
             "Connection: Upgrade", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13"]
    if origin:
        lines.append(f"Origin: {origin}")
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _websocket_status(server: Server, *, origin: str | None, headers: dict | None = None,
                      address: str = "127.0.0.1") -> int:
    """The HTTP status of a websocket handshake on /ws/pool/ (101 = accepted)."""
    with socket.create_connection((address, server.port), timeout=20) as s:
        s.sendall(_handshake(server, origin=origin, headers=headers, address=address))
        return int(s.recv(1024).split(b" ", 2)[1])


def test_the_websocket_takes_the_key_and_still_checks_the_origin(keyed):
    here = f"http://127.0.0.1:{keyed.port}"
    assert keyed.websocket_status(origin=here) == 403
    assert keyed.websocket_status(origin=here, headers={"Authorization": "Bearer nope"}) == 403
    assert keyed.websocket_status(origin=here, headers={"Authorization": f"Bearer {KEY}"}) == 101
    assert keyed.websocket_status(origin=here, headers={"x-api-key": KEY}) == 101
    for origin in ("http://evil.example", "null", None):
        assert keyed.websocket_status(origin=origin, headers={"x-api-key": KEY}) == 403, origin


# ---- binding (a `manage.py serve` process: the serve command and its listening socket) -------------

def _env(server_env: dict, **extra) -> dict:
    return {**{k: v for k, v in server_env.items() if k != "OMLX_API_KEY"}, **extra}


def _serve(env: dict, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", "serve", "--port", str(free_port()), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.77", "my-host.example"])
def test_a_non_loopback_bind_without_a_key_is_refused(tmp_path, migrated_db, host):
    home = tmp_path / "home"
    home.mkdir()
    (home / "omlx.sqlite3").write_bytes(migrated_db.read_bytes())
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMLX_")}
    env.update(OMLX_HOME=str(home), PYTHONUNBUFFERED="1")
    result = _serve(env, "--host", host)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--allow-remote-without-key" in lines[0] and "OMLX_API_KEY" in lines[0], result.stderr
    # OMLX_HOST counts the same as --host
    result = _serve({**env, "OMLX_HOST": host})
    assert result.returncode != 0 and "--allow-remote-without-key" in result.stderr


def _other_address() -> str | None:
    """An address of this machine that is not loopback, to be a client that is not local."""
    for name in machine_names():
        if re.fullmatch(r"\d+\.\d+\.\d+\.\d+", name) and not is_loopback(name):
            return name
    return None


def test_with_the_flag_it_warns_and_only_the_openai_routes_reach_the_network(tmp_path, start_server, make_model):
    probe = start_server({TINY: make_model("tiny-20", 20)}, demo=False)   # a prepared home to borrow
    probe.stop()
    env = _env(probe.env)
    port = free_port()
    log = open(tmp_path / "open.log", "wb")
    proc = subprocess.Popen([sys.executable, "manage.py", "serve", "--host", "0.0.0.0", "--port", str(port),
                             "--allow-remote-without-key"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    server = Server(probe.home, port, env)
    server.proc, server.log = proc, log
    try:
        server.wait_for(lambda: _health(server.url), timeout=60)
        assert "WARNING: listening on 0.0.0.0 without OMLX_API_KEY" in (tmp_path / "open.log").read_text()
        assert httpx.get(server.url + "/api/pool", headers={"Host": "evil.example"}, timeout=10).status_code == 400
        assert server.get("/api/pool").status_code == 200   # loopback clients keep the admin API
        other = _other_address()
        if other is None:
            pytest.skip("this machine has no non-loopback IPv4 address to come from")
        remote = f"http://{other}:{port}"
        assert httpx.get(remote + "/v1/models", timeout=10).status_code == 200   # allowed by the flag
        for path in ("/api/pool", "/metrics", f"/admin/model/{TINY}/settings", "/api/telemetry"):
            r = httpx.get(remote + path, timeout=10)
            assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", (path, r.text)
        r = httpx.post(remote + f"/api/models/{TINY}/load", json={}, timeout=10)
        assert r.status_code == 403
        page = httpx.get(remote + "/", timeout=10)
        assert page.status_code == 302 and page.headers["location"].startswith("/admin/login/")
        assert _websocket_status(server, origin=remote, address=other) == 403
    finally:
        assert server.stop() == 0


def _health(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


# ---- slow and silent clients (a `manage.py serve` process: the timeouts are Twisted's, per connection) ----

def _watch(sock: socket.socket, seconds: float, trickle: bytes = b"") -> tuple[float | None, bytes]:
    """Read (and send `trickle` a byte every 0.3 s) until the server closes or `seconds` pass:
    (seconds it took to close, or None while still open; what the server said)."""
    started = time.monotonic()
    sock.settimeout(0.3)
    said = b""
    sent = 0
    while time.monotonic() - started < seconds:
        try:
            data = sock.recv(1024)
            if not data:
                return time.monotonic() - started, said
            said += data
        except socket.timeout:
            pass
        try:
            if trickle:
                sock.sendall(trickle[sent % len(trickle):sent % len(trickle) + 1])
                sent += 1
        except OSError:
            return time.monotonic() - started, said
    return None, said


def test_slow_headers_and_silent_connections_are_closed_but_streams_are_not(start_server, make_model):
    server = start_server({TINY: make_model("tiny-20", 20)}, demo=False, OMLX_HEADER_TIMEOUT="2",
                          OMLX_IDLE_TIMEOUT="3")
    with socket.create_connection(("127.0.0.1", server.port)) as s:   # slowloris: one header byte at a time
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        took, said = _watch(s, 10, trickle=b"X-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n")
        assert took is not None and 1.5 < took < 5 and said.startswith(b"HTTP/1.1 408"), (took, said)
    with socket.create_connection(("127.0.0.1", server.port)) as s:   # connects and says nothing
        took, _ = _watch(s, 10)
        assert took is not None and took < 5
    with socket.create_connection(("127.0.0.1", server.port)) as s:   # keep-alive, then silence
        s.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n\r\n".encode())
        took, said = _watch(s, 10)
        assert b"200 OK" in said and took is not None and 2 < took < 6, (took, said)

    # nor is the dashboard's websocket
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(_handshake(server, origin=server.url, address="127.0.0.1"))
        took, said = _watch(s, 7)
        assert took is None and said.startswith(b"HTTP/1.1 101"), (took, said[:200])

    # an answer that takes longer than both limits is not cut off, whether it streams or not
    body = b'{"model": "tiny", "prompt": "x", "max_tokens": 8000, "stream": true}'
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        took, said = _watch(s, 8)
        assert took is None and said.startswith(b"HTTP/1.1 200") and b"data: " in said, (took, said[:300])
        assert server.model(TINY)["active_requests"] == 1


# ---- logs (a `manage.py serve` process: everything the process writes, Daphne's own lines included) --

def test_no_key_prompt_or_completion_text_in_the_log(start_server, make_model):
    keyed = start_server({TINY: make_model("tiny-20", 20)}, demo=False, OMLX_API_KEY=KEY)   # its own log
    marker = "Zebra-Quartz-Marker-7731"
    reply = keyed.chat(TINY, messages=[{"role": "user", "content": f"Say {marker} please"}], max_tokens=12)
    assert reply.status_code == 200
    text = reply.json()["choices"][0]["message"]["content"]
    with httpx.stream("POST", keyed.url + "/v1/completions", headers=keyed.headers, timeout=60,
                      json={"model": TINY, "prompt": marker * 3, "max_tokens": 8, "stream": True}) as r:
        streamed = "".join(line for line in r.iter_lines())
    bad = [_call(keyed, "POST", "/v1/chat/completions", {"model": marker, "messages": HI}, keyed.headers),
           _call(keyed, "POST", "/v1/chat/completions",
                 {"model": TINY, "temperature": marker, "messages": [{"role": "user", "content": marker}]},
                 keyed.headers),
           _call(keyed, "GET", "/v1/models", None, {"Authorization": f"Bearer {marker}"}),
           _call(keyed, "GET", "/v1/models", None, {**keyed.headers, "Host": marker + ".example"}),
           _call(keyed, "POST", f"/api/models/{TINY}/load", {}, {"Origin": f"http://{marker}.example"}),
           _call(keyed, "GET", "/v1/models", None, {}, f"?api_key={KEY}&q={marker}")]
    assert [r.status_code for r in bad] == [404, 400, 401, 400, 403, 401]
    assert keyed.stop() == 0   # everything flushed
    log = keyed.log_text()
    assert "omlx-site serving on" in log   # the log is the right one
    for secret in (KEY, marker, "Zebra"):
        assert secret not in log, secret
    if len(text.strip()) >= 8:
        assert text not in log
    assert streamed and "data: [DONE]" in streamed
