"""ProcessMemoryEnforcer: measure -> policy.decide -> apply -> record -> publish, in a loop.

The loop is thin: every decision comes from pool.policy. Each tick also runs the pool's TTL pass.
It sleeps 1 s while anything happens, 10 s with only idle models, 30 s with none, and `wake()`
cuts the sleep short so a crossing is seen at once."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import replace

from . import policy
from .engines.engine import RequestAborted
from .engines.native import reclaim_cache
from .errors import BadRequest, ServiceUnavailable

log = logging.getLogger(__name__)

MIN_TICK_GAP = 0.01


class ProcessMemoryEnforcer:
    def __init__(self, pool, probe, settings, *, telemetry=None, metrics=None):
        self.pool = pool
        self.probe = probe
        self.conf = settings
        self.telemetry = telemetry
        self.metrics = metrics
        self.level = "ok"
        self.admission_paused = False
        self.over_ceiling_polls = 0
        self.interval = policy.EMPTY_POLL_SECONDS
        self.lines: policy.Lines | None = None
        self.last_reading = None
        self.last_tick_at: float | None = None
        self.ticks = 0
        self._woken_at: float | None = None
        self._wake: asyncio.Event | None = None
        self._admission_open: asyncio.Event | None = None
        self._waiting = 0
        self._task: asyncio.Task | None = None
        self._tick_lock: asyncio.Lock | None = None

    # ---- the loop ----------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._wake = asyncio.Event()
            self._admission_open = asyncio.Event()
            self._admission_open.set()
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

    def wake(self, *, active: bool = False) -> None:
        self._woken_at = time.monotonic()
        if self._wake is not None:
            self._wake.set()

    async def _run(self) -> None:
        while True:
            self._wake.clear()  # before the tick: a wake-up during it must cut the next sleep short
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the watchdog must outlive any one bad tick
                log.exception("enforcer tick failed")
            self.interval = self._next_interval()
            sleep = self.interval
            ttl_due = self.pool.next_expiry_in()
            if ttl_due is not None:
                sleep = max(0.05, min(sleep, ttl_due + 0.05))
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=sleep)
            except TimeoutError:
                pass
            await asyncio.sleep(MIN_TICK_GAP)  # a storm of wake-ups cannot spin the loop

    def _next_interval(self) -> float:
        entries = self.pool.entries.values()
        since = None if self._woken_at is None else time.monotonic() - self._woken_at
        return policy.poll_interval(level=self.level, requests_running=any(e.leases for e in entries),
                                    loading=any(e.state == "loading" for e in entries), seconds_since_wake=since,
                                    loaded_count=sum(e.state == "loaded" for e in entries))

    def ceiling(self, reading) -> int | None:
        value = self.conf.memory_ceiling
        if value == "off":
            return None
        if value == "auto":
            return policy.auto_ceiling(reading.capacity, self.conf.memory_guard, reading.device_limit)
        return int(value)

    async def tick(self) -> policy.TickDecision | None:
        """One measure-decide-act round; the lock keeps an on-demand tick from overlapping the loop's."""
        if self._tick_lock is None:
            self._tick_lock = asyncio.Lock()
        async with self._tick_lock:
            return await self._tick()

    async def _tick(self) -> policy.TickDecision | None:
        await self.pool.expire_idle()
        seen_at, seen = time.time(), self.probe.read()
        ceiling = self.ceiling(seen)
        if ceiling is None:
            self.lines, self.level, self.over_ceiling_polls = None, "ok", 0
            self._finish(seen)
            return None
        self.lines = policy.pressure_lines(ceiling, self.conf.soft_fraction, self.conf.hard_fraction)
        reading, applied = seen, ()
        decision = policy.decide(self._readings(reading), self.pool.views(),
                                 over_ceiling_polls=self.over_ceiling_polls, reclaimed=False)
        seen_row = self._telemetry_row(seen_at, seen, decision.level)
        if any(a.kind == "reclaim" for a in decision.actions):
            await self._apply(decision, reading)
            applied, reading = decision.actions, self.probe.read()
            # the same poll: the re-measure must not count as a second poll over the ceiling
            decision = policy.decide(self._readings(reading), self.pool.views(),
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
        self.level = policy.classify(after.usage, self.lines, 0)[0]
        self._finish(after, seen_row=seen_row)
        return decision

    def _finish(self, reading, *, seen_row: dict | None = None) -> None:
        self._set_admission(self.level != "ok")
        self.last_reading, self.last_tick_at = reading, time.time()
        self.ticks += 1
        if self.telemetry is not None:
            if seen_row is not None:
                self.telemetry.append(seen_row)
            self.telemetry.append(self._telemetry_row(self.last_tick_at, reading, self.level))
        self.pool.changed("tick")

    def _readings(self, reading) -> policy.Readings:
        return policy.Readings(usage=reading.usage, reclaimable=reading.reclaimable, lines=self.lines)

    # ---- actions -----------------------------------------------------------------------------

    async def _apply(self, decision: policy.TickDecision, reading) -> None:
        for action in decision.actions:
            entry = self.pool.entries.get(action.model) if action.model else None
            if action.kind == "reclaim":
                await self.reclaim(reading)
            elif action.kind == "unload" and entry is not None:
                await self.pool.evict(entry.id, reason=action.reason or "pressure_soft",
                                      detail=f"memory pressure ({decision.level})")
            elif action.kind == "abort_load" and entry is not None:
                self.pool.abort_load(entry.id)
                await self._event(action, entry, f"load of '{entry.id}' aborted at {decision.level} pressure")
            elif action.kind == "abort_requests" and entry is not None and entry.engine is not None:
                error = RequestAborted(f"process memory pressure ({decision.level}): usage "
                                       f"{policy.format_bytes(reading.usage)}, hard line "
                                       f"{policy.format_bytes(self.lines.hard)}; retry shortly")
                error.code = "memory_pressure"
                entry.engine.abort_all_with(error)
                await self._event(action, entry, f"{entry.leases} request(s) of '{entry.id}' aborted")
            elif action.kind == "mark_unload" and entry is not None:
                entry.marked_for_unload = action.reason or "emergency"
                await self._event(action, entry, f"'{entry.id}' will be unloaded when its requests drain")

    async def reclaim(self, reading=None) -> None:
        """Free what costs nothing: MLX's buffer cache, on the threads that own the arrays."""
        before = reading or self.probe.read()
        # MLX's cache is process-wide: one clear, on an engine thread between its decode steps
        engine = next((e.engine for e in self.pool.entries.values() if e.state == "loaded" and e.engine), None)
        if engine is not None:
            await engine.call(reclaim_cache)
        else:
            await asyncio.to_thread(reclaim_cache)
        after = self.probe.read()
        await self.pool.record(model_id="", reason="cache_reclaim", bytes_before=before.usage,
                               bytes_after=after.usage, freed_bytes=max(0, before.usage - after.usage),
                               detail=f"MLX cache {policy.format_bytes(before.cache)} -> "
                                      f"{policy.format_bytes(after.cache)}")

    async def _event(self, action: policy.Action, entry, detail: str) -> None:
        reading = self.probe.read()
        await self.pool.record(model_id=entry.id, reason=action.reason, estimated_bytes=entry.size_bytes,
                               bytes_before=reading.usage, bytes_after=reading.usage, detail=detail)

    # ---- admission -----------------------------------------------------------------------------

    def _set_admission(self, paused: bool) -> None:
        self.admission_paused = paused
        if self._admission_open is not None:
            (self._admission_open.clear if paused else self._admission_open.set)()

    def retry_after(self) -> int:
        return max(1, math.ceil(self.interval))

    async def admit(self) -> None:
        """Let a new request in; while admission is paused, wait in a bounded queue, then 503."""
        if not self.admission_paused or self._admission_open is None:
            return
        if self._waiting >= self.conf.admission_queue:
            self._reject("queue_full")
            raise ServiceUnavailable("Memory pressure: admission is paused and the wait queue is full; "
                                     "retry shortly.", retry_after=self.retry_after())
        self._waiting += 1
        try:
            await asyncio.wait_for(self._admission_open.wait(), timeout=self.conf.admission_wait)
        except TimeoutError:
            self._reject("timeout")
            raise ServiceUnavailable(f"Memory pressure: admission stayed paused for "
                                     f"{self.conf.admission_wait:g} s; retry shortly.",
                                     retry_after=self.retry_after()) from None
        finally:
            self._waiting -= 1

    def _reject(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.admission_rejected(reason)

    def check_prefill(self, entry, engine, prompt_tokens: int, *, param: str = "messages") -> None:
        """Refuse up front a prompt whose KV cache cannot fit under the hard line even after every
        idle model is evicted."""
        info = engine.model_info
        if not info or self.conf.memory_ceiling == "off":
            return
        reading = self.probe.read()
        lines = policy.pressure_lines(self.ceiling(reading), self.conf.soft_fraction, self.conf.hard_fraction)
        estimate = policy.kv_bytes(layers=info["layers"], kv_heads=info["kv_heads"], head_dim=info["head_dim"],
                                   bytes_per_element=info["bytes_per_element"], tokens=prompt_tokens)
        evictable = sum(v.footprint for v in policy.lru_victims(self.pool.views()) if v.id != entry.id)
        if not policy.prefill_check(kv_estimate=estimate, usage=reading.usage, evictable_bytes=evictable,
                                    hard_line=lines.hard):
            self._reject("prefill")
            raise BadRequest(f"The prompt ({prompt_tokens} tokens) needs about {policy.format_bytes(estimate)} of "
                             f"KV cache, which cannot fit under the hard memory line "
                             f"({policy.format_bytes(lines.hard)}) even after evicting every idle model.",
                             param=param, code="prefill_memory_exceeded", estimated_bytes=estimate,
                             limit_bytes=max(0, lines.hard - reading.usage + evictable))

    # ---- state for the snapshot ----------------------------------------------------------------

    def state(self) -> dict:
        lines = self.lines
        return {
            "ceiling_bytes": lines.ceiling if lines else None,
            "soft_bytes": lines.soft if lines else None,
            "hard_bytes": lines.hard if lines else None,
            "level": self.level,
            "admission_paused": self.admission_paused,
            "admission_waiting": self._waiting,
            "poll_interval": self.interval,
            "last_tick_at": self.last_tick_at,
        }

    def _telemetry_row(self, at: float, reading, level: str) -> dict:
        resident = [v for v in self.pool.views() if v.state in ("loaded", "loading")]
        lines = self.lines
        return {"t": at, "usage": reading.usage, "active": reading.active, "cache": reading.cache,
                "rss": reading.rss, "model_bytes": sum(v.footprint for v in resident),
                "ceiling": lines.ceiling if lines else None, "soft": lines.soft if lines else None,
                "hard": lines.hard if lines else None, "level": level,
                "loaded": sum(v.state == "loaded" for v in resident)}
