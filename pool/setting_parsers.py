"""The parsers of the OMLX_* settings (pool/conf.py): sizes ("6GB", "512MiB"), durations ("5m",
Ollama's keep_alive forms, bounded), fractions, counts, flags and keyword choices. Each takes the
setting's text and returns its typed value or raises ValueError."""

from __future__ import annotations

import re
from typing import Callable

from .backend import cpu_backend

_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")
_DURATION = re.compile(r"^\s*(-?[0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {None: 1, "ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_size(text: str | int) -> int:
    """'6GB' -> 6_000_000_000, '512MiB' -> 536_870_912, '1024' -> 1024 (SI and binary units)."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(str(text))
    if not m or m[2].lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (use bytes or a unit: KB MB GB TB KiB MiB GiB TiB)")
    return int(float(m[1]) * _UNITS[m[2].lower()])


# Go's longest time.Duration (2**63 - 1 ns, about 292 years): Ollama's "forever", and the longest any
# duration here is; a longer one overflows a date (/api/ps's expires_at) or a timer.
LONGEST_DURATION = (2**63 - 1) / 1e9


def parse_duration(text: str | int | float) -> float:
    """'5m' -> 300, '90' -> 90, '1.5h' -> 5400, '-1' -> -1 (Ollama's keep_alive forms); at most
    LONGEST_DURATION either way (2**63 and "1e400"-long digit strings included)."""
    if isinstance(text, bool):
        raise ValueError(f"not a duration: {text!r}")
    if isinstance(text, (int, float)):
        if text != text:
            raise ValueError(f"not a duration: {text!r}")
        return float(max(-LONGEST_DURATION, min(LONGEST_DURATION, text)))    # an int past float's range too
    m = _DURATION.match(str(text))
    if not m:
        raise ValueError(f"not a duration: {text!r} (use seconds or a unit: ms s m h d)")
    return max(-LONGEST_DURATION, min(LONGEST_DURATION, float(m[1]) * _DURATION_UNITS[m[2]]))


def size_or_keyword(*keywords: str) -> Callable[[str], int | str]:
    def parse(text: str) -> int | str:
        if text.strip().lower() in keywords:
            return text.strip().lower()
        return parse_size(text)
    return parse


def optional_duration(text: str) -> float | None:
    if text.strip().lower() in ("", "off", "none"):
        return None
    return parse_duration(text)


def fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise ValueError(f"not a fraction in (0, 1]: {text!r}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(f"must be >= 0: {text!r}")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"must be >= 1: {text!r}")
    return value


def tokens_or_auto(*, cpu: int, gpu: int) -> Callable[[str], int]:
    """A count of tokens, or `auto`: `cpu` on MLX's CPU backend, `gpu` elsewhere."""
    def parse(text: str) -> int:
        if text.strip().lower() != "auto":
            return positive_int(text)
        return cpu if cpu_backend() else gpu
    return parse


def tokens_or_context(text: str) -> int | None:
    """A count of tokens, or `context` (None: whatever room the model's context leaves)."""
    return None if text.strip().lower() == "context" else positive_int(text)


def flag(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise ValueError(f"not a flag: {text!r} (use 1 or 0)")


def name_list(text: str) -> list[str]:
    return [name.strip().lower() for name in text.split(",") if name.strip()]


def choice(*options: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text.strip().lower() not in options:
            raise ValueError(f"{text!r} is not one of {', '.join(options)}")
        return text.strip().lower()
    return parse
