"""The checks every JSON route's body goes through: strict JSON (no NaN, no deep nesting), numbers
that are finite and in range, integers, booleans, durations, and list lengths against their documented
limits. Each failure is a 400 naming the field."""

from __future__ import annotations

import asyncio
import math

from django.conf import settings
from django.core.exceptions import RequestDataTooBig

from ..conf import get_settings
from ..errors import InvalidRequest
from ..policy import kv
from ..policy.limits import stop_problem, too_many
from ..serving import image_fetch
from ..serving.images import ImageBudget, ImageLimits
from ..setting_parsers import LONGEST_DURATION, parse_duration
from ..strict_json import loads_strict


def json_body(request) -> dict:
    try:
        raw = request.body
    except RequestDataTooBig:
        raise InvalidRequest(f"The body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE // 2**20} MiB.") from None
    try:
        body = loads_strict(raw or b"")
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidRequest(f"The body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("The body must be a JSON object.")
    return body


def number(body, name, lo, hi, *, lo_open=False):
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidRequest(f"'{name}' must be a finite number", param=name)
    if value < lo or value > hi or (lo_open and value == lo):
        raise InvalidRequest(f"'{name}' must be {'>' if lo_open else '>='} {lo} and <= {hi}; got {value}", param=name)
    return float(value)


def integer(body, name, *, minimum, maximum=2**63 - 1):
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"'{name}' must be an integer", param=name)
    if not minimum <= value <= maximum:
        raise InvalidRequest(f"'{name}' must be between {minimum} and {maximum}", param=name)
    return value


def flag(body, name: str, *, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise InvalidRequest(f"'{name}' must be true or false", param=name)
    return value


def check_count(value, name: str, limit: int, where: str | None = None) -> None:
    """A list longer than its documented limit: a 400 naming the field."""
    problem = too_many(len(value), limit) if isinstance(value, list) else None
    if problem:
        raise InvalidRequest(f"{where or repr(name)} {problem}", param=name)


def keep_alive(body) -> float | None:
    value = body.get("keep_alive")
    if value is None:
        return None
    try:
        seconds = parse_duration(value)
    except ValueError:
        raise InvalidRequest("'keep_alive' must be seconds or a duration like \"5m\" (0 = unload after this "
                         "request, -1 = keep loaded)", param="keep_alive") from None
    return -1.0 if seconds < 0 or seconds >= LONGEST_DURATION else seconds     # the longest is forever


def stop_strings(value, *, name: str, where: str, max_count: int | None, strings_only: bool = False) -> tuple[str, ...]:
    """A request's stop strings (OpenAI's `stop`: a string or a list; Anthropic's `stop_sequences`: a
    list), checked against their documented limits (OMLX_MAX_STOP_LENGTH); empty ones dropped.
    `where` is how the dialect names the field in a message."""
    if value is None:
        return ()
    if isinstance(value, str) and not strings_only:
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        shape = "a list of strings" if strings_only else "a string or a list of strings"
        raise InvalidRequest(f"{where} must be {shape}", param=name)
    problem = stop_problem(value, max_count=max_count, max_chars=get_settings().max_stop_length)
    if problem:
        raise InvalidRequest(f"{where} {problem}", param=name)
    return tuple(s for s in value if s)


def kv_fields(body) -> dict:
    """The KV limits the body gives (their combination with the model's defaults is checked later)."""
    given = {name: body[name] for name in kv.FIELDS if body.get(name) is not None}
    for name, value in given.items():
        problem = kv.field_problem(name, value)
        if problem:
            raise InvalidRequest(f"'{name}' {problem}", param=name)
    return given


def image_budget() -> ImageBudget:
    """One request's images: counted and read against the image settings (pool/serving/images.py)."""
    return ImageBudget(ImageLimits.from_settings(get_settings()), fetch=image_fetch.fetch)


async def off_loop(parse, *args, **kwargs):
    """A body parsed on a worker thread: its images are decoded (and fetched, if allowed) there."""
    return await asyncio.to_thread(parse, *args, **kwargs)
