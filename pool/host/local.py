"""LocalHost: this process as a host (protocol.Host): its engine pool, the request gate, the serving
door and the memory enforcer, wired together. Tests build one over fake engines and a fake probe
(tests/fakes.py); the runtime builds the real one (pool/runtime.py)."""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

from ..catalog.kinds import Kind
from ..events import EventLog, PoolChange
from ..memory import MemoryReading
from ..policy.load_plan import LoadPlan
from ..policy.vocabulary import Change
from ..serving import completion, embedding
from ..serving.door import Door
from .enforcer import MemoryEnforcer
from .engine_pool import EngineMaker, EnginePool, make_engine
from .entries import Entry
from .gate import RequestGate
from .pressure_actions import PressureActions
from .snapshot import build as build_snapshot

# Pool changes that move memory: the enforcer looks at once. Not a request's start or end (its KV
# growth wakes it, by steps), not its own ticks and events. A request's end moves the TTL clock:
# the enforcer re-reads when the next idle model expires, without a tick.
WAKES_ENFORCER = frozenset({Change.LOAD_START, Change.LOAD_END, Change.UNLOAD, Change.SETTINGS, Change.KV_GROWTH})
RESCHEDULES_ENFORCER = frozenset({Change.REQUEST_END})


class LocalHost:
    def __init__(self, conf, probe, *, events: EventLog | None = None, host_id: str | None = None,
                 clock: Callable[[], float] = time.time, engine_maker: EngineMaker = make_engine,
                 telemetry: Any = None, on_reject: Callable[[str], None] | None = None):
        self.host_id = host_id or conf.host_id
        self.conf = conf
        self.probe = probe
        self.pool = EnginePool(conf, probe, clock=clock, events=events, engine_maker=engine_maker)
        self.events = self.pool.events
        self.gate = RequestGate(conf, probe, on_reject=on_reject)
        self.door = Door(self.pool, self.gate)
        self.actions = PressureActions(self.pool)
        self.enforcer = MemoryEnforcer(self.pool, self.actions, probe, self.gate, telemetry=telemetry)
        self.events.subscribe(self._on_change)

    def _on_change(self, change: PoolChange) -> None:
        if change.kind in WAKES_ENFORCER:
            self.enforcer.wake()
        elif change.kind in RESCHEDULES_ENFORCER:
            self.enforcer.reschedule()

    # ---- the models ----------------------------------------------------------------------------

    def models(self) -> Iterable[Entry]:
        return list(self.pool.entries.values())

    def apply_model_settings(self, model_id: str, values: dict[str, Any]) -> None:
        self.pool.apply_model_settings(model_id, values)

    def rediscover(self) -> None:
        self.pool.rediscover()

    async def load(self, model_id: str) -> Entry:
        return await self.pool.load(model_id)

    async def unload(self, model_id: str, *, force: bool = False) -> Entry:
        return await self.pool.unload(model_id, force=force)

    def plan(self, model_id: str) -> LoadPlan:
        return self.pool.plan(model_id)

    # ---- requests ------------------------------------------------------------------------------

    def lease(self, model_id: str, kind: Kind, *, keep_alive: float | None = None):
        return self.door.acquire(model_id, kind, keep_alive=keep_alive)

    async def generate(self, model_id: str, spec: completion.CompletionSpec) -> completion.Completion:
        return await completion.open_completion(self.door, model_id, spec)

    async def count_tokens(self, model_id: str, spec: completion.CompletionSpec) -> int:
        return await completion.count_tokens(self.door, model_id, spec)

    async def embed(self, model_id: str, spec: embedding.EmbeddingSpec) -> embedding.Embeddings:
        return await embedding.embed(self.door, model_id, spec)

    # ---- state ---------------------------------------------------------------------------------

    def memory(self) -> MemoryReading:
        return self.probe.read()

    def state(self) -> dict[str, Any]:
        """The snapshot (snapshot.py): every model, memory, the enforcer's lines, the recent events."""
        return build_snapshot(self.pool, self.door.slots, self.probe.read(), self.enforcer.state())

    async def tick(self):
        """One enforcer tick now (operators' "check now")."""
        return await self.enforcer.tick(on_demand=True)

    # ---- start and stop ------------------------------------------------------------------------

    async def start(self) -> None:
        self.enforcer.start()
        if not self.conf.fleet:     # in a fleet, pins are kept on one host of the fleet (pool/fleet/pins.py)
            await self.pool.preload_pinned()

    def end_requests(self, message: str, code: str) -> None:
        self.pool.end_requests(message, code)

    async def stop(self) -> None:
        await self.enforcer.stop()
        await self.pool.shutdown()
