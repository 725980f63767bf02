"""The checks every JSON route's body goes through: strict JSON (no NaN, no deep nesting), numbers
that are finite and in range, integers, booleans, durations, and list lengths against their documented
limits. Each failure is a 400 naming the field."""

from __future__ import annotations

import math

from django.conf import settings
from django.core.exceptions import RequestDataTooBig

from ..conf import parse_duration
from ..errors import BadRequest
from ..policy.limits import too_many
from ..strict_json import loads_strict


def json_body(request) -> dict:
    try:
        raw = request.body
    except RequestDataTooBig:
        raise BadRequest(f"The body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE // 2**20} MiB.") from None
    try:
        body = loads_strict(raw or b"")
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"The body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise BadRequest("The body must be a JSON object.")
    return body


def number(body, name, lo, hi, *, lo_open=False):
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadRequest(f"'{name}' must be a finite number", param=name)
    if value < lo or value > hi or (lo_open and value == lo):
        raise BadRequest(f"'{name}' must be {'>' if lo_open else '>='} {lo} and <= {hi}; got {value}", param=name)
    return float(value)


def integer(body, name, *, minimum, maximum=2**63 - 1):
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{name}' must be an integer", param=name)
    if not minimum <= value <= maximum:
        raise BadRequest(f"'{name}' must be between {minimum} and {maximum}", param=name)
    return value


def flag(body, name: str, *, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise BadRequest(f"'{name}' must be true or false", param=name)
    return value


def check_count(value, name: str, limit: int, where: str | None = None) -> None:
    """A list longer than its documented limit: a 400 naming the field."""
    problem = too_many(len(value), limit) if isinstance(value, list) else None
    if problem:
        raise BadRequest(f"{where or repr(name)} {problem}", param=name)


def keep_alive(body) -> float | None:
    value = body.get("keep_alive")
    if value is None:
        return None
    try:
        seconds = parse_duration(value)
    except ValueError:
        raise BadRequest("'keep_alive' must be seconds or a duration like \"5m\" (0 = unload after this "
                         "request, -1 = keep loaded)", param="keep_alive") from None
    return -1.0 if seconds < 0 else seconds
