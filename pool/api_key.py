"""The API key a request offers: `Authorization: Bearer <key>` (OpenAI's clients) or
`x-api-key: <key>` (Anthropic's), compared with OMLX_API_KEY in constant time. Never the query
string or Basic auth. Shared by the routes (pool/api/auth.py) and the dashboard's websocket."""

from __future__ import annotations

import hmac
from typing import Mapping

from .conf import get_settings


def given_keys(headers: Mapping[str, str]) -> list[str]:
    """The keys a request offers, from either header (`headers` looks names up case-insensitively,
    or has them in lower case)."""
    keys = []
    scheme, _, token = (headers.get("authorization") or "").partition(" ")
    if scheme.lower() == "bearer":
        keys.append(token.strip())
    if headers.get("x-api-key") is not None:
        keys.append(headers["x-api-key"].strip())
    return keys


def key_valid(headers: Mapping[str, str]) -> bool:
    """A key is set and the request carries it."""
    key = get_settings().api_key
    # compared as bytes: compare_digest takes only ASCII str, and a header may carry anything
    return bool(key) and any(hmac.compare_digest(given.encode(), key.encode()) for given in given_keys(headers))


def scope_headers(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """An ASGI scope's headers as a dict with lower-case names."""
    return {name.decode("latin1").lower(): value.decode("latin1") for name, value in headers}
