"""GET /metrics (Prometheus text; who sees what: pool/api/auth.py) and GET /api/telemetry (the chart's series)."""

from __future__ import annotations

import asyncio
import math
import time

from django.http import HttpResponse, JsonResponse

from ...errors import InvalidRequest
from ...observe.metrics import CONTENT_TYPE
from ...observe.telemetry import MAX_POINTS
from ...runtime import get_runtime
from ..auth import AGGREGATE, require_key_or_staff, require_metrics_access
from ..route import api_route
from .public_metrics import without_model_ids

DEFAULT_WINDOW_SECONDS = 15 * 60


@api_route("GET", auth=require_metrics_access)
async def metrics(request):
    text = get_runtime().metrics.render()
    if request.metrics_view == AGGREGATE:   # OMLX_METRICS_PUBLIC, a client without the key
        text = without_model_ids(text)
    return HttpResponse(text, content_type=CONTENT_TYPE)


@api_route("GET", auth=require_key_or_staff)
async def telemetry(request):
    now = time.time()
    since = _number(request, "since", now - DEFAULT_WINDOW_SECONDS, "seconds since the epoch")
    until = _number(request, "until", None, "seconds since the epoch")
    step = _number(request, "step", None, "seconds")
    if step is not None and step <= 0:
        raise InvalidRequest("'step' must be a positive number of seconds", param="step")
    if step is not None:
        # never more than MAX_POINTS buckets: a wide window gets wider buckets, and says so
        span = (until if until is not None else now) - since
        step = max(step, math.ceil(span / MAX_POINTS))
    telemetry = get_runtime().telemetry
    points = await asyncio.to_thread(telemetry.query, since, step, until, limit=MAX_POINTS)
    body = {"points": points, "step": step}
    note = telemetry.note()
    if note:    # the disk refuses telemetry writes: the points include those kept in memory
        body["note"] = note
    return JsonResponse(body)


def _number(request, name: str, default: float | None, unit: str) -> float | None:
    text = request.GET.get(name)
    if text is None or text == "":
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise InvalidRequest(f"'{name}' must be a number ({unit}), not {text!r}", param=name)
    return value
