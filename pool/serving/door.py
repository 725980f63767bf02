"""The serving door: the one way a request reaches a model's engine on this host, whatever its kind.

`acquire` is every request's path in: find the model, check it is of the kind the request needs,
refuse at once when its queue is full, pass the request gate (memory pressure), lease the model
(loading it, evicting others, if needed), take one of its concurrency slots (slots.py), and make
sure it was not unloaded meanwhile. The completion and embedding paths (completion.py,
embedding.py) share it; `engine_errors` is the one mapping of an engine's errors to the core's."""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Iterator

from ..catalog.kinds import Kind
from ..engines.protocol import EngineError, RequestAborted
from ..errors import Busy, EngineFailure, ModelQueueFull, WrongKind
from ..host.engine_pool import EnginePool
from ..host.entries import Entry
from ..host.gate import RequestGate
from ..policy.vocabulary import Change, ModelState, Phase, Rejection
from ..traces.trace import current as current_trace
from .slots import REQUEST_KEY, ModelSlots


@dataclass(frozen=True)
class Lease:
    """A model held for one request: its entry and its engine (of the kind asked for)."""
    entry: Entry
    engine: Any


@contextmanager
def engine_errors() -> Iterator[None]:
    """An engine's errors as the core's: an abort (an unload, the enforcer, a shutdown) is Busy with
    the abort's code; any other failure an EngineFailure (never a traceback for the client)."""
    try:
        yield
    except RequestAborted as e:
        raise Busy(f"The request was aborted: {e}", code=e.code) from None
    except EngineError as e:
        raise EngineFailure(f"The engine failed: {e}") from None


class Door:
    def __init__(self, pool: EnginePool, gate: RequestGate):
        self.pool = pool
        self.gate = gate
        self.slots = ModelSlots(limit=pool.conf.max_concurrent, queue_limit=pool.conf.queue_per_model,
                                share=pool.conf.key_share,
                                on_change=lambda model_id: pool.events.changed(Change.QUEUE, model_id))

    def entry(self, model_id: str, kind: Kind) -> Entry:
        """The model, when it is of `kind`; a WrongKind error at once otherwise, before any wait."""
        entry = self.pool.entry(model_id)
        if not entry.kind.takes(kind):
            others = sorted(e.alias or e.id for e in self.pool.entries.values() if e.kind.takes(kind) and not e.hidden)
            raise WrongKind(model=entry.alias or entry.id, kind=entry.kind.name, noun=entry.kind.noun,
                            wanted=kind.name, wanted_noun=kind.noun, alternatives=others)
        return entry

    @asynccontextmanager
    async def acquire(self, model_id: str, kind: Kind, *, keep_alive: float | None = None, slot: bool = True,
                      check: Callable[[Entry], None] | None = None) -> AsyncIterator[Lease]:
        """Hold the model for one request (see the module's docstring). `check` runs on the entry
        before any wait (a prompt too long for the model, say); `slot=False` takes no concurrency
        slot (counting tokens generates nothing). The request's trace, if any, notes its waits."""
        trace, key = current_trace.get(), REQUEST_KEY.get()
        if trace is not None:
            trace.model, trace.host, trace.task = model_id, self.pool.conf.host_id, asyncio.current_task()
        entry = self.entry(model_id, kind)
        if check is not None:
            check(entry)
        if slot:
            self._refuse_if_queue_full(entry.id, key)
        waited = time.perf_counter()
        await self.gate.admit()
        if trace is not None:
            trace.body_cap = int(entry.model_settings.get("trace_body_bytes") or 0)
            trace.admission_s, waited = time.perf_counter() - waited, time.perf_counter()
            if entry.state != ModelState.LOADED:
                trace.phase, trace.load_model = Phase.LOADING, entry.id
        async with self.pool.lease(entry.id, keep_alive=keep_alive) as engine:
            if trace is not None:
                if trace.load_model is not None:
                    trace.load_s, trace.phase = time.perf_counter() - waited, Phase.QUEUED
                waited = time.perf_counter()
            # The slot is taken after the lease. A request queues only while the model runs its
            # limit, whose leases keep it loaded anyway, so a queued request's lease neither loads
            # the model nor keeps it busy longer than its running requests do. Taken before the
            # lease, each hand-over would leave the model unleased until the waiter ran: free for
            # the enforcer or another model's load to evict, and for the waiter to reload (evictions
            # in a loop). Unwinding hands the slot on before this request's lease ends.
            if slot:
                await self._take_slot(entry.id, key)
            if trace is not None and slot:
                trace.slot_s = time.perf_counter() - waited
            try:
                if entry.engine is not engine:
                    raise Busy(f"The model '{entry.id}' was unloaded while the request waited; retry.",
                               code="model_unloaded")
                with engine_errors():
                    yield Lease(entry, engine)
            finally:
                if slot:
                    self.slots.release(entry.id, key)

    def _refuse_if_queue_full(self, model_id: str, key: str | None) -> None:
        try:
            self.slots.check(model_id, key)
        except ModelQueueFull:
            self.gate.on_reject(Rejection.MODEL_QUEUE_FULL)
            raise

    async def _take_slot(self, model_id: str, key: str | None) -> None:
        try:
            await self.slots.acquire(model_id, key)
        except ModelQueueFull:                  # filled up while this request was loading the model
            self.gate.on_reject(Rejection.MODEL_QUEUE_FULL)
            raise
