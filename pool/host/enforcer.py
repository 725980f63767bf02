"""MemoryEnforcer: measure -> policy decide -> act through the pressure verbs -> record -> publish.

The loop is thin: every decision comes from pool.policy.pressure, and every action is a verb of
PressureActions (pressure_actions.py). Each tick also runs the pool's TTL pass. It polls every 1 s
while anything happens, 10 s with only idle models, 30 s with none. `wake()` cuts the sleep short
for what moves memory (loads, unloads, settings, a request's KV growing by a step: the runtime
says which changes); a wake during a tick is its own actions' echo and is ignored. `reschedule()`
re-reads the next TTL expiry without a tick (a request ended). Telemetry gets at most one row per
ACTIVE_POLL_SECONDS while the pressure level holds. The request gate is its own part (gate.py): the
enforcer only opens and closes it."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

from ..memory import memory_lines
from ..policy.pressure import (
    ACTIVE_POLL_SECONDS,
    EMPTY_POLL_SECONDS,
    Lines,
    Readings,
    TickDecision,
    cache_over_bound,
    classify,
    decide,
    poll_interval,
)
from ..policy.units import format_bytes
from ..policy.vocabulary import ActionKind, Change, Level, ModelState, Reason
from .engine_pool import EnginePool
from .gate import RequestGate
from .pressure_actions import PressureActions

log = logging.getLogger(__name__)

MIN_TICK_GAP = 0.01
TRIM_ROW_SECONDS = 60.0


class MemoryEnforcer:
    def __init__(self, pool: EnginePool, actions: PressureActions, probe, gate: RequestGate, *, telemetry=None):
        self.pool = pool
        self.actions = actions
        self.probe = probe
        self.gate = gate
        self.conf = pool.conf
        self.telemetry = telemetry
        self.level = Level.OK
        self.over_ceiling_polls = 0
        self.interval = EMPTY_POLL_SECONDS
        self.lines: Lines | None = None
        self.last_reading = None
        self.last_tick_at: float | None = None
        self.ticks = 0
        self._woken_at: float | None = None
        self._woken = False               # a wake (not a reschedule) arrived since the last tick
        self._ticking = False
        self._row_at: float | None = None    # when telemetry last got a row (time.monotonic)
        self._row_level: str | None = None   # the pressure level of that row
        self._trim_row_at: float | None = None   # when a trim at ok last left a history row
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._tick_lock: asyncio.Lock | None = None

    # ---- the loop ----------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            # MLX keeps its cache within the bound itself; a tick clears it only past that (pressure,
            # or what the bound let through)
            self.actions.bound_mlx_cache(self._cache_max())
            self._wake = asyncio.Event()
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        if self.telemetry is not None:
            self.telemetry.flush()

    def wake(self) -> None:
        """Tick now: something moved memory. Ignored during a tick (its own actions' echo)."""
        if self._ticking:
            return
        self._woken_at = time.monotonic()
        self._woken = True
        if self._wake is not None:
            self._wake.set()

    def reschedule(self) -> None:
        """Re-read when the next idle model expires (a request ended) and sleep until then at most."""
        if self._wake is not None:
            self._wake.set()

    async def _run(self) -> None:
        while True:
            self._woken = False
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("enforcer tick failed")
            await self._sleep(time.monotonic() + self.interval)
            await asyncio.sleep(MIN_TICK_GAP)  # a storm of wake-ups cannot spin the loop

    async def _sleep(self, until: float) -> None:
        """Until the poll is due, an idle model's TTL runs out, or a wake."""
        while not self._woken:
            self._wake.clear()
            ttl_due = self.pool.next_expiry_in()
            if ttl_due is not None:
                until = min(until, time.monotonic() + max(0.05, ttl_due + 0.05))
            left = until - time.monotonic()
            if left <= 0:
                return
            # asyncio.timeout, not wait_for: Python 3.11's wait_for loses a cancel that arrives as
            # the event is set, and stop() then waited forever
            try:
                async with asyncio.timeout(left):
                    await self._wake.wait()
            except TimeoutError:
                return

    def _next_interval(self) -> float:
        views = self.pool.views()
        since = None if self._woken_at is None else time.monotonic() - self._woken_at
        return poll_interval(level=self.level, requests_running=any(v.busy for v in views),
                             loading=any(v.state == ModelState.LOADING for v in views), seconds_since_wake=since,
                             loaded_count=sum(v.state == ModelState.LOADED for v in views))

    async def tick(self, *, on_demand: bool = False) -> TickDecision | None:
        """One measure-decide-act round; the lock keeps an on-demand tick from overlapping the loop's.
        An operator's tick (`on_demand`) always leaves its telemetry row."""
        if self._tick_lock is None:
            self._tick_lock = asyncio.Lock()
        async with self._tick_lock:
            self._ticking = True
            if on_demand:
                self._row_at = None
            try:
                return await self._tick()
            finally:
                self._ticking = False

    async def _tick(self) -> TickDecision | None:
        await self.pool.expire_idle()
        seen_at, seen = time.time(), self.probe.read()
        self.lines = memory_lines(self.conf, seen)
        if self.lines is None:
            self.level, self.over_ceiling_polls = Level.OK, 0
            self.actions.adapt_prefill(Level.OK)
            if cache_over_bound(seen.cache, self._cache_max()):
                await self._trim()
                seen = self.probe.read()
            self._finish(seen)
            return None
        reading, applied = seen, ()
        decision = decide(self._readings(reading), self.pool.views(), over_ceiling_polls=self.over_ceiling_polls,
                          reclaimed=False)
        await self.actions.walk_cache_cap(decision.level)
        self.actions.adapt_prefill(decision.level)
        seen_row = self._telemetry_row(seen_at, seen, decision.level)
        if any(a.kind == ActionKind.RECLAIM for a in decision.actions):
            await self._apply(decision, reading)
            applied, reading = decision.actions, self.probe.read()
            # the same poll: the re-measure must not count as a second poll over the ceiling
            decision = decide(self._readings(reading), self.pool.views(),
                              over_ceiling_polls=self.over_ceiling_polls, reclaimed=True)
        await self._apply(decision, reading)
        decision = replace(decision, actions=applied + decision.actions)
        self.over_ceiling_polls = decision.over_ceiling_polls
        if not decision.actions:
            self.level = decision.level
            self._finish(reading)
            return decision
        # Acting moved the memory: the level from here on (admission, the dashboard) is the one
        # after; telemetry keeps both, the pressure seen and where the tick left it.
        after = self.probe.read()
        self.level = classify(after.usage, self.lines, 0)[0]
        self._finish(after, seen_row=seen_row)
        return decision

    def _finish(self, reading, *, seen_row: dict | None = None) -> None:
        self.interval = self._next_interval()
        self.gate.set_paused(self.level != Level.OK, retry_after=self.interval)
        self.last_reading, self.last_tick_at = reading, time.time()
        self.ticks += 1
        if self.telemetry is not None:
            # a tick that acted records the pressure it saw, then the next row shows where it left memory
            if seen_row is not None:
                self._write_row(seen_row)
            self._write_row(self._telemetry_row(self.last_tick_at, reading, self.level))
        self.pool.events.changed(Change.TICK)

    def _write_row(self, row: dict) -> None:
        """At most one row per poll interval while the pressure level holds; a change of level is
        recorded when it happens (a spike shorter than the interval is not lost)."""
        now = time.monotonic()
        due = self._row_at is None or now - self._row_at >= ACTIVE_POLL_SECONDS
        if due or row["level"] != self._row_level:
            self.telemetry.append(row)
            self._row_at, self._row_level = now, row["level"]

    def _readings(self, reading) -> Readings:
        return Readings(usage=reading.usage, reclaimable=reading.reclaimable, lines=self.lines,
                        mlx_cache=reading.cache, mlx_cache_max=self._cache_max())

    def _cache_max(self) -> int | None:
        bound = self.conf.mlx_cache_max
        return None if bound == "off" else int(bound)

    # ---- actions: each one pool method ---------------------------------------------------------

    async def _apply(self, decision: TickDecision, reading) -> None:
        for action in decision.actions:
            if action.kind == ActionKind.RECLAIM and decision.level == Level.OK:
                await self._trim()
            elif action.kind == ActionKind.RECLAIM:
                await self.actions.reclaim_caches(target_usage=self.lines.soft - 1)
            elif action.kind == ActionKind.UNLOAD:
                await self.actions.evict(action.model, reason=action.reason or Reason.PRESSURE_SOFT,
                                         detail=f"memory pressure ({decision.level})")
            elif action.kind == ActionKind.ABORT_LOAD:
                await self.actions.abort_load(action.model, reason=action.reason,
                                              detail=f"load of '{action.model}' aborted at {decision.level} pressure")
            elif action.kind == ActionKind.ABORT_REQUESTS:
                await self.actions.abort_requests(action.model, reason=action.reason, code="memory_pressure",
                                                  message=self._abort_message(decision.level, reading))
            elif action.kind == ActionKind.DROP_DRAFT:
                await self.actions.drop_draft(action.model, reason=action.reason or Reason.PRESSURE_SOFT,
                                              detail=f"memory pressure ({decision.level})")
            elif action.kind == ActionKind.MARK_UNLOAD:
                await self.actions.mark_for_unload(action.model, reason=action.reason or Reason.EMERGENCY)

    async def _trim(self) -> None:
        """MLX's cache past its bound, at ok: a busy model's transient buffers pass it at every
        tick, so at most one history row a TRIM_ROW_SECONDS."""
        now = time.monotonic()
        record = self._trim_row_at is None or now - self._trim_row_at >= TRIM_ROW_SECONDS
        await self.actions.trim_mlx_cache(record=record)
        if record:
            self._trim_row_at = now

    def _abort_message(self, level: Level, reading) -> str:
        return (f"process memory pressure ({level}): usage {format_bytes(reading.usage)}, hard line "
                f"{format_bytes(self.lines.hard)}; retry shortly")

    # ---- state for the snapshot ----------------------------------------------------------------

    def state(self) -> dict:
        lines = self.lines
        return {
            "ceiling_bytes": lines.ceiling if lines else None,
            "soft_bytes": lines.soft if lines else None,
            "hard_bytes": lines.hard if lines else None,
            "level": self.level,
            "admission_paused": self.gate.paused,
            "admission_waiting": self.gate.waiting,
            "poll_interval": self.interval,
            "last_tick_at": self.last_tick_at,
        }

    def _telemetry_row(self, at: float, reading, level: Level) -> dict:
        resident = [v for v in self.pool.views() if v.resident]
        lines = self.lines
        return {"t": at, "usage": reading.usage, "active": reading.active, "cache": reading.cache,
                "rss": reading.rss, "model_bytes": sum(v.footprint for v in resident),
                "ceiling": lines.ceiling if lines else None, "soft": lines.soft if lines else None,
                "hard": lines.hard if lines else None, "level": str(level),
                "loaded": sum(v.state == ModelState.LOADED for v in resident)}
