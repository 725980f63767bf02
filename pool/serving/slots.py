"""Per-model concurrency: at most OMLX_MAX_CONCURRENT requests of one model run at once; up to
OMLX_QUEUE_PER_MODEL more wait for a slot; a request beyond that is a 503. Each request is counted
by its API key: while others wait, one key holds at most OMLX_KEY_SHARE of the slots (a freed slot
goes to the first waiter whose key runs less than that) and of the queue places (policy.concurrency).

A slot given back goes straight to a waiter (the running count never dips while anyone waits, so a
newcomer cannot overtake the queue). Cancellation-safe: a waiter cancelled while it waits leaves the
queue; one cancelled just as a slot reached it passes the slot on."""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Callable

from ..errors import ModelQueueFull
from ..policy.concurrency import next_waiter, share_cap, slot_decision
from ..policy.vocabulary import SlotDecision

# A full queue drains at the model's pace: a short hint, which the SDKs' backoff spreads out.
RETRY_AFTER_SECONDS = 2

# The API key (its name) of the request being served; None on an open server. api/key_limits sets it.
REQUEST_KEY: ContextVar[str | None] = ContextVar("omlx_request_key", default=None)


@dataclass(eq=False)
class _Waiter:
    key: str | None
    future: asyncio.Future


class _Model:
    def __init__(self):
        self.running: Counter[str | None] = Counter()     # by key
        self.waiters: deque[_Waiter] = deque()

    def queued(self, key: str | None = None, *, every: bool = True) -> int:
        return sum(not w.future.done() and (every or w.key == key) for w in self.waiters)


class ModelSlots:
    def __init__(self, *, limit: int, queue_limit: int, share: float = 1.0,
                 on_change: Callable[[str], None] | None = None):
        self.limit = limit                   # 0 = no limit
        self.queue_limit = queue_limit
        self.share = share
        self.on_change = on_change or (lambda model_id: None)
        self._models: dict[str, _Model] = {}

    def counts(self, model_id: str) -> tuple[int, int]:
        """(running, queued) of one model."""
        m = self._models.get(model_id)
        return (m.running.total(), m.queued()) if m else (0, 0)

    def check(self, model_id: str, key: str | None = None) -> None:
        """Refuse, at once, a request that would find the model's queue (or its key's share) full."""
        if (decision := self._decide(model_id, key)) in (SlotDecision.REFUSE, SlotDecision.OVER_SHARE):
            raise self._full(model_id, key, decision)

    @asynccontextmanager
    async def hold(self, model_id: str, key: str | None = None):
        await self.acquire(model_id, key)
        try:
            yield
        finally:
            self.release(model_id, key)

    async def acquire(self, model_id: str, key: str | None = None) -> None:
        m = self._models.setdefault(model_id, _Model())
        decision = self._decide(model_id, key)
        if decision in (SlotDecision.REFUSE, SlotDecision.OVER_SHARE):
            raise self._full(model_id, key, decision)
        if decision == SlotDecision.RUN:
            m.running[key] += 1
            self.on_change(model_id)
            return
        waiter = _Waiter(key, asyncio.get_running_loop().create_future())
        m.waiters.append(waiter)
        self.on_change(model_id)
        try:
            await waiter.future
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():
                self.release(model_id, key)  # the slot reached us as we were cancelled: pass it on
            elif waiter in m.waiters:         # (a release may have dropped it already)
                m.waiters.remove(waiter)
                self.on_change(model_id)
            raise

    def release(self, model_id: str, key: str | None = None) -> None:
        m = self._models[model_id]
        m.running[key] -= 1
        live = [w for w in m.waiters if not w.future.done()]   # a cancelled one stays until its task runs
        if live:
            chosen = live[next_waiter([w.key for w in live], m.running, limit=self.limit, share=self.share)]
            m.waiters.remove(chosen)
            chosen.future.set_result(None)    # the slot changes hands: the running total stays as it is
            m.running[chosen.key] += 1
        else:
            m.waiters.clear()
        m.running = +m.running                # drop keys that run nothing
        self.on_change(model_id)

    def _decide(self, model_id: str, key: str | None) -> SlotDecision:
        m = self._models.get(model_id) or _Model()
        return slot_decision(running=m.running.total(), queued=m.queued(), limit=self.limit,
                             queue_limit=self.queue_limit, key_queued=m.queued(key, every=False),
                             share=self.share, keyed=key is not None)

    def _full(self, model_id: str, key: str | None, decision: SlotDecision) -> ModelQueueFull:
        running, queued = self.counts(model_id)
        if decision == SlotDecision.OVER_SHARE:
            cap = share_cap(self.queue_limit, self.share)
            return ModelQueueFull(f"The API key '{key}' already has {cap} requests queued for the model '{model_id}', "
                                  f"its share of the queue (OMLX_KEY_SHARE); retry shortly.",
                                  retry_after=RETRY_AFTER_SECONDS, running=running, queued=queued)
        return ModelQueueFull(f"The model '{model_id}' is running {running} requests (OMLX_MAX_CONCURRENT) and "
                              f"{queued} more are queued (OMLX_QUEUE_PER_MODEL); retry shortly.",
                              retry_after=RETRY_AFTER_SECONDS, running=running, queued=queued)
