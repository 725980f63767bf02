"""This process's traces: the in-flight ones by id (their phases, cancel), the last RECENT finished
ones (the websocket's; a fleet record carries the newest PUBLISHED), the writer thread, and the
metrics a finished trace feeds. Everything here runs on the event loop and takes no lock and no
I/O: `end` hands the row to the writer's queue.

It listens to the pool's changes to join a load to the request that started it: the load's task,
and the unloads it makes room with, run in a copy of that request's context, so the trace is the
current one when the load starts and when each unload's history row is recorded."""

from __future__ import annotations

import time
from collections import deque
from itertools import islice
from typing import Any, Callable

from ..events import PoolChange
from ..policy.vocabulary import ActionKind, Change
from .trace import Trace, current
from .writer import TraceWriter

RECENT = 50
PUBLISHED = 20      # the finished requests a fleet record carries


class Traces:
    def __init__(self, settings, *, metrics: Any = None, on_change: Callable[[], None] | None = None):
        self.enabled = bool(settings.traces)
        self.in_flight: dict[str, Trace] = {}
        self.recent: deque[dict] = deque(maxlen=RECENT)     # newest first
        self.writer = TraceWriter(max_rows=settings.trace_rows, max_days=settings.trace_days)
        self.metrics = metrics
        self._listeners: list[Callable[[], None]] = [on_change] if on_change is not None else []

    def watch(self, listener: Callable[[], None]) -> None:
        """Call `listener` (on the event loop, no arguments) whenever a request begins, ends or is cancelled."""
        self._listeners.append(listener)

    def _changed(self) -> None:
        for listener in self._listeners:
            listener()

    # ---- a request's life ----------------------------------------------------------------------

    def begin(self, *, route: str, dialect: str, key: str | None) -> Trace | None:
        """A new trace, made the current request's; None when traces are off."""
        if not self.enabled:
            return None
        trace = Trace(route=route, dialect=dialect, key=key)
        self.in_flight[trace.id] = trace
        current.set(trace)
        return trace

    def end(self, trace: Trace, *, status: int | None, request_body: bytes | None = None) -> None:
        """The request has been answered (or its client went away): out of the in-flight ones, and
        kept if it reached a model."""
        if self.in_flight.pop(trace.id, None) is None:
            return                                   # ended already
        if trace.status is None:
            trace.status = status
        trace.finish()
        if trace.model is None:
            return
        if trace.body_cap and request_body is not None:
            trace.request_body = request_body[:trace.body_cap].decode(errors="replace")
            trace.truncated = trace.truncated or len(request_body) > trace.body_cap
        row = trace.as_dict(body=True)
        self.recent.appendleft({k: v for k, v in row.items() if k != "body"})
        self.writer.submit(row)
        if self.metrics is not None:
            self.metrics.request_traced(model=trace.model, key=trace.key or "", ttft=trace.ttft_s,
                                        queue_wait=trace.queue_s, decode_tps=trace.decode_tps,
                                        draft=(trace.draft_proposed, trace.draft_accepted))
        self._changed()

    # ---- reading and acting ----------------------------------------------------------------------

    def live(self) -> list[dict]:
        """The in-flight traces that reached a model, oldest first."""
        return [t.as_dict() for t in list(self.in_flight.values()) if t.model is not None]

    def find(self, trace_id: str) -> Trace | None:
        trace = self.in_flight.get(trace_id)
        return trace if trace is not None and trace.model is not None else None

    def recent_one(self, trace_id: str) -> dict | None:
        return next((row for row in self.recent if row["id"] == trace_id), None)

    def cancel(self, trace_id: str) -> bool:
        trace = self.find(trace_id)
        if trace is None:
            return False
        trace.cancel()
        self._changed()
        return True

    def message(self) -> dict:
        """The websocket's `requests` message (docs/api.md#requests)."""
        return {"type": "requests", "time": time.time(), "in_flight": self.live(), "recent": list(self.recent)}

    def published(self, *, recent: int = PUBLISHED) -> dict:
        """This host's requests in its fleet record (docs/api.md#requests): the in-flight ones and the
        newest finished ones, as the `requests` message gives them, so every host's console shows them."""
        return {"in_flight": self.live(), "recent": list(islice(self.recent, recent))}

    def stats(self) -> dict:
        """The writer's counts: written, waiting, and lost (the queue full, or a write that failed)."""
        w = self.writer
        return {"written": w.written, "pending": w.pending, "dropped": w.dropped, "failed": w.failed}

    @property
    def busy(self) -> bool:
        return any(t.model is not None for t in list(self.in_flight.values()))

    # ---- loads and their evictions ---------------------------------------------------------------

    def on_pool_change(self, change: PoolChange) -> None:
        if change.kind == Change.REQUEST_START:
            self._changed()               # a request reached a model: the live list has one more
            return
        if change.kind not in (Change.LOAD_START, Change.EVENT):
            return
        trace = current.get()
        if trace is None or trace.model is None:
            return
        if change.kind == Change.LOAD_START and change.model == trace.model:
            trace.load_started, trace.load_model = True, change.model
            return
        event = change.event or {}
        if (change.kind == Change.EVENT and event.get("action") == ActionKind.UNLOAD and event.get("id") is not None
                and event.get("requested_by") == trace.model and trace.load_started):
            trace.evictions.append(event["id"])

    def close(self) -> None:
        self.writer.close()
