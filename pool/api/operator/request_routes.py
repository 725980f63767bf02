"""The requests' traces for operators (docs/api.md#requests): the finished ones from the database,
the in-flight ones from memory, summaries per model, and an operator's cancel. A trace's captured
text (a model's trace_body_bytes) is shown only to staff: a staff session, or OMLX_API_KEY itself."""

from __future__ import annotations

import math

from django.http import HttpResponse

from ...api_key import key_valid
from ...conf import get_settings
from ...errors import InvalidRequest
from ...runtime import get_runtime
from ...strict_json import dumps_finite
from ...traces import queries
from ..auth import require_key_or_staff, staff_session_ok
from ..errors import Forbidden, RouteNotFound, Unauthorized
from ..route import api_route


def _json(body) -> HttpResponse:
    return HttpResponse(dumps_finite(body), content_type="application/json")


async def is_staff(request) -> bool:
    return await staff_session_ok(request) or bool(get_settings().api_key and key_valid(request.headers))


async def require_staff(request) -> None:
    if await is_staff(request):
        return
    if get_settings().api_key:
        raise Unauthorized("Missing or wrong key: cancelling a request takes the server's key (OMLX_API_KEY) or "
                           "a staff login.")
    raise Forbidden("Cancelling a request takes a staff login (or the server's key, OMLX_API_KEY, when one is set).")


SINCE_MAX = 32503680000.0      # the year 3000: a datetime still holds it


def _number(request, name: str, kind, *, low=None, high=None):
    raw = request.GET.get(name)
    if raw in (None, ""):
        return None
    try:
        value = kind(raw)
    except ValueError:
        raise InvalidRequest(f"'{name}' must be a number", param=name) from None
    if not math.isfinite(value):
        raise InvalidRequest(f"'{name}' must be a finite number", param=name)
    if (low is not None and value < low) or (high is not None and value > high):
        raise InvalidRequest(f"'{name}' must be between {low} and {high}", param=name)
    return value


@api_route("GET", auth=require_key_or_staff)
async def requests(request):
    status = request.GET.get("status") or None
    if status is not None and status not in ("ok", "error") and not status.isdigit():
        raise InvalidRequest("'status' is a number (200, 503), 'ok' or 'error'", param="status")
    limit = _number(request, "limit", int, low=1, high=queries.MAX_PAGE) or 100
    return _json(await queries.apage(model=request.GET.get("model") or None, key=request.GET.get("key") or None,
                                     status=status, since=_number(request, "since", float, low=0, high=SINCE_MAX),
                                     before=request.GET.get("before") or None, limit=limit,
                                     body=await is_staff(request)))


@api_route("GET", auth=require_key_or_staff)
async def live(request):
    return _json({"data": get_runtime().traces.live()})


@api_route("GET", auth=require_key_or_staff)
async def summary(request):
    return _json({**await queries.asummary(), "writer": get_runtime().traces.stats()})


@api_route("GET", auth=require_key_or_staff)
async def one(request, trace_id: str):
    staff = await is_staff(request)
    trace = get_runtime().traces.find(trace_id)
    if trace is not None:
        return _json(trace.as_dict(body=staff))
    found = await queries.aone(trace_id, body=staff)
    if found is None:
        recent = get_runtime().traces.recent_one(trace_id)    # ended, not written yet
        if recent is None:
            raise RouteNotFound(f"No request '{trace_id}' is running or kept.")
        found = recent
    return _json(found)


@api_route("POST", auth=require_staff)
async def cancel(request, trace_id: str):
    if not get_runtime().traces.cancel(trace_id):
        raise RouteNotFound(f"No request '{trace_id}' is running.")
    return _json({"status": "ok", "id": trace_id, "cancelled": True})
