"""Who may see the dashboard and drive its websocket.

Open, as the API is, when OMLX_API_KEY is unset and the server listens on loopback; otherwise staff
only; the websocket also takes the API key in a header, for scripts. The peer must be loopback
too: `serve --host 0.0.0.0` with OMLX_HOST left at its default would otherwise open the page to
the network."""

from __future__ import annotations

from urllib.parse import urlparse

from django.conf import settings
from django.http.request import split_domain_port, validate_host

from pool.api_key import key_valid, scope_headers
from pool.conf import get_settings
from pool.network import is_loopback


def is_open(client_host: str | None) -> bool:
    conf = get_settings()
    return not conf.api_key and is_loopback(conf.host) and is_loopback(client_host)


def may_view(user, client_host: str | None) -> bool:
    return is_open(client_host) or bool(user is not None and user.is_authenticated and user.is_staff)


def may_connect(user, client_host: str | None, headers: list[tuple[bytes, bytes]]) -> bool:
    """The websocket: what may_view allows, or the API key in its headers (a script)."""
    return may_view(user, client_host) or key_valid(scope_headers(headers))


def same_origin(headers: list[tuple[bytes, bytes]]) -> bool:
    """The websocket's Origin names the host it connects to (or a CSRF_TRUSTED_ORIGINS entry, for a
    proxy that rewrites Host), and that host is one the server answers to (ALLOWED_HOSTS).
    AllowedHostsOriginValidator alone passes any origin when ALLOWED_HOSTS is "*"."""
    values = scope_headers(headers)
    origin, host = values.get("origin", ""), values.get("host", "")
    if not origin or not host:
        return False
    if not validate_host(split_domain_port(host)[0], settings.ALLOWED_HOSTS):
        return False
    if origin in getattr(settings, "CSRF_TRUSTED_ORIGINS", []):
        return True
    return urlparse(origin).netloc.lower() == host.lower()
