"""Shared by the access tests (test_access_*.py): the API key and model name the servers are started with,
a chat message, a request sent with given headers and query string, and the CSRF token of an admin
form (the admin tests)."""

from __future__ import annotations

import re

import httpx

from tests.conftest import ServerCalls

KEY = "k3y-Zq9-access-test"
TINY = "tiny"
HI = [{"role": "user", "content": "hi"}]


def call(server: ServerCalls, method: str, path: str, body, headers: dict, query: str = "") -> httpx.Response:
    return server.fetch(method, path + query, json=body, headers=headers, timeout=60)


def csrf_token(html: str) -> str:
    """The CSRF token a Django admin page's form carries."""
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert match, html[:2000]
    return match[1]
