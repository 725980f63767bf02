"""A small client for the management commands: talk to a running server's JSON API, if one answers.

Standard library only (httpx is a test dependency). `call_server` returns None when nothing answers,
so a command can fall back to the database and the model folders."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from typing import Any

from ..conf import get_settings

SERVER_TIMEOUT = 1.0


class ServerRefused(Exception):
    """A server answered, with an error."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status, self.message = status, message


def server_url() -> str:
    conf = get_settings()
    # `serve` may listen on every address; a client reaches it through loopback.
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(conf.host, conf.host)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{conf.port}"


def call_server(method: str, path: str, body: dict | None = None, *,
                timeout: float = SERVER_TIMEOUT) -> dict[str, Any] | None:
    """The server's JSON answer; None when no server answers (nothing listening, or no reply in
    time); ServerRefused when one answers with an error status."""
    headers = {"Accept": "application/json"}
    if get_settings().api_key:
        headers["Authorization"] = f"Bearer {get_settings().api_key}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(server_url() + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as e:
        raise ServerRefused(e.code, _error_message(e)) from None
    except (urllib.error.URLError, ConnectionError, socket.timeout, TimeoutError):
        return None
    except json.JSONDecodeError:
        raise ServerRefused(200, "the answer is not JSON (is another program on this port?)") from None


def _error_message(e: urllib.error.HTTPError) -> str:
    try:
        return json.loads(e.read())["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return e.reason or "error"


def announce_new_models() -> str | None:
    """Ask a running server to re-discover its models: a line to print, or None when none answers."""
    try:
        answer = call_server("POST", "/api/rediscover", {})
    except ServerRefused as e:
        return f"the server at {server_url()} did not re-discover its models: {e.message}"
    return None if answer is None else f"the running server at {server_url()} lists it now"
