"""EngineWorker: what every engine does the same way, whatever its kind of model.

One model on one engine thread (kept and reused across loads: threads.py). The event loop never
touches MLX: it sends commands (mailbox.py) and awaits their futures. The thread's life is
load -> serve -> close: `_open` reads the model (its weights only once `memory_free` is set, when
the models a load evicts are gone), `_serve` runs commands and the subclass's work between them until
a Stop arrives, the release measures what the model held and what MLX's active memory fell by, and
closing the mailbox answers every command still queued, so nobody waits on a thread that has ended.

Subclasses say what loading means (`_open`), what work runs between commands (`_has_work`, `_work`),
what to end before a release (`_release`) and what to drop (`_drop_model`)."""

from __future__ import annotations

import asyncio
import functools
import logging
import queue
import threading
import traceback
from pathlib import Path
from typing import Any, Callable

import mlx.core as mx
import psutil

from .loading import LoadProgress
from .mailbox import Command, Mailbox, Stop, settle
from .memory_release import ACCOUNTING, Watched, release_memory, trim_native_heap
from .protocol import CacheStats, EngineError, LoadAborted, LoadResult, ReleaseResult, RequestAborted
from .threads import ENGINE_THREADS, Running

NOTHING_RELEASED = ReleaseResult(0, 0, 0, 0)
log = logging.getLogger(__name__)


def unloaded() -> RequestAborted:
    return RequestAborted("the model was unloaded", "model_unloaded")


