"""EnginePool: one entry per discovered model; loads on demand inside the memory budget.

Decisions (who to evict, what expired) come from pool.policy as plain data; this module applies
them, and the enforcer acts only through its methods. No lock is held across a load: planning and
marking happen in one synchronous stretch of the event loop, so a request for a loaded model
never waits behind another model's load.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .backend import cpu_backend
from .concurrency import ModelSlots
from .discovery import CHAT, EMBEDDINGS, ModelFolder, discover
from .engines.types import CacheStats, EngineLike, LoadAborted as EngineLoadAborted, LoadResult
from .errors import (BadRequest, InsufficientMemory, LoadAborted, ModelBusy, ModelNotFound, ModelTooLarge,
                     ModelUnavailable, ServiceUnavailable)
from .events import EventLog
from .memory import MemoryReading
from .names import resolve_name
from .policy import idle
from .policy.admission import AdmissionPlan, ModelView, auto_model_budget, fits_once_idle, plan_admission
from .policy.dequantize import dequantize_budget, should_dequantize
from .policy.pressure import prefill_step
from .policy.redact import without_paths
from .policy.vocabulary import ActionKind, Change, Level, ModelState, Reason, Refusal
from .relief import Relief

log = logging.getLogger(__name__)

State = ModelState


def _default_engine_factory(model_id: str, path: Path, **options) -> EngineLike:
    from .engines.engine import Engine  # MLX is imported only when a real engine is made
    return Engine(model_id, path, **options)


def _default_embedding_factory(model_id: str, path: Path, **options) -> EngineLike:
    from .engines.embedding import EmbeddingEngine
    return EmbeddingEngine(model_id, path, **options)


def _shown_failure(entry, error: BaseException) -> str:
    """A load error as clients see it: files named inside the model's folder, never by absolute
    path (the log keeps the whole message)."""
    folders = {str(entry.path): entry.id, str(entry.path.resolve()): entry.id}
    return without_paths(f"{type(error).__name__}: {error}", folders)


# What a route asks of a model of the other kind: a 400 that says where to go instead.
KIND_REFUSALS = {
    (EMBEDDINGS, CHAT): "'{id}' is an embedding model: it serves /v1/embeddings, not chat or text completions.",
    (CHAT, EMBEDDINGS): "'{id}' is a chat model, not an embedding model: /v1/embeddings needs one "
                        "(available: {others}).",
}


@dataclass
class Entry:
    id: str
    path: Path
    size_bytes: int
    kind: str = CHAT                         # "chat" | "embeddings" (pool.discovery.model_kind)
    state: ModelState = State.UNLOADED
    measured_bytes: int | None = None
    engine: EngineLike | None = None
    leases: int = 0
    last_access: float = 0.0
    idle_since: float = 0.0
    pinned: bool = False
    ttl_seconds: float | None = None
    keep_alive: float | None = None          # decided by the busy period that ended last
    busy_keep_alive: float | None = None     # merged over the current busy period
    marked_for_unload: Reason | None = None
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


class EnginePool(Relief):
    def __init__(self, settings, probe, *, clock: Callable[[], float] = time.time, events: EventLog | None = None,
                 engine_factory: Callable[..., EngineLike] = _default_engine_factory,
                 embedding_factory: Callable[..., EngineLike] = _default_embedding_factory):
        self.conf = settings
        self.probe = probe
        self.clock = clock
        self.events = events or EventLog(clock=clock)
        self.engine_factory = engine_factory
        self.embedding_factory = embedding_factory
        self.entries: dict[str, Entry] = {}
        self.loads_total = 0
        self.load_seconds_total = 0.0
        self.cache_fraction = 1.0      # of the configured prompt cache cap; memory pressure walks it
        self.prefill_step = prefill_step(Level.OK, settings.prefill_step)   # prompt tokens per step; memory pressure lowers it
        self._tasks: set[asyncio.Task] = set()
        self._freed: asyncio.Future | None = None     # resolved when a lease ends or a load/unload settles
        # per-model concurrency: the serving door takes the slots, the snapshot shows them
        self.slots = ModelSlots(limit=settings.max_concurrent, queue_limit=settings.queue_per_model,
                                on_change=lambda model_id: self.events.changed(Change.QUEUE, model_id))

    # ---- discovery and settings -------------------------------------------------------------

    def rediscover(self) -> None:
        """Re-scan the model folders. Loaded and loading entries stay; the rest are rebuilt,
        which also forgets load failures."""
        found = discover(self.conf.model_dirs)
        settled = (State.UNLOADED, State.FAILED)
        for model_id in list(self.entries):
            if self.entries[model_id].state in settled and model_id not in found:
                del self.entries[model_id]
        for model_id, folder in found.items():
            old = self.entries.get(model_id)
            if old is not None and old.state not in settled:
                continue
            entry = Entry(model_id, folder.path, self._load_size(folder), kind=folder.kind)
            if old is not None:
                entry.pinned, entry.ttl_seconds, entry.settings = old.pinned, old.ttl_seconds, old.settings
                entry.measured_bytes = old.measured_bytes
            self.entries[model_id] = entry
        self.events.changed(Change.DISCOVERY)

    def _load_size(self, folder: ModelFolder) -> int:
        """What a load will take: the float32 size when the CPU backend serves the model dequantized
        (pool.engines.dequantize makes the same decision at load time)."""
        mode = getattr(self.conf, "cpu_dequantize", "off")
        if folder.dense_bytes is None or mode == "off" or not cpu_backend():
            return folder.size_bytes
        budget = dequantize_budget(self.conf.max_model_memory, self.probe.read().capacity)
        dense = should_dequantize(mode, cpu_backend=True, dense_bytes=folder.dense_bytes, budget=budget)
        return folder.dense_bytes if dense else folder.size_bytes

    def apply_settings(self, model_id: str, values: dict[str, Any]) -> None:
        """A ModelSettings row changed (admin, API, CLI): takes effect at once."""
        entry = self.entries.get(model_id)
        if entry is None:
            return
        entry.settings = dict(values)
        entry.pinned = bool(values.get("is_pinned"))
        ttl = values.get("ttl_seconds")
        entry.ttl_seconds = float(ttl) if ttl is not None else None
        self.events.changed(Change.SETTINGS, model_id)

    # ---- lookups -----------------------------------------------------------------------------

    def resolve(self, name: str) -> Entry:
        model_id = resolve_name(name, ((e.id, e.alias) for e in self.entries.values()))
        if model_id is None:
            available = ", ".join(self.visible_ids()) or "none"
            raise ModelNotFound(f"The model '{name}' does not exist. Available models: {available}", param="model")
        return self.entries[model_id]

    def require_kind(self, entry: Entry, kind: str) -> None:
        """A request for `kind` ("chat" or "embeddings") given a model of the other kind: a 400,
        before anything loads."""
        if entry.kind == kind:
            return
        template = KIND_REFUSALS.get((entry.kind, kind), "'{id}' cannot serve this request.")
        others = ", ".join(sorted(e.alias or e.id for e in self.entries.values()
                                  if e.kind == kind and not e.hidden)) or "none"
        raise BadRequest(template.format(id=entry.alias or entry.id, others=others), param="model",
                         code="model_kind_mismatch")

    def visible_ids(self) -> list[str]:
        return sorted(e.alias or e.id for e in self.entries.values() if not e.hidden)

    def views(self) -> list[ModelView]:
        return [self._view(e) for e in self.entries.values()]

    def _view(self, e: Entry) -> ModelView:
        ttl = e.ttl_seconds if e.ttl_seconds is not None else self.conf.idle_ttl
        return ModelView(id=e.id, state=e.state, size_bytes=e.size_bytes, measured_bytes=e.measured_bytes,
                         pinned=e.pinned, leases=e.leases, last_access=e.last_access, idle_since=e.idle_since,
                         ttl_seconds=ttl, keep_alive=e.keep_alive, marked_for_unload=e.marked_for_unload)

    def budget(self, reading: MemoryReading | None = None) -> int | None:
        value = self.conf.max_model_memory
        if value == "off":
            return None
        if value == "auto":
            return auto_model_budget((reading or self.probe.read()).capacity)
        return int(value)

    def plan(self, name: str) -> AdmissionPlan:
        entry = self.resolve(name)
        return plan_admission(self.views(), entry.id, budget=self.budget(), max_loaded=self.conf.max_loaded_models)

    def model_info(self, model_id: str) -> dict:
        engine = self.entries[model_id].engine
        return engine.model_info if engine is not None else {}

    def prompt_cache_cap(self) -> int:
        """Each model's prompt cache cap as configured (0 = off), before pressure walks it."""
        value = self.conf.prompt_cache_bytes
        if value == "off" or not self.conf.prompt_cache_entries:
            return 0
        if value == "auto":
            budget = self.budget()
            return (budget if budget is not None else auto_model_budget(self.probe.read().capacity)) // 10
        return int(value)

    def _cache_options(self, model_id: str) -> dict[str, Any]:
        disk = self.conf.prompt_cache_disk_bytes
        return {"prompt_cache_bytes": int(self.prompt_cache_cap() * self.cache_fraction),
                "prompt_cache_entries": self.conf.prompt_cache_entries,
                "prompt_cache_dir": self.conf.home / "prompt-cache" / model_id.replace("/", "--"),
                "prompt_cache_disk_bytes": 0 if disk == "off" else int(disk)}

    def cache_stats(self, model_id: str) -> CacheStats | None:
        entry = self.entries[model_id]
        return entry.engine.cache_stats if entry.state == State.LOADED and entry.engine is not None else None

    def live_kv_bytes(self) -> int:
        """The KV cache every loaded model's running requests hold (each engine's latest report)."""
        return sum(engine.cache_stats.kv_bytes for engine in self._loaded_engines())

    def prompt_cache_bytes(self) -> int:
        """What every loaded model's prompt cache holds: free to drop, so reclaimable."""
        return sum(engine.cache_stats.prompt_cache_bytes for engine in self._loaded_engines())

    # ---- requests ----------------------------------------------------------------------------

    @asynccontextmanager
    async def lease(self, name: str, *, keep_alive: float | None = None, kind: str = CHAT):
        """Hold the model for one request: it is loaded if needed and never evicted meanwhile.
        Yields the engine; only the serving doors (pool/serving.py, pool/embedding_serving.py) take
        leases. A model of another `kind` is refused (a 400) before it is loaded."""
        entry = self.resolve(name)
        self.require_kind(entry, kind)
        entry.leases += 1
        entry.last_access = self.clock()
        entry.busy_keep_alive = idle.merge_keep_alive(entry.busy_keep_alive, keep_alive)
        self.events.changed(Change.REQUEST_START, entry.id)
        try:
            yield await self._ensure_loaded(entry, requested_by=entry.id)
        finally:
            self._end_lease(entry)

    def _end_lease(self, entry: Entry) -> None:
        entry.leases = max(0, entry.leases - 1)
        if entry.leases == 0:
            entry.idle_since = self.clock()
            entry.keep_alive, entry.busy_keep_alive = entry.busy_keep_alive, None
            if entry.keep_alive == 0 and entry.state == State.LOADED and not entry.pinned:
                self._spawn(self._unload(entry, reason=Reason.KEEP_ALIVE))
        self.events.changed(Change.REQUEST_END, entry.id)
        self._wake_loads()

    async def load(self, name: str) -> Entry:
        entry = self.resolve(name)
        await self._ensure_loaded(entry, requested_by=None)
        return entry

    async def _ensure_loaded(self, entry: Entry, *, requested_by: str | None) -> EngineLike:
        waited = 0.0                     # seconds spent waiting for busy models to make room
        while True:
            if entry.state == State.LOADED:
                return entry.engine
            if entry.state == State.FAILED:
                raise ModelUnavailable(f"The model '{entry.id}' failed to load and will not be retried until "
                                       f"models are re-discovered: {entry.failure}", param="model")
            if entry.state == State.LOADING:
                await asyncio.shield(entry._load_future)
            elif entry.state == State.UNLOADING:
                await asyncio.shield(entry._unload_future)
            elif not self._start_load(entry, requested_by, may_wait=True):
                waited = await self._wait_for_room(entry, waited)

    async def _wait_for_room(self, entry: Entry, waited: float) -> float:
        """A load blocked only by models that are busy, loading or unloading waits until one of them
        changes (at most OMLX_LOAD_WAIT in all), then tries again; a 503 with Retry-After after that.
        Refusing at once made a client retry by hand what the pool could do (the soak saw 30% 507s)."""
        limit = self.conf.load_wait
        if waited >= limit:
            raise ServiceUnavailable(f"cannot load '{entry.id}' now: the models in its way stayed busy for "
                                     f"{limit:g} s; retry shortly.", code="models_busy", param="model")
        if self._freed is None or self._freed.done():
            self._freed = asyncio.get_running_loop().create_future()
        started = time.monotonic()
        try:
            async with asyncio.timeout(limit - waited):   # not wait_for: see enforcer._run
                await asyncio.shield(self._freed)
        except TimeoutError:
            pass
        return waited + time.monotonic() - started

    def _wake_loads(self) -> None:
        if self._freed is not None and not self._freed.done():
            self._freed.set_result(None)

    def _start_load(self, entry: Entry, requested_by: str | None, *, may_wait: bool = False) -> bool:
        """Start loading; False (with may_wait) when only models that are busy for now are in the way."""
        views, budget, most = self.views(), self.budget(), self.conf.max_loaded_models
        plan = plan_admission(views, entry.id, budget=budget, max_loaded=most)
        if not plan.fits:
            if may_wait and plan.code != Refusal.MODEL_TOO_LARGE and \
                    fits_once_idle(views, entry.id, budget=budget, max_loaded=most):
                return False
            error = ModelTooLarge if plan.code == Refusal.MODEL_TOO_LARGE else InsufficientMemory
            raise error(plan.message, code=plan.code, param="model", blockers=list(plan.blockers))
        # made now, not when the victims are gone: an abort must reach the load at any point
        if entry.kind == EMBEDDINGS:     # an encoder has no prompt cache
            entry.engine = self.embedding_factory(entry.id, entry.path)
        else:
            entry.engine = self.engine_factory(entry.id, entry.path, **self._cache_options(entry.id))
        entry.engine.prefill_step = self.prefill_step
        entry.state, entry.load_started_at, entry.failure = State.LOADING, self.clock(), None
        entry.load_note = ("" if plan.with_headroom or entry.kind == EMBEDDINGS   # an encoder keeps no KV
                           else "loaded without KV headroom: it fits only without it")
        entry._load_future = asyncio.get_running_loop().create_future()
        entry._load_future.add_done_callback(lambda f: f.cancelled() or f.exception())
        for victim in plan.victims:
            self._mark_unloading(self.entries[victim.id])
        self._spawn(self._load(entry, plan, requested_by))
        self.events.changed(Change.LOAD_START, entry.id)
        return True

    async def _load(self, entry: Entry, plan: AdmissionPlan, requested_by: str | None) -> None:
        future = entry._load_future
        detail = f"to load '{entry.id}'" + ("" if plan.with_headroom else " without KV headroom")
        memory_free = threading.Event()
        pending = len(plan.victims)

        def released() -> None:      # a victim's memory is back (its history row is written after)
            nonlocal pending
            pending -= 1
            if pending <= 0:
                memory_free.set()
        if not pending:
            memory_free.set()
        unloads = [self._unload(self.entries[v.id], reason=v.reason, requested_by=requested_by or entry.id,
                                detail=detail, on_released=released) for v in plan.victims]
        try:
            result = await self._load_beside(entry, unloads, memory_free)
        except EngineLoadAborted:
            entry.state, entry.engine = State.UNLOADED, None
            future.set_exception(LoadAborted(f"Loading '{entry.id}' was aborted: process memory pressure. "
                                             "Retry when memory is available."))
        except Exception as e:  # noqa: BLE001 - any load failure is cached and shown to clients
            log.warning("loading %s failed: %s", entry.id, e)
            entry.state, entry.engine, entry.failure = State.FAILED, None, _shown_failure(entry, e)
            future.set_exception(ModelUnavailable(f"The model '{entry.id}' failed to load: {entry.failure}",
                                                  param="model"))
        else:
            entry.state, entry.measured_bytes = State.LOADED, result.measured_bytes
            entry.load_seconds = result.seconds
            entry.idle_since = entry.last_access = max(entry.last_access, self.clock())
            self.loads_total += 1
            self.load_seconds_total += result.seconds
            future.set_result(entry.engine)
        finally:
            entry.load_started_at = None
            self.events.changed(Change.LOAD_END, entry.id)
            self._wake_loads()

    async def _load_beside(self, entry: Entry, unloads: list, memory_free: threading.Event) -> LoadResult:
        """The new model reads its tokenizer and opens its files while the victims free their memory;
        its weights take memory only once they are gone (`memory_free`)."""
        loading = asyncio.ensure_future(entry.engine.load(memory_free=memory_free))
        try:
            await asyncio.gather(*unloads)
        except BaseException:
            entry.engine.abort_load = True       # the thread stops before the weights and ends
            memory_free.set()
            await asyncio.gather(loading, return_exceptions=True)
            raise
        return await loading

    # ---- unloading ---------------------------------------------------------------------------

    async def unload(self, name: str, *, force: bool = False) -> Entry:
        """Manual unload: pins do not stop it; requests do unless `force`, which aborts them."""
        entry = self.resolve(name)
        if entry.state == State.LOADING:
            raise ModelBusy(f"The model '{entry.id}' is loading; unload it once it has loaded.")
        if entry.state == State.UNLOADING:
            await asyncio.shield(entry._unload_future)
            return entry
        if entry.state != State.LOADED:
            return entry
        if entry.leases and not force:
            raise ModelBusy(f"The model '{entry.id}' is serving {entry.leases} request(s); "
                            'send {"force": true} to abort them and unload.')
        await self._unload(entry, reason=Reason.MANUAL, message="the model was unloaded by an operator")
        return entry

    def _mark_unloading(self, entry: Entry) -> None:
        entry.state = State.UNLOADING
        entry._unload_future = asyncio.get_running_loop().create_future()

    async def _unload(self, entry: Entry, *, reason: Reason, requested_by: str | None = None,
                      detail: str = "", message: str | None = None,
                      on_released: Callable[[], None] | None = None) -> None:
        if entry.state == State.LOADED:
            self._mark_unloading(entry)
        elif entry.state != State.UNLOADING or entry._unload_future.done():
            if on_released is not None:
                on_released()
            return
        elif entry.engine is None:
            # marked, and another caller has already taken the engine to stop it (an idle expiry
            # and an eviction that chose the same model, seen in the soak): wait for that one
            await asyncio.shield(entry._unload_future)
            if on_released is not None:
                on_released()
            return
        self.events.changed(Change.UNLOAD_START, entry.id)
        started = time.perf_counter()
        before = self.probe.read()
        quiet = self._others_idle(entry)
        engine, entry.engine = entry.engine, None
        try:
            release = await engine.stop(message or f"the model was unloaded ({reason})")
        finally:
            entry.state, entry.marked_for_unload, entry.keep_alive = State.UNLOADED, None, None
            if not entry._unload_future.done():
                entry._unload_future.set_result(None)
            self.events.changed(Change.UNLOAD, entry.id)
            self._wake_loads()
            if on_released is not None:
                on_released()
        after = self.probe.read()
        # MLX's active memory is the whole process's: its fall measures this release only while no
        # other engine allocated meanwhile (seen in the soak: 0 bytes for a 40 MB model beside
        # 8 clients). Then a fall short of the weights is a leak worth a warning.
        expected = entry.measured_bytes or entry.size_bytes
        warning = quiet and self._others_idle(entry) and release.active_drop < 0.9 * expected
        if warning:
            log.warning("unloading %s released %d of %d bytes measured at load", entry.id,
                        release.active_drop, expected)
        await self.events.record(
            action=ActionKind.UNLOAD, reason=reason, model_id=entry.id, estimated_bytes=entry.size_bytes,
            freed_bytes=release.freed_bytes, rss_freed_bytes=release.rss_before - release.rss_after,
            bytes_before=before.usage, bytes_after=after.usage, requested_by=requested_by or "",
            duration_ms=(time.perf_counter() - started) * 1000,
            detail=detail + (" (released less than 90% of the measured size)" if warning else ""), warning=warning)

    def _others_idle(self, entry: Entry) -> bool:
        """No other model is loading or running a request (they would move MLX's active memory)."""
        return not any(e is not entry and (e.state == State.LOADING or e.leases)
                       for e in self.entries.values())

    async def expire_idle(self) -> list[str]:
        due = idle.expired(self.views(), self.clock())
        await asyncio.gather(*(self._unload(self.entries[m], reason=r) for m, r in due))
        return [m for m, _ in due]

    def next_expiry_in(self) -> float | None:
        return idle.next_expiry_in(self.views(), self.clock())

    # ---- start and stop ----------------------------------------------------------------------

    async def preload_pinned(self) -> None:
        for entry in list(self.entries.values()):
            if entry.pinned and entry.state == State.UNLOADED:
                self._spawn(self._quiet(self.load(entry.id)))

    async def shutdown(self) -> None:
        await asyncio.gather(*(e._load_future for e in self.entries.values()
                               if e.state == State.LOADING and e._load_future), return_exceptions=True)
        for entry in self.entries.values():
            if entry.engine is not None:
                await entry.engine.stop("the server is shutting down")
                entry.engine, entry.state = None, State.UNLOADED

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
