"""How the event loop talks to an engine thread: commands in a queue that the thread closes when it
ends, and futures settled from the thread on the loop that waits for them."""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any


class Mailbox:
    """Commands for one engine thread. Once the thread has closed it, `put` refuses and `close` has
    handed back what was still queued, so no caller waits on a thread that has ended (the soak found
    the enforcer calling a model that was being unloaded)."""

    def __init__(self):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False

    def put(self, command) -> bool:
        with self._lock:
            if not self._closed:
                self._queue.put(command)
                return True
        return False

    def get(self, block: bool = True):
        """The next command; raises queue.Empty when `block` is off and there is none."""
        return self._queue.get(block=block)

    def close(self) -> list:
        """Refuse every later command; returns those not taken yet, to be answered by the caller."""
        with self._lock:
            self._closed = True
        left = []
        while True:
            try:
                left.append(self._queue.get_nowait())
            except queue.Empty:
                return left


def settle(loop: asyncio.AbstractEventLoop | None, future: asyncio.Future | None, result: Any = None,
           error: BaseException | None = None) -> None:
    """Set `future`'s result (or exception) from any thread, on its loop; a future already done, or
    a loop already closed, is left alone."""
    if future is None or loop is None:
        return

    def done():
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    try:
        loop.call_soon_threadsafe(done)
    except RuntimeError:        # the loop is closed: nobody waits any more
        pass
