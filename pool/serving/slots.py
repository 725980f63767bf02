"""Per-model concurrency: at most OMLX_MAX_CONCURRENT requests of one model run at once; up to
OMLX_QUEUE_PER_MODEL more wait for a slot, first come first served; a request beyond that is a 503.

A slot given back goes straight to the first waiter (the running count never dips while anyone
waits, so a newcomer cannot overtake the queue). Cancellation-safe: a waiter cancelled while it
waits leaves the queue; one cancelled just as a slot reached it passes the slot on."""

from __future__ import annotations

import asyncio
from collections import deque
from contextlib import asynccontextmanager
from typing import Callable

from ..errors import ModelQueueFull
from ..policy.concurrency import slot_decision
from ..policy.vocabulary import SlotDecision

# A full queue drains at the model's pace: a short hint, which the SDKs' backoff spreads out.
RETRY_AFTER_SECONDS = 2


class _Model:
    def __init__(self):
        self.running = 0
        self.waiters: deque[asyncio.Future] = deque()


class ModelSlots:
    def __init__(self, *, limit: int, queue_limit: int, on_change: Callable[[str], None] | None = None):
        self.limit = limit                   # 0 = no limit
        self.queue_limit = queue_limit
        self.on_change = on_change or (lambda model_id: None)
        self._models: dict[str, _Model] = {}

    def counts(self, model_id: str) -> tuple[int, int]:
        """(running, queued) of one model."""
        m = self._models.get(model_id)
        return (m.running, sum(not w.done() for w in m.waiters)) if m else (0, 0)

    def check(self, model_id: str) -> None:
        """Refuse, at once, a request that would find the model's queue full."""
        if self._decide(model_id) == SlotDecision.REFUSE:
            raise self._full(model_id)

    @asynccontextmanager
    async def hold(self, model_id: str):
        await self.acquire(model_id)
        try:
            yield
        finally:
            self.release(model_id)

    async def acquire(self, model_id: str) -> None:
        m = self._models.setdefault(model_id, _Model())
        decision = self._decide(model_id)
        if decision == SlotDecision.REFUSE:
            raise self._full(model_id)
        if decision == SlotDecision.RUN:
            m.running += 1
            self.on_change(model_id)
            return
        waiter = asyncio.get_running_loop().create_future()
        m.waiters.append(waiter)
        self.on_change(model_id)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(model_id)       # the slot reached us as we were cancelled: pass it on
            elif waiter in m.waiters:         # (a release may have dropped it already)
                m.waiters.remove(waiter)
                self.on_change(model_id)
            raise

    def release(self, model_id: str) -> None:
        m = self._models[model_id]
        while m.waiters:
            waiter = m.waiters.popleft()
            if not waiter.done():            # a cancelled one is still queued until its task runs
                waiter.set_result(None)      # the slot changes hands: running stays as it is
                self.on_change(model_id)
                return
        m.running -= 1
        self.on_change(model_id)

    def _decide(self, model_id: str) -> SlotDecision:
        running, queued = self.counts(model_id)
        return slot_decision(running=running, queued=queued, limit=self.limit, queue_limit=self.queue_limit)

    def _full(self, model_id: str) -> ModelQueueFull:
        running, queued = self.counts(model_id)
        return ModelQueueFull(f"The model '{model_id}' is running {running} requests (OMLX_MAX_CONCURRENT) and "
                              f"{queued} more are queued (OMLX_QUEUE_PER_MODEL); retry shortly.",
                              retry_after=RETRY_AFTER_SECONDS, running=running, queued=queued)
