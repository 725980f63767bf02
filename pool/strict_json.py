"""JSON as the API takes it: without NaN and Infinity (browsers' JSON.parse refuses them, so one in a
setting would break every dashboard's snapshot), numbers a double cannot hold (`1e400` reads as
infinity; a 400-digit integer overflows every float conversion), lone surrogates (`"\\ud800"`: no
tokenizer, database or UTF-8 encoder takes them) and the RecursionError a deeply nested body raises.
All are plain ValueErrors, which the routes answer with a 400."""

from __future__ import annotations

import json
import logging
import math
import re

MAX_INT_DIGITS = 308        # past this an integer overflows a double: no field takes one
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _no_constants(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:30]} is out of range")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits is out of range")
    return int(text)


def has_lone_surrogate(value) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def loads_strict(raw) -> object:
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    try:
        value = json.loads(raw, parse_constant=_no_constants, parse_float=_finite_float, parse_int=_bounded_int)
        if _SURROGATE_ESCAPE.search(data) and has_lone_surrogate(value):   # escapes of pairs are fine
            raise ValueError("a string holds a lone surrogate (\\ud800-\\udfff without its pair)")
    except RecursionError:
        raise ValueError("nested too deeply") from None
    return value


def dumps_finite(value) -> str:
    """JSON that every browser parses: a NaN or an infinity (none should get this far: the parsers
    refuse them) is written as null and logged, never as the bare `NaN` that would break every
    dashboard's JSON.parse."""
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError:
        logging.getLogger("pool").warning("a non-finite number reached a snapshot; sent as null")
        return json.dumps(_finite(value), allow_nan=False)


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
