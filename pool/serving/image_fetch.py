"""Fetching an image URL, when OMLX_IMAGE_FETCH is on: the lessons of the SSRF advisories on media
fetchers (docs/api.md, "Images"). Every hop's host is resolved here and refused when any address
is not a public one (loopback, private, link-local, shared, reserved, multicast); the connection
then goes to the address that was checked, so a second lookup cannot rebind it; redirects are
followed by hand, at most MAX_REDIRECTS, each checked the same way; the body is read in chunks and
dropped as soon as it passes the byte cap, before any decoding; the whole fetch has one deadline.
It blocks: it runs on the worker thread the route parses the body on, never on the event loop."""

from __future__ import annotations

import ipaddress
import socket
import time
from typing import Callable
from urllib.parse import urljoin, urlsplit, urlunsplit

import httpx

from .images import FETCH_FAILED, MEDIA_TYPES, REFUSED, TOO_LARGE, refuse

MAX_REDIRECTS = 3
TYPES = tuple(MEDIA_TYPES.values())

Resolver = Callable[[str, int], list[str]]


def resolve(host: str, port: int) -> list[str]:
    return sorted({str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)})


def public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not (ip.is_multicast or ip.is_reserved or ip.is_unspecified or ip.is_loopback
                                 or ip.is_link_local or ip.is_private)


def _checked(url: str, param: str, resolver: Resolver) -> tuple[str, str, str]:
    """(the URL with the checked address for its host, the Host header, the TLS name)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise refuse(f"an image URL must be http(s) with a host; got {url[:80]!r}", param, REFUSED)
    if parts.username or parts.password:
        raise refuse("an image URL may not carry a user name or password", param, REFUSED)
    host = parts.hostname
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        addresses = resolver(host, port)
    except (OSError, UnicodeError):
        raise refuse(f"the image's host {host!r} cannot be resolved", param, FETCH_FAILED) from None
    if not addresses or not all(public(a) for a in addresses):
        raise refuse(f"the image's host {host!r} is not a public address; this server fetches images only from "
                     "public ones", param, REFUSED)
    address = addresses[0]
    netloc = f"[{address}]" if ":" in address else address
    pinned = urlunsplit((parts.scheme, f"{netloc}:{port}", parts.path or "/", parts.query, ""))
    host_header = host if parts.port is None else f"{host}:{parts.port}"
    return pinned, host_header, host


def fetch(url: str, *, param: str, max_bytes: int, timeout: float, resolver: Resolver = resolve,
          transport: httpx.BaseTransport | None = None) -> bytes:
    """The body of an image URL, at most `max_bytes`; InvalidImage naming `param` otherwise."""
    deadline = time.monotonic() + timeout
    with httpx.Client(follow_redirects=False, timeout=timeout, transport=transport, trust_env=False) as client:
        for _ in range(MAX_REDIRECTS + 1):
            pinned, host_header, tls_name = _checked(url, param, resolver)
            try:
                with client.stream("GET", pinned, headers={"Host": host_header, "Accept": ", ".join(TYPES)},
                                   extensions={"sni_hostname": tls_name}) as response:
                    if response.is_redirect and response.headers.get("location"):
                        url = urljoin(url, response.headers["location"])
                        continue
                    return _body(response, param, max_bytes, deadline)
            except httpx.HTTPError as e:
                raise refuse(f"the image could not be fetched ({type(e).__name__})", param, FETCH_FAILED) from None
    raise refuse(f"the image URL redirects more than {MAX_REDIRECTS} times", param, FETCH_FAILED)


def _body(response: httpx.Response, param: str, max_bytes: int, deadline: float) -> bytes:
    if response.status_code != 200:
        raise refuse(f"fetching the image answered HTTP {response.status_code}", param, FETCH_FAILED)
    media_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type not in TYPES:
        raise refuse(f"the image URL answered {media_type or 'no content type'!r}, not one of {', '.join(TYPES)}",
                     param, FETCH_FAILED)
    too_large = refuse(f"the image is more than {max_bytes / 1e6:g} MB (OMLX_MAX_IMAGE_BYTES, "
                       "OMLX_MAX_REQUEST_IMAGE_BYTES)", param, TOO_LARGE)
    length = response.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise too_large
    body = bytearray()
    for chunk in response.iter_bytes():
        body += chunk
        if len(body) > max_bytes:
            raise too_large
        if time.monotonic() > deadline:
            raise refuse("fetching the image took longer than OMLX_IMAGE_FETCH_TIMEOUT", param, FETCH_FAILED)
    return bytes(body)
