"""Freed heap memory goes back to the system once the requests drain.

glibc's malloc keeps the pages a round of requests freed (MLX's smaller CPU buffers, tokens,
JSON, SSE frames) in its arenas; with the two arenas process.py allows, they are rarely at the top
of a heap, where free() alone would give them back. Measured on the demo model (benchmarks/rss_rounds.py,
rounds of 32 streams): RSS grew 25-50 MB a round above MLX's active memory and stayed there, and the
enforcer counts RSS as usage. malloc_trim(0) hands every free page back (madvise); it runs here on
a thread a moment after the last request in flight ends, at most once per TRIM_EVERY seconds, so
it does not hold up the event loop and runs while no request is being answered."""

from __future__ import annotations

import asyncio
import logging
import time

import psutil

from pool.libc import malloc_trim

log = logging.getLogger("pool")

TRIM_DELAY = 1.0     # seconds without a request first: the engines' last frees (a batch's teardown) land
TRIM_EVERY = 10.0    # seconds between two trims at most


def _rss() -> int:
    return psutil.Process().memory_info().rss


class HeapTrim:
    """`busy()` when a request starts, `idle()` when none is left in flight (both on the event loop)."""

    def __init__(self, *, delay: float = TRIM_DELAY, every: float = TRIM_EVERY, trim=None):
        self.delay, self.every = delay, every
        self._trim = trim if trim is not None else malloc_trim()
        self._call: asyncio.TimerHandle | None = None
        self._last = -every
        self.trims = 0
        self.returned_bytes = 0

    def busy(self) -> None:
        if self._call is not None:
            self._call.cancel()
            self._call = None

    def idle(self) -> None:
        if self._trim is None or self._call is not None:
            return
        wait = max(self.delay, self._last + self.every - time.monotonic())
        self._call = asyncio.get_running_loop().call_later(wait, self._start)

    def _start(self) -> None:
        self._call = None
        self._last = time.monotonic()
        asyncio.ensure_future(asyncio.to_thread(self.trim_now))

    def trim_now(self) -> int:
        """Trim on this thread; the bytes RSS fell by."""
        if self._trim is None:
            return 0
        before = _rss()
        self._trim(0)
        returned = max(0, before - _rss())
        self.trims += 1
        self.returned_bytes += returned
        log.debug("malloc_trim returned %.1f MB to the system", returned / 2**20)
        return returned