class EngineWorker:
    thread_label = "engine"

    def __init__(self, model_id: str, path: Path):
        self.model_id = model_id
        self.path = Path(path)
        self.abort_load = False
        self.model_info: dict = {}
        self.load_progress = LoadProgress()     # the weight bytes read, for the pool's snapshot
        self.cache_stats = CacheStats()
        self._mailbox = Mailbox()
        self._thread: Running | None = None
        self._stop: Stop | None = None
        self._watched = Watched()      # the model and its weights, weakly: proof that a release let go
        self._idle_jobs: list[Callable[[], None]] = []   # run one at a time while no work waits (a warm-up)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.on_failed: Callable[[Any, str], None] | None = None   # (this engine, why), on the loop, once failed

    # ---- the event loop's side ----------------------------------------------------------------

    async def load(self, *, memory_free: threading.Event | None = None) -> LoadResult:
        """Load on an engine thread. With `memory_free`, everything but the weights is read first
        and the weights wait for it."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._thread = ENGINE_THREADS.start(functools.partial(self._run, loop, future, memory_free),
                                            name=f"{self.thread_label}:{self.model_id}")
        return await future

    async def stop(self, message: str = "the model was unloaded") -> ReleaseResult:
        """End every request, free the model and end the thread's job; returns what was measured."""
        if self._thread is None or not self._thread.is_alive():
            return NOTHING_RELEASED
        self._before_stop(message)
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if not self._mailbox.put(Stop(message, loop=loop, future=future)):
            return NOTHING_RELEASED
        result = await future
        # the thread still has to end its MLX streams; a process that exits first can abort
        await asyncio.to_thread(self._thread.join, 30)
        return result

    async def call(self, fn: Callable[[], Any]) -> Any:
        """Run fn on the engine thread between two pieces of work (MLX work that must not leave it)."""
        return await self._ask(fn)

    @property
    def warming(self) -> bool:
        """Shapes of the warm-up are still to run (warmup.py): a request now may meet a cold kernel."""
        return bool(self._idle_jobs)

    def trim_heap(self) -> None:
        """Hand freed heap pages back to the OS (from any thread)."""
        trim_native_heap()

    async def _ask(self, fn: Callable[[], Any]) -> Any:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if not self._mailbox.put(Command(fn, loop=loop, future=future)):
            raise unloaded()
        return await future

    def _post(self, fn: Callable[[], Any], *, refused: Callable[[BaseException], None] | None = None) -> bool:
        """Send fn without waiting for it; False when the thread has ended."""
        return self._mailbox.put(Command(fn, refused=refused))

    def _before_stop(self, message: str) -> None:
        """On the loop, as a stop is sent (an encoder fails its queued jobs here)."""

    # ---- the engine thread ----------------------------------------------------------------------

    def _run(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future,
             memory_free: threading.Event | None) -> None:
        self._loop = loop
        try:
            try:
                result = self._open(memory_free)
                if self.abort_load:
                    raise LoadAborted("load aborted: process memory pressure")
            except BaseException as e:  # noqa: BLE001 - reported to the waiting coroutine
                self._drop_after(e)
                settle(loop, future, error=e)
                return
            self._watched = self._watch()
            settle(loop, future, result)
            self._serve()
        finally:
            self._close()   # the thread then synchronizes and goes back to ENGINE_THREADS

    def _serve(self) -> None:
        try:
            stop = self._serve_until_stop()
            released = self._measured_release(stop.message)
        except Exception as e:  # noqa: BLE001 - past every request's own handling (a device error, say)
            self._end_failed(e)
            return
        self._stop = None
        stop.settle(released)

    def _serve_until_stop(self) -> Stop:
        while self._stop is None:
            self._take_commands(block=not (self._has_work() or self._has_idle_work()))
            while self._stop is None and (wait := self._admission_wait()) > 0:
                self._take_commands(block=True, timeout=wait)    # requests on their way join this step
            if self._stop is None and self._has_work():
                self._work()
            elif self._stop is None and self._has_idle_work():
                self._idle_step()     # a command or a request that came meanwhile went first
            self._after_commands()
        return self._stop

    def _end_failed(self, error: Exception) -> None:
        """The engine cannot go on: every request in flight gets an error now (without MLX, which may
        be what failed), the model is let go, and the pool is told, which unloads its entry."""
        log.exception("%s: the engine failed and ends", self.model_id)
        message = f"the engine failed: {type(error).__name__}: {error}"
        self._fail_in_flight(EngineError(message))
        try:
            self._drop_after(error)
        except Exception:
            log.exception("%s: letting the failed engine's model go failed", self.model_id)
        stop, self._stop = self._stop, None
        if stop is not None:      # an unload that came meanwhile finds nothing left to release
            stop.settle(NOTHING_RELEASED)
        if self.on_failed is not None and self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self.on_failed, self, message)
            except RuntimeError:   # the loop has closed: the process is ending
                pass

    def _drop_after(self, error: BaseException) -> None:
        """Drop the model after `error` and give its memory back. The traceback's frames (open_model's,
        a lane's) hold the model, and whoever keeps the error keeps them: they are cleared first."""
        traceback.clear_frames(error.__traceback__)
        self._drop_model()
        release_memory()

    def _has_idle_work(self) -> bool:
        return bool(self._idle_jobs)

    def _idle_step(self) -> None:
        """One piece of work that waits for the thread to be idle (a warm-up shape)."""
        self._idle_jobs.pop(0)()

    def _take_commands(self, block: bool, timeout: float | None = None) -> None:
        while True:
            try:
                command = self._mailbox.get(block=block, timeout=timeout)
            except queue.Empty:
                return
            block = False
            if isinstance(command, Stop):
                self._stop = command
                return
            command.execute()

    def _measured_release(self, message: str) -> ReleaseResult:
        with ACCOUNTING:          # no load fills weights while the fall is measured
            rss_before, active_before, cache_before = _rss(), mx.get_active_memory(), mx.get_cache_memory()
            held = self._held_bytes()
            self._release(message)
            self._drop_model()
            # only now, with _drop_model's frame gone: a local of it (a lane) held the whole model
            # while the cache was cleared, and the weights then sat in MLX's buffer cache
            release_memory()
            kept = self._watched.held_bytes()
            if kept:
                log.warning("%s: %d bytes of weights still held after the release, by %s", self.model_id,
                            kept, ", ".join(self._watched.holders()) or "nothing found")
            self._watched = Watched()
            return ReleaseResult(active_before, mx.get_active_memory(), rss_before, _rss(), held, kept,
                                 cache_before, mx.get_cache_memory())

    def _close(self) -> None:
        """Take no more commands and answer those still queued: a caller that raced the unload
        (the enforcer shrinking caches, a request arriving) gets an error, never a wait forever."""
        gone = unloaded()
        for command in self._mailbox.close():
            if isinstance(command, Stop):
                command.settle(NOTHING_RELEASED)
            else:
                command.refuse(gone)
        self._after_commands()

    # ---- what a kind of engine says ---------------------------------------------------------------

    def _open(self, memory_free: threading.Event | None) -> LoadResult:
        raise NotImplementedError

    def _has_work(self) -> bool:
        """Work to do between commands: the thread does not block on its mailbox meanwhile."""
        return False

    def _work(self) -> None:
        """One piece of that work (a decode step, say)."""

    def _admission_wait(self) -> float:
        """Seconds to wait for more commands before the next piece of work (requests on their way)."""
        return 0.0

    def _after_commands(self) -> None:
        """After each round of commands and work (a generator hands its output to the loop here)."""

    def _held_bytes(self) -> int:
        """What the model holds as it is released: weights, caches, KV."""
        return 0

    def _release(self, message: str) -> None:
        """End what runs before the model is dropped (requests, caches); synchronize MLX."""
        mx.synchronize()

    def _watch(self) -> Watched:
        """What a release must let go of: the model and its weights."""
        return Watched.of(getattr(self, "_model", None))

    def _fail_in_flight(self, error: EngineError) -> None:
        """Hand `error` to every request the engine holds, touching no MLX array (a failed engine)."""

    def _drop_model(self) -> None:
        """Let go of the model and everything that refers to it; the release (gc, the cache) follows."""
        self._idle_jobs = []


def _rss() -> int:
    return psutil.Process().memory_info().rss
