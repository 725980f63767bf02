"""Every error a client can get, rendered in one place as OpenAI's envelope."""

from __future__ import annotations

import json
import logging

from django.http import JsonResponse

from ..errors import PoolError

log = logging.getLogger("pool.api")


def envelope(error: PoolError) -> dict:
    body = {"message": error.message, "type": error.type, "param": error.param, "code": error.code}
    body.update(error.extra)
    return {"error": body}


# The official SDKs retry 409 and 5xx by default; these cannot change by retrying (a model too large,
# a failed load), and the SDKs honour this header. 503s keep Retry-After instead.
NO_RETRY_STATUSES = (409, 507)


def error_response(error: PoolError) -> JsonResponse:
    response = JsonResponse(envelope(error), status=error.status)
    for name, value in error.headers.items():
        response[name] = value
    if error.status in NO_RETRY_STATUSES:
        response["x-should-retry"] = "false"
    return response


def internal_error(exc: BaseException) -> JsonResponse:
    log.exception("unexpected error", exc_info=exc)
    return JsonResponse({"error": {"message": "The server failed while handling the request; see its log.",
                                   "type": "server_error", "param": None, "code": "internal_error"}}, status=500)


def sse_error(error: PoolError) -> bytes:
    return f"data: {json.dumps(envelope(error))}\n\n".encode()
