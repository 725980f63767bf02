"""What a connection may hold (a `manage.py serve` process, raw sockets: the limits are Twisted's
channel, omlx_site/channel.py): a finished answer its client never reads is dropped after the idle
limit, one address holds at most OMLX_MAX_CONNECTIONS_PER_CLIENT connections, and a request line or
headers over 16 KiB are answered 414 and 431 instead of a dropped connection or a 400."""

from __future__ import annotations

import json
import socket
import time

import psutil

from tests.conftest import DEMO, Server

STAND_IN_DEMO = True   # shapes, errors and faults, not answers: tests/conftest.py demo_folder


def _connect(server: Server, *, receive_buffer: int | None = None) -> socket.socket:
    s = socket.socket()
    if receive_buffer:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    s.connect(("127.0.0.1", server.port))
    return s


def _request(server: Server, method: str, path: str, body: bytes = b"", headers: dict | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{server.port}",
             *(f"{k}: {v}" for k, v in (headers or {}).items())]
    if body:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _answer(s: socket.socket) -> bytes:
    """One whole response with a Content-Length (or what came before the server closed)."""
    s.settimeout(30)
    data = b""
    while b"\r\n\r\n" not in data:
        part = s.recv(65536)
        if not part:
            return data
        data += part
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(rest) < length:
        part = s.recv(65536)
        if not part:
            break
        rest += part
    return head + b"\r\n\r\n" + rest


def _state(s: socket.socket) -> str:
    """This client socket's TCP state as the kernel sees it (ESTABLISHED while the server holds it)."""
    port = s.getsockname()[1]
    found = [c.status for c in psutil.Process().net_connections(kind="tcp") if c.laddr and c.laddr.port == port]
    return found[0] if found else "GONE"


def test_a_finished_answer_the_client_never_reads_is_dropped(start_server):
    server = start_server(OMLX_IDLE_TIMEOUT="2")
    assert server.chat(DEMO).status_code == 200    # loaded, so the stream below ends soon
    # eight choices with logprobs: some hundred KB, far more than the client's tiny window takes
    body = json.dumps({"model": DEMO, "prompt": "x", "max_tokens": 60, "n": 8, "logprobs": 5, "stream": True}).encode()
    with _connect(server, receive_buffer=4096) as s:
        s.sendall(_request(server, "POST", "/v1/completions", body))
        server.wait_for(lambda: server.model(DEMO)["active_requests"] == 1)
        server.wait_for(lambda: server.model(DEMO)["active_requests"] == 0, timeout=120)   # the answer is done
        # without the limit the server closes its end politely and the kernel keeps the unread answer,
        # the connection's FIN queued behind it, for as long as the client keeps its window shut
        server.wait_for(lambda: _state(s) != "ESTABLISHED", timeout=60)
    assert "dropping a connection whose client read none of" in server.log_text()


def test_a_client_that_reads_the_answer_keeps_it_whole(start_server):
    server = start_server(OMLX_IDLE_TIMEOUT="10")   # time to start reading once the answer is done
    body = json.dumps({"model": DEMO, "prompt": "x", "max_tokens": 20, "n": 8, "logprobs": 5, "stream": True}).encode()
    with _connect(server, receive_buffer=4096) as s:
        s.sendall(_request(server, "POST", "/v1/completions", body))
        server.wait_for(lambda: server.model(DEMO)["active_requests"] == 0 and server.model(DEMO)["state"] == "loaded",
                        timeout=120)
        s.settimeout(30)
        data = b""
        while not data.endswith(b"0\r\n\r\n"):     # the chunked body's end
            part = s.recv(4096)
            assert part, data[-300:]
            data += part
    assert data.startswith(b"HTTP/1.1 200") and b"data: [DONE]" in data


def test_one_address_holds_at_most_its_connections(start_server):
    server = start_server(demo=False, OMLX_MAX_CONNECTIONS_PER_CLIENT="3", OMLX_FLEET_KEY="fleet-secret")
    held = [_connect(server) for _ in range(3)]
    try:
        for s in held:
            s.sendall(_request(server, "GET", "/health"))
            assert _answer(s).startswith(b"HTTP/1.1 200")
        with _connect(server) as extra:
            extra.sendall(_request(server, "GET", "/v1/models"))
            answer = _answer(extra)
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in head, answer
            assert json.loads(body)["error"]["code"] == "too_many_connections"
            assert extra.recv(10) == b""      # and closed
        with _connect(server) as hop:       # another host of the fleet is never refused
            hop.sendall(_request(server, "GET", "/health", headers={"x-omlx-fleet-key": "fleet-secret"}))
            assert _answer(hop).startswith(b"HTTP/1.1 200")
        held[0].sendall(_request(server, "GET", "/health"))    # those it holds still work
        assert _answer(held[0]).startswith(b"HTTP/1.1 200")
        held.pop().close()
        server.wait_for(lambda: _fits(server))                   # one closed: room for one more
    finally:
        for s in held:
            s.close()


def _fits(server: Server) -> bool:
    with _connect(server) as s:
        s.sendall(_request(server, "GET", "/health"))
        return _answer(s).startswith(b"HTTP/1.1 200")


def test_a_request_line_or_headers_over_16_kib_are_answered(start_server):
    server = start_server(demo=False)
    long = "a" * 17000
    cases = [(_request(server, "GET", f"/v1/models?q={long}"), b"HTTP/1.1 414"),
             (_request(server, "GET", f"/v1/models?q={'a' * 15000}", headers={"X-Pad": "b" * 3000}), b"HTTP/1.1 431"),
             (_request(server, "GET", "/v1/models", headers={"X-Pad": long}), b"HTTP/1.1 431"),
             (_request(server, "GET", "/v1/models", headers={f"X-Pad-{i}": "c" * 1000 for i in range(20)}),
              b"HTTP/1.1 431")]
    for request, status in cases:
        with _connect(server) as s:
            s.sendall(request)
            answer = _answer(s)
            assert answer.startswith(status), (status, answer[:200])
    assert server.get("/v1/models").status_code == 200      # a request under the limits is served


def _read_until_closed(s: socket.socket, limit: float) -> tuple[bytes, float]:
    s.settimeout(limit)
    data, started = b"", time.monotonic()
    try:
        while part := s.recv(65536):
            data += part
    except TimeoutError:
        pass
    return data, time.monotonic() - started


def test_an_answer_that_is_not_kept_alive_closes_at_its_end(start_server):
    """HTTP/1.0 (nginx's default to its backends) and `Connection: close` end with the answer, not
    OMLX_IDLE_TIMEOUT later: a client reading to the close would wait the whole idle limit."""
    server = start_server(OMLX_IDLE_TIMEOUT="60")
    host = f"127.0.0.1:{server.port}"
    stream = json.dumps({"model": DEMO, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
                         "stream": True}).encode()
    requests = {
        "HTTP/1.0": f"GET /health HTTP/1.0\r\nHost: {host}\r\n\r\n".encode(),
        "Connection: close": f"GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode(),
        "an HTTP/1.0 stream": (f"POST /v1/chat/completions HTTP/1.0\r\nHost: {host}\r\nContent-Type: application/json"
                               f"\r\nContent-Length: {len(stream)}\r\n\r\n").encode() + stream,
    }
    for name, request in requests.items():
        with _connect(server) as s:
            s.sendall(request)
            data, took = _read_until_closed(s, 30)
        print(f"{name}: closed {took:.2f}s after the request")
        assert data.split(b"\r\n")[0].endswith(b"200 OK"), (name, data[:200])
        assert took < 10, (name, took, data[-200:])
    assert b"data: [DONE]" in data
