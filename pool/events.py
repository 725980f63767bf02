"""The pool's event log and change listeners, in one place.

`changed(kind, model)` tells every listener (metrics, the enforcer's wake-up, the dashboard's
broadcaster) what changed; `record(...)` writes an event to the history (the ORM in production),
keeps the latest 50 for the live timeline, and announces it as a `Change.EVENT`.

The history is the server's own write: an event the database cannot take now (locked by another
process, disk full, read-only) is kept in memory, in order and with its own time, and written when
the database takes writes again (retried every RETRY_SECONDS). At most MAX_PENDING wait; beyond
that the oldest are dropped and counted. The fault and the recovery are reported once, through
pool/storage.py (a log line, a `storage_fault` / `storage_recovered` event, the storage_* gauges)."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable

from . import storage
from .policy.vocabulary import ActionKind, Change, Reason

log = logging.getLogger(__name__)

RECENT_EVENTS = 50
MAX_PENDING = 1000        # history rows kept in memory while the database refuses them
RETRY_SECONDS = 1.0


@dataclass(frozen=True)
class PoolChange:
    kind: Change
    model: str | None = None                 # the model it concerns, where one does
    event: dict[str, Any] | None = field(default=None)   # the recorded event, for Change.EVENT


Listener = Callable[[PoolChange], None]
Recorder = Callable[..., Awaitable[Any]]     # async (**event fields) -> a row with .as_dict()


class EventLog:
    def __init__(self, *, recorder: Recorder | None = None, clock: Callable[[], float] = time.time,
                 health: storage.StorageHealth | None = None, host: str = ""):
        self.recorder = recorder
        self.host = host            # every row names the host it happened on (a fleet shares the history)
        self.clock = clock
        self.health = health if health is not None else storage.health
        self.listeners: list[Listener] = []
        self.recent: deque[dict] = deque(maxlen=RECENT_EVENTS)   # newest last
        # (event, as shown) the history could not take yet, oldest first
        self.pending: deque[tuple[dict, dict]] = deque()
        self._drainer: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task] = set()

    def subscribe(self, listener: Listener) -> None:
        self.listeners.append(listener)

    def changed(self, kind: Change, model: str | None = None) -> None:
        self._notify(PoolChange(kind, model))

    async def record(self, *, action: ActionKind, reason: Reason, model_id: str = "", **fields) -> dict:
        self._loop = asyncio.get_running_loop()
        event = {"model_id": model_id, "action": action, "reason": reason, **fields,
                 "created_at": datetime.fromtimestamp(self.clock(), timezone.utc)}
        if self.host:
            event["host"] = self.host
        recorded = await self._store(event)
        self.recent.append(recorded)
        self._notify(PoolChange(Change.EVENT, model_id or None, recorded))
        return recorded

    # ---- the history's writes: now, or kept and written later ---------------------------------

    async def _store(self, event: dict) -> dict:
        """The event as shown: its row's, or `stored: false` while it waits to be written."""
        if self.recorder is None:
            return _shown(event)
        if self.pending:              # the history is behind: keep the order, do not wait again
            return self._keep(event)
        try:
            row = await self.recorder(**event)
        except Exception as e:  # noqa: BLE001 - history must never break serving
            return self._keep(event) if self._failed(e, event) else _shown(event)
        self.health.succeeded(storage.Component.DATABASE)
        return row.as_dict() if row is not None else _shown(event)

    def _failed(self, error: Exception, event: dict) -> bool:
        """Report a failed write; True when it is storage's (keep the row), False for a row the
        database refuses for another reason (logged and dropped: a retry would fail the same)."""
        fault = storage.classify(error)
        if fault is None:
            log.error("could not record event %s: %s", event["reason"], error, exc_info=error)
            return False
        self.health.failed(storage.Component.DATABASE, fault, f"the event history: {error}")
        return True

    def _keep(self, event: dict) -> dict:
        if len(self.pending) >= MAX_PENDING:
            self.pending.popleft()
            self.health.dropped(storage.Component.DATABASE,
                                why=f"more than {MAX_PENDING} history rows wait for the database")
        shown = {**_shown(event), "stored": False}
        self.pending.append((event, shown))
        self.health.set_pending(storage.Component.DATABASE, len(self.pending))
        if self._drainer is None or self._drainer.done():
            self._drainer = _detached(self._drain())
        return shown

    async def _drain(self) -> None:
        while self.pending:
            await asyncio.sleep(RETRY_SECONDS)
            await self.write_pending()

    async def write_pending(self) -> int:
        """Write the kept events, oldest first, until one fails; how many were written. The live
        timeline's copy of each then shows its row (id, `stored` gone)."""
        written = 0
        while self.pending and self.recorder is not None:
            event, shown = self.pending[0]
            try:
                row = await self.recorder(**event)
            except Exception as e:  # noqa: BLE001
                if self._failed(e, event):
                    break
            else:
                written += 1
                shown.pop("stored", None)
                if row is not None:
                    shown.update(row.as_dict())
            self.pending.popleft()
        self.health.set_pending(storage.Component.DATABASE, len(self.pending))
        if written and not self.pending:
            self.health.succeeded(storage.Component.DATABASE, f"{written} history rows written late")
        return written

    def unstored(self) -> list[dict]:
        """The kept events as the API shows them (newest first), not yet in the database."""
        return [dict(shown) for _, shown in reversed(self.pending)]

    async def close(self) -> None:
        """At shutdown: one last try for the kept events; what remains is lost, and said so."""
        if self._drainer is not None:
            self._drainer.cancel()
            await asyncio.gather(self._drainer, return_exceptions=True)
            self._drainer = None
        if self.pending and self.recorder is not None:
            await self.write_pending()
        if self.pending:
            self.health.dropped(storage.Component.DATABASE, len(self.pending),
                                why=f"{len(self.pending)} history rows could not be written before shutdown")
            for _, shown in self.pending:
                log.error("history row lost at shutdown: %s", shown)
            self.pending.clear()

    # ---- storage faults as events --------------------------------------------------------------

    def watch_storage(self, health: storage.StorageHealth | None = None) -> None:
        """Record the data folder's faults and recoveries as events (call on the loop)."""
        self._loop = asyncio.get_running_loop()
        (health or self.health).subscribe(self._on_storage_change)

    def _on_storage_change(self, change: storage.StorageChange) -> None:
        """From any thread (an engine's spill, a request's settings write): recorded on the loop."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        reason = Reason.STORAGE_RECOVERED if change.fault is None else Reason.STORAGE_FAULT
        event = {"action": ActionKind.STORAGE, "reason": reason, "detail": change.text[:500]}
        loop.call_soon_threadsafe(self._record_detached, event)

    def _record_detached(self, event: dict) -> None:
        task = _detached(self.record(**event))
        self._tasks.add(task)             # the loop holds tasks weakly
        task.add_done_callback(self._tasks.discard)

    def remember(self, events_oldest_first: list[dict]) -> None:
        """The history's latest rows at start-up, so the timeline is not empty after a restart."""
        self.recent.extend(events_oldest_first)

    def _notify(self, change: PoolChange) -> None:
        for listener in list(self.listeners):
            listener(change)


def _detached(coro) -> asyncio.Task:
    """A task outside the request that started it: its ORM calls must not run on (or outlive) that
    request's thread."""
    return asyncio.get_running_loop().create_task(coro, context=contextvars.Context())


def _shown(event: dict) -> dict:
    """An event as `as_dict()` shows a row, for one the history has not stored."""
    shown = {k: v for k, v in event.items() if k not in ("model_id", "created_at")}
    return {"model": event["model_id"] or None, "time": event["created_at"].timestamp(), **shown}
