"""The C library, for glibc's malloc controls (mallopt, malloc_trim); standard library only, so the
process set-up can call it before anything imports MLX."""

from __future__ import annotations

import ctypes
import functools
import sys
from typing import Callable


@functools.cache
def glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc on Linux, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None   # not glibc


def malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim (hands free heap pages back to the system), or None without glibc."""
    return getattr(glibc(), "malloc_trim", None)
