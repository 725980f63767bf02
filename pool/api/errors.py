"""Every error a client can get, rendered in one place: the table below gives each core error
(pool/errors.py) and each of the API's own its HTTP status and its type in each dialect; the dialect
(dialects.py) words it and frames it. Never a traceback in a body."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from django.http import JsonResponse

from ..errors import (
    Busy,
    EngineFailure,
    InsufficientMemory,
    InvalidRequest,
    LoadAborted,
    ModelBusy,
    ModelNotFound,
    ModelUnavailable,
    PoolError,
    StorageUnavailable,
)
from .dialects import ANTHROPIC, OPENAI, Dialect

log = logging.getLogger("pool.api")

INTERNAL = "The server failed while handling the request; see its log."


def internal() -> PoolError:
    return PoolError(INTERNAL, code="internal_error")


# ---- the API's own errors: about the HTTP request, not the models -----------------------------------

class Unauthorized(PoolError):
    code = "invalid_api_key"


class Forbidden(PoolError):
    code = "forbidden"


class ModelNotAllowed(Forbidden):
    """The request's API key is limited to other models (pool/keys)."""
    code = "model_not_allowed"


class RateLimited(Busy):
    """The request's API key sent more than its rate (pool/keys); `retry_after` says when one may go."""
    code = "rate_limit_exceeded"


class RouteNotFound(PoolError):
    code = "not_found"


class MethodNotAllowed(PoolError):
    code = "method_not_allowed"


class RequestTooLarge(PoolError):
    code = "request_too_large"


# ---- the table ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    status: int
    openai: str          # OpenAI's error type
    anthropic: str       # Anthropic's


ERRORS: dict[type[PoolError], Row] = {
    InvalidRequest: Row(400, "invalid_request_error", "invalid_request_error"),
    Unauthorized: Row(401, "authentication_error", "authentication_error"),
    Forbidden: Row(403, "permission_error", "permission_error"),
    RateLimited: Row(429, "requests", "rate_limit_error"),
    ModelNotFound: Row(404, "invalid_request_error", "not_found_error"),
    RouteNotFound: Row(404, "invalid_request_error", "not_found_error"),
    MethodNotAllowed: Row(405, "invalid_request_error", "invalid_request_error"),
    ModelUnavailable: Row(409, "invalid_request_error", "invalid_request_error"),
    ModelBusy: Row(409, "invalid_request_error", "invalid_request_error"),
    LoadAborted: Row(409, "invalid_request_error", "invalid_request_error"),
    RequestTooLarge: Row(413, "invalid_request_error", "request_too_large"),
    EngineFailure: Row(500, "server_error", "api_error"),
    Busy: Row(503, "server_error", "overloaded_error"),
    InsufficientMemory: Row(507, "server_error", "api_error"),
    StorageUnavailable: Row(507, "server_error", "api_error"),
    PoolError: Row(500, "server_error", "api_error"),
}

# The official SDKs retry 409 and 5xx by default; these cannot change by retrying (a model too large,
# a failed load), and the SDKs honour this header. Busy answers carry Retry-After instead.
NO_RETRY_STATUSES = (409, 507)


def row(error: PoolError) -> Row:
    return next(ERRORS[cls] for cls in type(error).__mro__ if cls in ERRORS)


def status_of(error: PoolError, dialect: Dialect = OPENAI) -> int:
    return dialect.status(row(error).status)


def error_type(error: PoolError, dialect: Dialect = OPENAI) -> str:
    return row(error).anthropic if dialect is ANTHROPIC else row(error).openai


def envelope(error: PoolError, dialect: Dialect = OPENAI) -> dict:
    return dialect.envelope(error, status_of(error, dialect), error_type(error, dialect))


def error_response(error: PoolError, dialect: Dialect = OPENAI) -> JsonResponse:
    status = status_of(error, dialect)
    response = JsonResponse(envelope(error, dialect), status=status)
    if isinstance(error, Busy):
        response["Retry-After"] = str(max(1, math.ceil(error.retry_after)))
    if status in NO_RETRY_STATUSES:
        response["x-should-retry"] = "false"
    return response


def internal_error(exc: BaseException, dialect: Dialect = OPENAI) -> JsonResponse:
    log.exception("unexpected error", exc_info=exc)
    return error_response(internal(), dialect)


def stream_error(error: BaseException, dialect: Dialect = OPENAI) -> bytes:
    """What ends a stream that has begun, on any failure: the dialect's error event, then its end."""
    if not isinstance(error, PoolError):
        log.exception("unexpected error in a stream", exc_info=error)
        error = internal()
    return dialect.stream_error(error, status_of(error, dialect), error_type(error, dialect)) + dialect.stream_end
