"""Byte sizes and lists of names, as the pool's messages write them."""

from __future__ import annotations

from collections.abc import Iterable

GIB = 2**30


def format_bytes(n: int) -> str:
    """Decimal units, like setting_parsers.parse_size's: 1.2 GB, 115.2 MB, 999 B."""
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def join_names(parts: Iterable[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    items = list(parts)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]
