"""Who may see the dashboard and drive its websocket.

Open, as the API is, when OMLX_API_KEY is unset and the server listens on loopback; otherwise staff
only. The peer must be loopback too: `serve --host 0.0.0.0` with OMLX_HOST left at its default
would otherwise open the page to the network."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlparse

from django.conf import settings

from pool.conf import get_settings


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_open(client_host: str | None) -> bool:
    conf = get_settings()
    return not conf.api_key and is_loopback(conf.host) and is_loopback(client_host)


def may_view(user, client_host: str | None) -> bool:
    return is_open(client_host) or bool(user is not None and user.is_authenticated and user.is_staff)


def same_origin(headers: list[tuple[bytes, bytes]]) -> bool:
    """The websocket's Origin names the host it connects to (or a CSRF_TRUSTED_ORIGINS entry, for a
    proxy that rewrites Host). AllowedHostsOriginValidator alone passes any origin when
    ALLOWED_HOSTS is "*" (a server on 0.0.0.0)."""
    values = {name.lower(): value.decode("latin1") for name, value in headers}
    origin, host = values.get(b"origin", ""), values.get(b"host", "")
    if not origin or not host:
        return False
    if origin in getattr(settings, "CSRF_TRUSTED_ORIGINS", []):
        return True
    return urlparse(origin).netloc.lower() == host.lower()
