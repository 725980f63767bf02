"""Access, as an attacker would try it, with httpx against the ASGI application in this process: missing,
wrong, misplaced and Basic keys on every route, metrics with and without the key, a foreign Host, an evil
Origin riding a staff session, form posts, a cross-site page driving a server without a key, and the
websocket's key and Origin. The rules on their own are in test_access_rules.py; what only a `manage.py
serve` process shows is in test_access_serve.py."""

from __future__ import annotations

import base64
import re

import httpx
import pytest

from tests.access_fixtures import HI, KEY, TINY, call
from tests.conftest import ServerCalls

STAND_IN_DEMO = True   # shapes, errors and faults, not answers: tests/conftest.py demo_folder


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

ROUTES = [("GET", "/v1/models", None),
          ("POST", "/v1/chat/completions", {"model": TINY, "max_tokens": 1, "messages": HI}),
          ("GET", "/api/pool", None), ("POST", f"/api/models/{TINY}/unload", {}),
          ("GET", f"/admin/model/{TINY}/settings", None), ("POST", f"/admin/model/{TINY}/settings", {"notes": "x"}),
          ("GET", "/api/telemetry", None), ("GET", "/metrics", None)]


@pytest.fixture(scope="module")
def keyed(module_asgi_server, make_model):
    return module_asgi_server({TINY: make_model("tiny-20", 20)}, OMLX_API_KEY=KEY)


def test_with_a_key_every_route_refuses_every_wrong_way_to_send_it(keyed):
    for method, path, body in ROUTES:
        for name, headers, query in WRONG_KEYS:
            r = call(keyed, method, path, body, headers, query)
            assert r.status_code == 401, (name, method, path, r.status_code, r.text)
            assert r.json()["error"]["code"] == "invalid_api_key"
        for headers in ({"Authorization": f"Bearer {KEY}"}, {"x-api-key": KEY}):
            r = call(keyed, method, path, body, headers)
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


def test_a_staff_session_may_use_the_client_routes_with_its_csrf_token(keyed):
    """The dashboard's playground on a server with a key: the staff session stands for the key, on
    this origin and with the CSRF token only."""
    browser = _login(keyed, username="playground")
    same = {"Origin": keyed.url, "Content-Type": "application/json"}
    body = b'{"model": "tiny", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}'
    token = {"X-CSRFToken": browser.cookies["csrftoken"]}
    r = browser.post("/v1/chat/completions", content=body, headers={**same, **token})
    assert r.status_code == 200, r.text
    r = browser.post("/v1/chat/completions", content=body, headers=same)
    assert r.status_code == 403 and r.json()["error"]["code"] == "csrf_failed", r.text
    assert keyed.fetch("POST", "/v1/chat/completions", content=body, timeout=30,
                       headers={"Content-Type": "application/json"}).status_code == 401


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
        sent = FORMS[form](body)
        sent["headers"] = {**sent.get("headers", {}), "Origin": "http://evil.example"}   # a page's post has one
        r = server.fetch("POST", path, timeout=30, **sent)
        assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_media_type", (path, r.text)
    assert server.model(TINY)["state"] == "unloaded" and server.model(TINY)["pinned"] is False


def test_a_script_without_an_origin_may_post_json_untyped(start_asgi_server, make_model):
    """`curl URL -d '{...}'` (form-encoded by default), as Ollama's and OpenAI's docs write it: no browser
    sends a POST without an Origin, so the body is read as the JSON it is."""
    server = start_asgi_server({TINY: make_model("tiny-20", 20)}, demo=False)
    for path, body in (("/api/generate", b'{"model": "tiny", "prompt": "x", "stream": false, "options": '
                                         b'{"num_predict": 1}}'),
                       ("/v1/completions", b'{"model": "tiny", "prompt": "x", "max_tokens": 1}')):
        r = server.fetch("POST", path, timeout=30, content=body,
                         headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert r.status_code == 200, (path, r.text)


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


def test_the_websocket_takes_the_key_and_still_checks_the_origin(keyed):
    here = f"http://127.0.0.1:{keyed.port}"
    assert keyed.websocket_status(origin=here) == 403
    assert keyed.websocket_status(origin=here, headers={"Authorization": "Bearer nope"}) == 403
    assert keyed.websocket_status(origin=here, headers={"Authorization": f"Bearer {KEY}"}) == 101
    assert keyed.websocket_status(origin=here, headers={"x-api-key": KEY}) == 101
    for origin in ("http://evil.example", "null", None):
        assert keyed.websocket_status(origin=origin, headers={"x-api-key": KEY}) == 403, origin
