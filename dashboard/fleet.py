"""The dashboard in a fleet (OMLX_REDIS_URL): every host's record, as each host publishes it to the
Channels group "fleet", reaches every page; and a page's action on a model of another host is that
host's own operator API, called over the hop with the fleet key (pool/fleet/proxy.py).

Alone (no Redis), none of this runs: the page and its websocket are the single host's."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import httpx

from pool.errors import HostUnavailable, InvalidRequest, PoolError
from pool.fleet.proxy import FLEET_KEY, FORWARDED, client
from pool.strict_json import dumps_finite

# A settings write on another host answers at once; one that hangs must not hold this connection.
SETTINGS_SECONDS = 10.0
# A host whose last record is older than this many publish intervals has left the page.
STALE_INTERVALS = 3


def member_of(runtime):
    """This host's FleetMember when it meets others in Redis, else None (a single host)."""
    member = runtime.fleet
    return member if member is not None and member.registry is not None else None


def host_message(text: str) -> str:
    """A published record (JSON text) as the page's `fleet.host` message, without decoding it: only a
    record that could hold a bare NaN or Infinity (which JSON.parse refuses) is decoded and re-encoded."""
    if "NaN" in text or "Infinity" in text:
        text = dumps_finite(json.loads(text))
    return '{"type":"fleet.host","record":' + text + "}"


async def fleet_message(member) -> dict[str, Any]:
    """The whole fleet once, on connect: GET /api/fleet's body, and how long after its last record a
    silent host leaves the page."""
    state = await member.state()
    return {**state, "type": "fleet", "stale_seconds": round(STALE_INTERVALS * member.interval + 1, 1)}


async def call_host(runtime, host: str, path: str, body: dict[str, Any], *, timeout: float | None = None) -> dict:
    """POST `body` to `path` on the fleet's host `host`, as a hop (the fleet key stands for the
    operator, whom this host has checked). Its error envelope comes back as a PoolError."""
    member = member_of(runtime)
    if member is None:
        raise InvalidRequest(f"this server is not part of a fleet: there is no host {host!r} to act on")
    record = await _record_of(member, host)
    if record is None:
        raise HostUnavailable(f"The host {host} is not in the fleet now (it stopped publishing); retry shortly.",
                              retry_after=1)
    headers = {FORWARDED: runtime.settings.host_id, FLEET_KEY: runtime.settings.fleet_key}
    try:
        response = await client().post(record["url"].rstrip("/") + path, json=body, headers=headers,
                                       timeout=httpx.Timeout(timeout, connect=3.0))
    except httpx.HTTPError as e:
        raise HostUnavailable(f"The host {host} did not answer: {type(e).__name__}", retry_after=1) from None
    try:
        answer = response.json()
    except ValueError:
        answer = {}
    if response.status_code >= 400:
        error = answer.get("error") if isinstance(answer, dict) else None
        error = error if isinstance(error, dict) else {}
        message = error.get("message") or f"HTTP {response.status_code}"
        code = error.get("code") if isinstance(error.get("code"), str) else None
        raise PoolError(f"on {host}: {message}", code=code or "host_error")
    return answer if isinstance(answer, dict) else {}


async def _record_of(member, host: str) -> dict | None:
    """The host's last record: the member's recent read of the fleet, else a fresh one (a host that
    has just appeared)."""
    for fresh in (False, True):
        found = next((r for r in await member.records(fresh=fresh) if r.get("host") == host), None)
        if found is not None:
            return found
    return None


def model_path(model: str, tail: str = "") -> str:
    return "/" + quote(model, safe="/") + tail


async def load_on(runtime, host: str, model: str) -> None:
    await call_host(runtime, host, "/api/models" + model_path(model, "/load"), {})


async def unload_on(runtime, host: str, model: str, *, force: bool) -> None:
    await call_host(runtime, host, "/api/models" + model_path(model, "/unload"), {"force": force})


async def settings_on(runtime, host: str, model: str, changes: dict[str, Any]) -> None:
    await call_host(runtime, host, "/admin/model" + model_path(model, "/settings"), changes,
                    timeout=SETTINGS_SECONDS)

