"""Every error a client can get, rendered in one place: OpenAI's envelope, or Anthropic's on the
Messages routes. Both come from the same domain errors (pool/errors.py)."""

from __future__ import annotations

import json
import logging

from django.http import JsonResponse

from ..errors import PoolError

log = logging.getLogger("pool.api")

OPENAI, ANTHROPIC = "openai", "anthropic"
ANTHROPIC_PATHS = ("/v1/messages",)

# Anthropic's error types by its status codes. It answers 529 where OpenAI-style servers answer 503;
# a status it has no type for (405, 409, 507) keeps its code with the nearest type.
ANTHROPIC_STATUS = {503: 529}
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                   500: "api_error", 529: "overloaded_error"}

# The official SDKs retry 409 and 5xx by default; these cannot change by retrying (a model too large,
# a failed load), and the SDKs honour this header. 503s keep Retry-After instead.
NO_RETRY_STATUSES = (409, 507)

INTERNAL = "The server failed while handling the request; see its log."


def style_for_path(path: str) -> str:
    return ANTHROPIC if path.startswith(ANTHROPIC_PATHS) else OPENAI


def status(error: PoolError, style: str = OPENAI) -> int:
    return ANTHROPIC_STATUS.get(error.status, error.status) if style == ANTHROPIC else error.status


def anthropic_type(status_code: int) -> str:
    if status_code in ANTHROPIC_TYPES:
        return ANTHROPIC_TYPES[status_code]
    return "api_error" if status_code >= 500 else "invalid_request_error"


def envelope(error: PoolError, style: str = OPENAI) -> dict:
    if style == ANTHROPIC:
        return {"type": "error", "error": {"type": anthropic_type(status(error, style)), "message": error.message}}
    body = {"message": error.message, "type": error.type, "param": error.param, "code": error.code}
    body.update(error.extra)
    return {"error": body}


def error_response(error: PoolError, style: str = OPENAI) -> JsonResponse:
    code = status(error, style)
    response = JsonResponse(envelope(error, style), status=code)
    for name, value in error.headers.items():
        response[name] = value
    if code in NO_RETRY_STATUSES:
        response["x-should-retry"] = "false"
    return response


def internal_error(exc: BaseException, style: str = OPENAI) -> JsonResponse:
    log.exception("unexpected error", exc_info=exc)
    return error_response(PoolError(INTERNAL, code="internal_error"), style)


def sse_error(error: PoolError, style: str = OPENAI) -> bytes:
    """An error after the stream began: OpenAI's clients read it from a data line, Anthropic's from
    an `error` event."""
    data = json.dumps(envelope(error, style))
    return (f"event: error\ndata: {data}\n\n" if style == ANTHROPIC else f"data: {data}\n\n").encode()
