"""Who may call what, and which browser requests must pass Django's CSRF check.

- /v1/* needs a key when OMLX_API_KEY is set or a named key exists (pool/keys: each optionally
  limited to some models and a rate); without any it is open (the server then listens on loopback
  unless `serve --allow-remote-without-key` said otherwise). The request's key is attached to it as
  `request.omlx_key` (a keys.records.KeyRecord, or None on an open server). Ollama's routes
  (/api/tags, /api/show, /api/chat, ...: dialects.OLLAMA's paths) follow the same rule, and
  `GET /`'s liveness answer is open, as /health.
- The operator's /api/* (/api/pool, /api/models/..., /api/telemetry, ...) and the admin JSON routes
  take OMLX_API_KEY or a staff session; without it, loopback clients (or a staff session). A named
  key is a client's: it never reaches the operator's routes.
- /metrics follows /api/*; with OMLX_METRICS_PUBLIC=1 anyone gets it, without model ids.
- A state-changing request from a browser (a session cookie or an Origin header) that does not
  carry the key passes Django's CSRF rule: Origin against the allowed hosts, and the CSRF token.

The key comes as `Authorization: Bearer <key>` (OpenAI's and Ollama's clients) or `x-api-key: <key>`
(Anthropic's), compared in constant time; never from the query string or Basic auth."""

from __future__ import annotations

import hmac

from django.conf import settings

from ..api_key import given_keys, key_valid
from ..conf import get_settings
from ..errors import ServerNotReady
from ..fleet.proxy import FLEET_KEY, FORWARDED, KEY_NAME
from ..keys.records import BOOTSTRAP_RECORD, KeyRecord
from ..keys.registry import REGISTRY
from ..network import is_loopback
from .errors import Forbidden, RateLimited, Unauthorized

HOW = "send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"
SAFE_METHODS = ("GET", "HEAD", "OPTIONS", "TRACE")
FULL, AGGREGATE = "full", "aggregate"


# ---- the rules, over plain values -------------------------------------------------------------

def api_allowed(*, key_set: bool, key_valid: bool, staff: bool, peer_loopback: bool) -> bool:
    """/api/* and the admin JSON routes."""
    return staff or (key_valid if key_set else peer_loopback)


def metrics_view(*, key_set: bool, key_valid: bool, staff: bool, peer_loopback: bool,
                 public: bool) -> str | None:
    """What /metrics shows: FULL, AGGREGATE (no model ids) or None (refused)."""
    if api_allowed(key_set=key_set, key_valid=key_valid, staff=staff, peer_loopback=peer_loopback):
        return FULL
    return AGGREGATE if public else None


def needs_csrf_check(method: str, *, key_valid: bool, browser: bool) -> bool:
    """A browser's state-changing request rides on ambient credentials (its cookies, its place on
    the loopback network); a request with the key does not."""
    return method.upper() not in SAFE_METHODS and not key_valid and browser


# ---- the request's facts ----------------------------------------------------------------------

def key_ok(request) -> bool:
    """No key is set, or the request carries it."""
    return not get_settings().api_key or key_valid(request.headers)


def request_key(request) -> KeyRecord | None:
    """The key the request carries: OMLX_API_KEY's (the key 'bootstrap') or a named one (as this
    process last read them), or None."""
    if key_valid(request.headers):
        return BOOTSTRAP_RECORD
    return REGISTRY.named(given_keys(request.headers))


def carries_key(request) -> bool:
    """The request carries a key: it rides on no ambient credential."""
    return request_key(request) is not None


def peer_is_loopback(request) -> bool:
    return is_loopback(request.META.get("REMOTE_ADDR"))


def is_browser(request) -> bool:
    return settings.SESSION_COOKIE_NAME in request.COOKIES or "origin" in request.headers


async def staff_session_ok(request) -> bool:
    user = await request.auser()
    return bool(user.is_authenticated and user.is_staff)


async def _facts(request) -> dict:
    return {"key_set": bool(get_settings().api_key), "key_valid": key_valid(request.headers),
            "staff": await staff_session_ok(request), "peer_loopback": peer_is_loopback(request)}


def _refusal(key_set: bool, request) -> Exception:
    named = REGISTRY.named(given_keys(request.headers))
    if named is not None:
        return Forbidden(f"The API key '{named.name}' is a client's; the operator's routes take OMLX_API_KEY or a "
                         "staff login.")
    if key_set:
        return Unauthorized(f"Missing or wrong API key: {HOW}, or log in as staff.")
    return Forbidden("This server has no API key (OMLX_API_KEY), so this route answers loopback clients "
                     "only, or a staff login.")


def fleet_hop(request) -> bool:
    """Whether another host of the fleet forwarded this request (it checked the client's key where
    the client entered). A request that says so without the fleet key is refused: a client cannot
    pass for a host."""
    if FORWARDED not in request.headers:
        return False
    key = get_settings().fleet_key
    if not key or not hmac.compare_digest(request.headers.get(FLEET_KEY, "").encode(), key.encode()):
        raise Forbidden(f"'{FORWARDED}' is for the hosts of a fleet, which send it with the fleet key "
                        "(OMLX_FLEET_KEY); this request did not.")
    return True


# ---- what the routes wear ---------------------------------------------------------------------

async def require_key(request) -> None:
    """A client's routes (/v1/*, Ollama's): OMLX_API_KEY or a named key, within its rate; or a staff
    login (the dashboard's playground), whose POSTs the route has already held to Django's CSRF check,
    served as the operator's key."""
    await REGISTRY.current()
    key = request.omlx_key = request_key(request)
    if key is None:
        if not REGISTRY.readable and (given_keys(request.headers) or not get_settings().api_key):
            raise ServerNotReady("The API keys could not be read from the database; retry shortly.", retry_after=1)
        if REGISTRY.keys_required():
            if not await staff_session_ok(request):     # the dashboard's playground: staff, CSRF checked
                raise Unauthorized(f"Missing or wrong API key: {HOW}.")
            request.omlx_key = BOOTSTRAP_RECORD
        return
    wait = REGISTRY.admit(key)
    if wait > 0:
        raise RateLimited(f"The API key '{key.name}' may send {key.rate_per_minute} requests a minute; retry in "
                          f"{wait:.1f} s.", retry_after=wait)


async def hop_key(request) -> KeyRecord | None:
    """A forwarded request's key, by the name the host it entered put on the hop (trusted only with
    the fleet key, which fleet_hop checked): that host checked the key, its models and its rate. A
    name this host does not know (hosts on databases of their own) is served in a cache scope of its
    own, never a shared one."""
    name = request.headers.get(KEY_NAME)
    request.omlx_key = None
    if name:
        await REGISTRY.current()
        request.omlx_key = REGISTRY.by_name(name) or KeyRecord(name)
    return request.omlx_key


async def require_key_or_staff(request) -> None:
    facts = await _facts(request)
    if not api_allowed(**facts):
        raise _refusal(facts["key_set"], request)


async def metrics_access(request) -> str:
    """FULL or AGGREGATE for this request; raises when /metrics is closed to it."""
    facts = await _facts(request)
    view = metrics_view(**facts, public=get_settings().metrics_public)
    if view is None:
        raise _refusal(facts["key_set"], request)
    return view


async def require_metrics_access(request) -> None:
    request.metrics_view = await metrics_access(request)
