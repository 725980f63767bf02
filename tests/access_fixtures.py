"""Shared by the access tests (test_access_*.py): the API key and model name the servers are started with,
a chat message, and a request sent with given headers and query string."""

from __future__ import annotations

import httpx

from tests.conftest import ServerCalls

KEY = "k3y-Zq9-access-test"
TINY = "tiny"
HI = [{"role": "user", "content": "hi"}]


def call(server: ServerCalls, method: str, path: str, body, headers: dict, query: str = "") -> httpx.Response:
    return server.fetch(method, path + query, json=body, headers=headers, timeout=60)
