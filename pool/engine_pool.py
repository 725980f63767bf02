"""EnginePool: one entry per discovered model; loads on demand inside the memory budget.

Decisions (who to evict, what expired) come from pool.policy as plain data; this module applies
them. No lock is held across a load: planning and marking happen in one synchronous stretch of
the event loop, so a request for a loaded model never waits behind another model's load.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import policy
from .discovery import discover
from .engines.engine import Engine, LoadAborted as EngineLoadAborted
from .errors import InsufficientMemory, LoadAborted, ModelBusy, ModelNotFound, ModelTooLarge, ModelUnavailable
from .memory import MemoryReading

log = logging.getLogger(__name__)

MODEL_STATES = ("unloaded", "loading", "loaded", "unloading", "failed")


@dataclass
class Entry:
    id: str
    path: Path
    size_bytes: int
    state: str = "unloaded"
    measured_bytes: int | None = None
    engine: Engine | None = None
    leases: int = 0
    last_access: float = 0.0
    idle_since: float = 0.0
    pinned: bool = False
    ttl_seconds: float | None = None
    keep_alive: float | None = None          # decided by the busy period that ended last
    busy_keep_alive: float | None = None     # merged over the current busy period
    marked_for_unload: str | None = None
    failure: str | None = None
    load_started_at: float | None = None
    load_seconds: float | None = None
    load_note: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    _load_future: asyncio.Future | None = None
    _unload_future: asyncio.Future | None = None

    @property
    def alias(self) -> str | None:
        return self.settings.get("alias") or None

    @property
    def hidden(self) -> bool:
        return bool(self.settings.get("is_hidden"))


class EnginePool:
    def __init__(self, settings, probe, *, clock: Callable[[], float] = time.time, recorder=None):
        self.conf = settings
        self.probe = probe
        self.clock = clock
        self.entries: dict[str, Entry] = {}
        # listener(why, subject): the model id for request and load changes, the event for "event"
        self.listeners: list[Callable[[str, Any], None]] = []
        self.recorder = recorder      # async callable(**event fields); the ORM writer in production
        self.loads_total = 0
        self.load_seconds_total = 0.0
        self._tasks: set[asyncio.Task] = set()
        self.recent_events: deque[dict] = deque(maxlen=50)   # newest last; shown live by the dashboard

    # ---- discovery and settings -------------------------------------------------------------

    def rediscover(self) -> None:
        """Re-scan the model folders. Loaded and loading entries stay; the rest are rebuilt,
        which also forgets load failures."""
        found = discover(self.conf.model_dirs)
        for model_id in list(self.entries):
            entry = self.entries[model_id]
            if entry.state in ("unloaded", "failed") and model_id not in found:
                del self.entries[model_id]
        for model_id, folder in found.items():
            old = self.entries.get(model_id)
            if old is not None and old.state not in ("unloaded", "failed"):
                continue
            entry = Entry(model_id, folder.path, folder.size_bytes)
            if old is not None:
                entry.pinned, entry.ttl_seconds, entry.settings = old.pinned, old.ttl_seconds, old.settings
                entry.measured_bytes = old.measured_bytes
            self.entries[model_id] = entry
        self.changed("discovery")

    def apply_settings(self, model_id: str, values: dict[str, Any]) -> None:
        """A ModelSettings row changed (admin, API, CLI): takes effect at once."""
        entry = self.entries.get(model_id)
        if entry is None:
            return
        entry.settings = dict(values)
        entry.pinned = bool(values.get("is_pinned"))
        ttl = values.get("ttl_seconds")
        entry.ttl_seconds = float(ttl) if ttl is not None else None
        self.changed("settings")

    # ---- lookups -----------------------------------------------------------------------------

    def resolve(self, name: str) -> Entry:
        if name in self.entries:
            return self.entries[name]
        for entry in self.entries.values():
            if entry.alias == name:
                return entry
        lowered = name.lower()
        for entry in self.entries.values():
            if entry.id.lower() == lowered or (entry.alias or "").lower() == lowered:
                return entry
        available = ", ".join(self.visible_ids()) or "none"
        raise ModelNotFound(f"The model '{name}' does not exist. Available models: {available}", param="model")

    def visible_ids(self) -> list[str]:
        return sorted(e.alias or e.id for e in self.entries.values() if not e.hidden)

    def views(self) -> list[policy.ModelView]:
        return [self._view(e) for e in self.entries.values()]

    def _view(self, e: Entry) -> policy.ModelView:
        ttl = e.ttl_seconds if e.ttl_seconds is not None else self.conf.idle_ttl
        return policy.ModelView(id=e.id, state=e.state, size_bytes=e.size_bytes, measured_bytes=e.measured_bytes,
                                pinned=e.pinned, leases=e.leases, last_access=e.last_access,
                                idle_since=e.idle_since, ttl_seconds=ttl, keep_alive=e.keep_alive,
                                marked_for_unload=e.marked_for_unload)

    def budget(self, reading: MemoryReading | None = None) -> int | None:
        value = self.conf.max_model_memory
        if value == "off":
            return None
        if value == "auto":
            reading = reading or self.probe.read()
            return policy.auto_model_budget(reading.capacity)
        return int(value)

    def plan(self, name: str) -> policy.AdmissionPlan:
        entry = self.resolve(name)
        return policy.plan_admission(self.views(), entry.id, budget=self.budget(),
                                     max_loaded=self.conf.max_loaded_models)

    def busy(self) -> bool:
        return any(e.leases or e.state == "loading" for e in self.entries.values())

    # ---- requests ----------------------------------------------------------------------------

    @asynccontextmanager
    async def lease(self, name: str, *, keep_alive: float | None = None):
        """Hold the model for one request: it is loaded if needed and never evicted meanwhile."""
        entry = self.resolve(name)
        entry.leases += 1
        entry.last_access = self.clock()
        entry.busy_keep_alive = policy.merge_keep_alive(entry.busy_keep_alive, keep_alive)
        self.changed("request_start", entry.id)
        try:
            engine = await self._ensure_loaded(entry, requested_by=entry.id)
            yield engine
        finally:
            self._end_lease(entry)

    def _end_lease(self, entry: Entry) -> None:
        entry.leases = max(0, entry.leases - 1)
        if entry.leases == 0:
            entry.idle_since = self.clock()
            entry.keep_alive, entry.busy_keep_alive = entry.busy_keep_alive, None
            if entry.keep_alive == 0 and entry.state == "loaded" and not entry.pinned:
                self._spawn(self._unload(entry, reason="keep_alive"))
        self.changed("request_end", entry.id)

    async def load(self, name: str) -> Entry:
        entry = self.resolve(name)
        await self._ensure_loaded(entry, requested_by=None)
        return entry

    async def _ensure_loaded(self, entry: Entry, *, requested_by: str | None) -> Engine:
        while True:
            if entry.state == "loaded":
                return entry.engine
            if entry.state == "failed":
                raise ModelUnavailable(f"The model '{entry.id}' failed to load and will not be retried until "
                                       f"models are re-discovered: {entry.failure}", param="model")
            if entry.state == "loading":
                await asyncio.shield(entry._load_future)
            elif entry.state == "unloading":
                await asyncio.shield(entry._unload_future)
            else:
                self._start_load(entry, requested_by)

    def _start_load(self, entry: Entry, requested_by: str | None) -> None:
        views = self.views()
        budget = self.budget()
        plan = policy.plan_admission(views, entry.id, budget=budget, max_loaded=self.conf.max_loaded_models)
        if not plan.fits:
            error = ModelTooLarge if plan.code == "model_too_large" else InsufficientMemory
            raise error(plan.message, code=plan.code, param="model", blockers=list(plan.blockers))
        memory_only = policy.plan_admission(views, entry.id, budget=budget, max_loaded=0)
        entry.state, entry.load_started_at, entry.failure = "loading", self.clock(), None
        entry.load_note = "" if plan.with_headroom else "loaded without KV headroom: it fits only without it"
        entry._load_future = asyncio.get_running_loop().create_future()
        entry._load_future.add_done_callback(lambda f: f.cancelled() or f.exception())
        victims = [(self.entries[v], "lru" if v in memory_only.victims else "count_cap") for v in plan.victims]
        for victim, _ in victims:
            self._mark_unloading(victim)
        self._spawn(self._load(entry, victims, requested_by, plan))
        self.changed("load_start", entry.id)

    async def _load(self, entry: Entry, victims, requested_by, plan) -> None:
        future = entry._load_future
        detail = f"to load '{entry.id}'" + ("" if plan.with_headroom else " without KV headroom")
        try:
            await asyncio.gather(*(self._unload(v, reason=r, requested_by=requested_by or entry.id, detail=detail)
                                   for v, r in victims))
            entry.engine = Engine(entry.id, entry.path)
            result = await entry.engine.load()
        except EngineLoadAborted:
            entry.state, entry.engine = "unloaded", None
            future.set_exception(LoadAborted(f"Loading '{entry.id}' was aborted: process memory pressure. "
                                             "Retry when memory is available."))
        except Exception as e:  # noqa: BLE001 - any load failure is cached and shown to clients
            log.warning("loading %s failed: %s", entry.id, e)
            entry.state, entry.engine, entry.failure = "failed", None, f"{type(e).__name__}: {e}"
            future.set_exception(ModelUnavailable(f"The model '{entry.id}' failed to load: {entry.failure}",
                                                  param="model"))
        else:
            entry.state, entry.measured_bytes = "loaded", result.measured_bytes
            entry.load_seconds = result.seconds
            entry.idle_since = entry.last_access = max(entry.last_access, self.clock())
            self.loads_total += 1
            self.load_seconds_total += result.seconds
            future.set_result(entry.engine)
        finally:
            entry.load_started_at = None
            self.changed("load_end", entry.id)

    def abort_load(self, model_id: str) -> None:
        entry = self.entries[model_id]
        if entry.state == "loading" and entry.engine is not None:
            entry.engine.abort_load = True

    # ---- unloading ---------------------------------------------------------------------------

    async def unload(self, name: str, *, force: bool = False, reason: str = "manual") -> Entry:
        """Manual unload: pins do not stop it; requests do unless `force`, which aborts them."""
        entry = self.resolve(name)
        if entry.state == "loading":
            raise ModelBusy(f"The model '{entry.id}' is loading; unload it once it has loaded.")
        if entry.state == "unloading":
            await asyncio.shield(entry._unload_future)
            return entry
        if entry.state != "loaded":
            return entry
        if entry.leases and not force:
            raise ModelBusy(f"The model '{entry.id}' is serving {entry.leases} request(s); "
                            'send {"force": true} to abort them and unload.')
        await self._unload(entry, reason=reason, message="the model was unloaded by an operator")
        return entry

    def _mark_unloading(self, entry: Entry) -> None:
        entry.state = "unloading"
        entry._unload_future = asyncio.get_running_loop().create_future()

    async def _unload(self, entry: Entry, *, reason: str, requested_by: str | None = None,
                      detail: str = "", message: str | None = None) -> None:
        if entry.state == "loaded":
            self._mark_unloading(entry)
        elif entry.state != "unloading" or entry._unload_future.done():
            return
        self.changed("unload_start")
        started = time.perf_counter()
        before = self.probe.read()
        engine, entry.engine = entry.engine, None
        try:
            release = await engine.stop(message or f"the model was unloaded ({reason})")
        finally:
            entry.state, entry.marked_for_unload, entry.keep_alive = "unloaded", None, None
            entry._unload_future.set_result(None)
            self.changed("unload")
        after = self.probe.read()
        expected = entry.measured_bytes or entry.size_bytes
        warning = release.freed_bytes < 0.9 * expected
        if warning:
            log.warning("unloading %s released %d of %d bytes measured at load", entry.id,
                        release.freed_bytes, expected)
        await self.record(model_id=entry.id, reason=reason, estimated_bytes=entry.size_bytes,
                          freed_bytes=release.freed_bytes, rss_freed_bytes=release.rss_before - release.rss_after,
                          bytes_before=before.usage, bytes_after=after.usage, requested_by=requested_by or "",
                          duration_ms=(time.perf_counter() - started) * 1000,
                          detail=detail + (" (released less than 90% of the measured size)" if warning else ""),
                          warning=warning)

    async def evict(self, model_id: str, *, reason: str, detail: str = "") -> None:
        """Unload an idle model for the enforcer (its decision already checked it may go)."""
        await self._unload(self.entries[model_id], reason=reason, detail=detail)

    async def expire_idle(self) -> list[str]:
        due = policy.expired(self.views(), self.clock())
        await asyncio.gather(*(self._unload(self.entries[m], reason=r) for m, r in due))
        return [m for m, _ in due]

    def next_expiry_in(self) -> float | None:
        now = self.clock()
        remaining = [policy.ttl_remaining(v, now) for v in self.views()]
        remaining = [r for r in remaining if r is not None]
        return min(remaining) if remaining else None

    async def preload_pinned(self) -> None:
        for entry in list(self.entries.values()):
            if entry.pinned and entry.state == "unloaded":
                self._spawn(self._quiet(self.load(entry.id)))

    async def shutdown(self) -> None:
        await asyncio.gather(*(e._load_future for e in self.entries.values()
                               if e.state == "loading" and e._load_future), return_exceptions=True)
        for entry in self.entries.values():
            if entry.engine is not None:
                await entry.engine.stop("the server is shutting down")
                entry.engine, entry.state = None, "unloaded"

    # ---- plumbing ----------------------------------------------------------------------------

    async def record(self, **event) -> None:
        row = None
        if self.recorder is not None:
            try:
                row = await self.recorder(**event)
            except Exception:  # noqa: BLE001 - history must never break serving
                log.exception("could not record event %s", event.get("reason"))
        recorded = row.as_dict() if row is not None else {"model": event.get("model_id"), "time": self.clock(), **event}
        self.recent_events.append(recorded)
        self.changed("event", recorded)

    def changed(self, why: str, subject: Any = None) -> None:
        for listener in list(self.listeners):
            listener(why, subject)

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _quiet(coro) -> None:
        try:
            await coro
        except Exception as e:  # noqa: BLE001
            log.warning("background load failed: %s", e)
