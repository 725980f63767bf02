"""How the event loop talks to an engine thread: commands (callables, each with the future that
waits for it) in a queue that the thread closes when it ends, and futures settled from the thread
on the loop that waits for them."""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any, Callable


class Command:
    """`run` is called on the engine thread; its result (or exception) settles `future` on `loop`.
    One sent without a future is fire-and-forget; `refused` answers it instead when the thread ended
    before taking it."""

    __slots__ = ("run", "loop", "future", "refused")

    def __init__(self, run: Callable[[], Any], *, loop: asyncio.AbstractEventLoop | None = None,
                 future: asyncio.Future | None = None,
                 refused: Callable[[BaseException], None] | None = None):
        self.run, self.loop, self.future, self.refused = run, loop, future, refused

    def execute(self) -> None:
        try:
            result = self.run()
        except BaseException as e:  # noqa: BLE001 - the caller gets it, the thread goes on
            self.settle(error=e)
        else:
            self.settle(result)

    def settle(self, result: Any = None, error: BaseException | None = None) -> None:
        settle(self.loop, self.future, result, error)

    def refuse(self, error: BaseException) -> None:
        if self.refused is not None:
            self.refused(error)
        else:
            self.settle(error=error)


class Stop(Command):
    """End the thread's serving loop: the worker releases the model, then settles the future with
    what the release measured (a ReleaseResult)."""

    __slots__ = ("message",)

    def __init__(self, message: str, *, loop: asyncio.AbstractEventLoop, future: asyncio.Future):
        super().__init__(lambda: None, loop=loop, future=future)
        self.message = message


class Mailbox:
    """Commands for one engine thread. Once the thread has closed it, `put` refuses and `close` has
    handed back what was still queued, so no caller waits on a thread that has ended."""

    def __init__(self):
        self._queue: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False

    def put(self, command: Command) -> bool:
        with self._lock:
            if not self._closed:
                self._queue.put(command)
                return True
        return False

    def get(self, block: bool = True, timeout: float | None = None) -> Command:
        """The next command; raises queue.Empty when `block` is off and there is none, or when
        none came within `timeout`."""
        return self._queue.get(block=block, timeout=timeout)

    def close(self) -> list[Command]:
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
