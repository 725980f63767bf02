"""Access where only a real `manage.py serve` process shows it: a non-loopback bind without a key is
refused, and with --allow-remote-without-key only the OpenAI and Ollama routes reach the network; slow headers and
silent connections are closed but long answers and the websocket are not (Twisted's timeouts, per
connection); no key, prompt or completion text reaches the log. The rules are in test_access_rules.py,
the in-process application's checks in test_access_asgi.py."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time

import httpx
import pytest

from pool.network import is_loopback, machine_names
from tests.access_fixtures import HI, KEY, TINY, call
from tests.conftest import ROOT, Server, free_port


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
        assert httpx.get(remote + "/api/tags", timeout=10).status_code == 200    # Ollama's routes follow /v1/*
        assert httpx.post(remote + "/api/show", json={"model": TINY}, timeout=10).status_code == 200
        for path in ("/api/pool", "/metrics", f"/admin/model/{TINY}/settings", "/api/telemetry"):
            r = httpx.get(remote + path, timeout=10)
            assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", (path, r.text)
        r = httpx.post(remote + f"/api/models/{TINY}/load", json={}, timeout=10)
        assert r.status_code == 403
        page = httpx.get(remote + "/", headers={"Accept": "text/html"}, timeout=10)
        assert page.status_code == 302 and page.headers["location"].startswith("/admin/login/")
        assert httpx.get(remote + "/", timeout=10).text == "Ollama is running"   # the heartbeat, not the page
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
    bad = [call(keyed, "POST", "/v1/chat/completions", {"model": marker, "messages": HI}, keyed.headers),
           call(keyed, "POST", "/v1/chat/completions",
                 {"model": TINY, "temperature": marker, "messages": [{"role": "user", "content": marker}]},
                 keyed.headers),
           call(keyed, "GET", "/v1/models", None, {"Authorization": f"Bearer {marker}"}),
           call(keyed, "GET", "/v1/models", None, {**keyed.headers, "Host": marker + ".example"}),
           call(keyed, "POST", f"/api/models/{TINY}/load", {}, {"Origin": f"http://{marker}.example"}),
           call(keyed, "GET", "/v1/models", None, {}, f"?api_key={KEY}&q={marker}")]
    assert [r.status_code for r in bad] == [404, 400, 401, 400, 403, 401]
    assert keyed.stop() == 0   # everything flushed
    log = keyed.log_text()
    assert "omlx-site serving on" in log   # the log is the right one
    for secret in (KEY, marker, "Zebra"):
        assert secret not in log, secret
    if len(text.strip()) >= 8:
        assert text not in log
    assert streamed and "data: [DONE]" in streamed
