"""Engine threads, kept and reused across loads.

MLX gives every thread that evaluates something a stream served by a native worker thread, and that
worker outlives the Python thread, mx.clear_streams() or not (measured with mlx 0.32.4: 40 short-lived
threads that each evaluated one array left 40 native threads behind, each holding its stack and its
allocators' caches). With a new thread per load, the 15-minute soak's 330 loads grew resident memory
by ~120 MB beside MLX's. So an engine runs on a thread taken from the idle ones (or a new one when
none is idle), and the thread goes back once the engine has ended (after mx.synchronize()); the number
of threads is the most engines that ever ran at once. A thread ends, with mx.clear_streams() (without
which ~13% of processes abort at exit), only when the process exits."""

from __future__ import annotations

import atexit
import logging
import queue
import threading
from typing import Callable

import mlx.core as mx

log = logging.getLogger("pool")


class Running:
    """One job on an engine thread: what `threading.Thread` offered the engines (is_alive, join)."""

    def __init__(self):
        self._done = threading.Event()

    def is_alive(self) -> bool:
        return not self._done.is_set()

    def join(self, timeout: float | None = None) -> None:
        self._done.wait(timeout)

    def finish(self) -> None:
        self._done.set()


class _Worker:
    def __init__(self, threads: "EngineThreads", number: int):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = threads
        self.idle_name = f"engine-thread-{number}"
        self.thread = threading.Thread(target=self._loop, name=self.idle_name, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while (job := self.jobs.get()) is not None:
            fn, name, running = job
            self.thread.name = name
            try:
                fn()
                mx.synchronize()
            except BaseException:
                log.exception("%s ended with an error", name)
            self.thread.name = self.idle_name
            job = fn = None       # the job's engine must not stay referenced while the thread idles
            running.finish()
            self._threads._idle_again(self)
        mx.synchronize()
        mx.clear_streams()


class EngineThreads:
    def __init__(self):
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._all: list[_Worker] = []

    def start(self, fn: Callable[[], None], name: str) -> Running:
        """Run `fn` on an idle engine thread, or on a new one."""
        running = Running()
        with self._lock:
            worker = self._idle.pop() if self._idle else None
            if worker is None:
                worker = _Worker(self, len(self._all) + 1)
                self._all.append(worker)
        worker.jobs.put((fn, name, running))
        return running

    @property
    def count(self) -> int:
        return len(self._all)

    def _idle_again(self, worker: _Worker) -> None:
        with self._lock:
            self._idle.append(worker)

    def end_idle(self, timeout: float = 5.0) -> None:
        """End the idle threads (each clears its MLX streams); a busy one is left to the exit."""
        with self._lock:
            idle, self._idle = self._idle, []
            for worker in idle:
                self._all.remove(worker)
        for worker in idle:
            worker.jobs.put(None)
        for worker in idle:
            worker.thread.join(timeout)


ENGINE_THREADS = EngineThreads()
atexit.register(ENGINE_THREADS.end_idle)
