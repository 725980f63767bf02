"""The pool's event log and change listeners, in one place.

`changed(kind, model)` tells every listener (metrics, the enforcer's wake-up, the dashboard's
broadcaster) what changed; `record(...)` writes an event to the history (the ORM in production),
keeps the latest 50 for the live timeline, and announces it as a `Change.EVENT`."""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from .policy.vocabulary import ActionKind, Change, Reason

log = logging.getLogger(__name__)

RECENT_EVENTS = 50


@dataclass(frozen=True)
class PoolChange:
    kind: Change
    model: str | None = None                 # the model it concerns, where one does
    event: dict[str, Any] | None = field(default=None)   # the recorded event, for Change.EVENT


Listener = Callable[[PoolChange], None]
Recorder = Callable[..., Awaitable[Any]]     # async (**event fields) -> a row with .as_dict()


class EventLog:
    def __init__(self, *, recorder: Recorder | None = None, clock: Callable[[], float] = time.time):
        self.recorder = recorder
        self.clock = clock
        self.listeners: list[Listener] = []
        self.recent: deque[dict] = deque(maxlen=RECENT_EVENTS)   # newest last

    def subscribe(self, listener: Listener) -> None:
        self.listeners.append(listener)

    def changed(self, kind: Change, model: str | None = None) -> None:
        self._notify(PoolChange(kind, model))

    async def record(self, *, action: ActionKind, reason: Reason, model_id: str = "", **fields) -> dict:
        event = {"model_id": model_id, "action": action, "reason": reason, **fields}
        row = None
        if self.recorder is not None:
            try:
                row = await self.recorder(**event)
            except Exception:  # noqa: BLE001 - history must never break serving
                log.exception("could not record event %s", reason)
        recorded = row.as_dict() if row is not None else {"model": model_id or None, "time": self.clock(),
                                                          **{k: v for k, v in event.items() if k != "model_id"}}
        self.recent.append(recorded)
        self._notify(PoolChange(Change.EVENT, model_id or None, recorded))
        return recorded

    def remember(self, events_oldest_first: list[dict]) -> None:
        """The history's latest rows at start-up, so the timeline is not empty after a restart."""
        self.recent.extend(events_oldest_first)

    def _notify(self, change: PoolChange) -> None:
        for listener in list(self.listeners):
            listener(change)
