"""JSON as the API takes it: without NaN and Infinity (browsers' JSON.parse refuses them, so one in a
setting would break every dashboard's snapshot) and without the RecursionError a deeply nested
body raises; both are plain ValueErrors, which the routes answer with a 400."""

from __future__ import annotations

import json


def _no_constants(name: str):
    raise ValueError(f"{name} is not a JSON number")


def loads_strict(raw) -> object:
    try:
        return json.loads(raw, parse_constant=_no_constants)
    except RecursionError:
        raise ValueError("nested too deeply") from None
