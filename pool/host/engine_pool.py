"""EnginePool: this host's models, one entry each; loads them on demand inside the memory budget.

Decisions (who to evict, what expired) come from pool.policy as plain data; this module applies
them. No lock is held across a load: planning and marking happen in one synchronous stretch of the
event loop, so a request for a loaded model never waits behind another model's load. Engines are
made by the model's kind (pool/catalog/kinds.py), or by `make_engine` (tests give fakes)."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from ..catalog.discovery import discover
from ..catalog.kinds import GENERATE, Kind
from ..engines.protocol import CacheStats, LoadResult
from ..engines.protocol import LoadAborted as EngineLoadAborted
from ..errors import Busy, InsufficientMemory, LoadAborted, ModelBusy, ModelNotFound, ModelTooLarge, ModelUnavailable
from ..events import EventLog
from ..memory import MemoryReading
from ..policy import idle
from ..policy.load_plan import LoadPlan, ModelView, auto_model_budget, fits_once_idle, plan_load
from ..policy.load_progress import LoadRate
from ..policy.vocabulary import ActionKind, Change, ModelState, Reason, Refusal
from ..traces.trace import for_request
from .adapter_links import base_held, unload_adapters
from .draft_links import draft_of
from .engine_options import engine_options, prompt_cache_cap, wants_dequantize
from .entries import Entry
from .pool_lifecycle import PoolLifecycle
from .release_row import unload_fields

log = logging.getLogger(__name__)

State = ModelState
EngineMaker = Callable[..., Any]        # (kind, model_id, path, **options) -> an engine


def make_engine(kind: Kind, model_id: str, path: Path, **options: Any) -> Any:
    return kind.make_engine(model_id, path, **options)


class EnginePool(PoolLifecycle):
    def __init__(self, conf, probe, *, clock: Callable[[], float] = time.time, events: EventLog | None = None,
                 engine_maker: EngineMaker = make_engine):
        self.conf = conf
        self.probe = probe
        self.clock = clock
        self.events = events or EventLog(clock=clock)
        self.engine_maker = engine_maker
        self.entries: dict[str, Entry] = {}
        self.loads_total = 0
        self.load_seconds_total = 0.0
        self.load_rate = LoadRate()    # this host's weight bytes per second, from its past loads
        self.cache_fraction = 1.0      # of the configured prompt cache cap; memory pressure walks it
        self.prefill_step, self.prefill_step_alone = conf.prefill_step, conf.prefill_step_alone   # pressure lowers both
        self._tasks: set[asyncio.Task] = set()
        self._freed: asyncio.Future | None = None     # resolved when a lease ends or a load/unload settles

    # ---- discovery and model settings ----------------------------------------------------------

    def rediscover(self) -> None:
        """Re-scan the model folders. Loaded and loading entries stay; the rest are rebuilt,
        which also forgets load failures."""
        found = discover(list(self.conf.model_dirs))
        settled = (State.UNLOADED, State.FAILED)
        for model_id in list(self.entries):
            if self.entries[model_id].state in settled and model_id not in found:
                del self.entries[model_id]
        for model_id, folder in found.items():
            old = self.entries.get(model_id)
            if old is not None and old.state not in settled:
                continue
            dense = wants_dequantize(self.conf, folder, self.probe.read().capacity)
            entry = Entry(model_id, folder.path, folder.dense_bytes if dense else folder.size_bytes,
                          kind=folder.kind, dequantize=dense, base=folder.base, base_path=folder.base_path)
            if old is not None:
                entry.pinned, entry.ttl_seconds = old.pinned, old.ttl_seconds
                entry.model_settings, entry.measured_bytes = old.model_settings, old.measured_bytes
            self.entries[model_id] = entry
        self.events.changed(Change.DISCOVERY)

    def apply_model_settings(self, model_id: str, values: dict[str, Any]) -> None:
        """A ModelSettings row changed (admin, API, CLI): takes effect at once."""
        entry = self.entries.get(model_id)
        if entry is None:
            return
        entry.model_settings = dict(values)
        entry.pinned = bool(values.get("is_pinned"))
        ttl = values.get("ttl_seconds")
        entry.ttl_seconds = float(ttl) if ttl is not None else None
        self.events.changed(Change.SETTINGS, model_id)

    # ---- lookups -------------------------------------------------------------------------------

    def entry(self, model_id: str) -> Entry:
        try:
            return self.entries[model_id]
        except KeyError:
            raise ModelNotFound(model_id, sorted(self.entries)) from None

    def views(self) -> list[ModelView]:
        return [e.view(self.conf.idle_ttl, draft_bytes=d.size_bytes if (d := draft_of(self.entries, e)) else 0)
                for e in self.entries.values()]

    def budget(self, reading: MemoryReading | None = None) -> int | None:
        value = self.conf.max_model_memory
        if value == "off":
            return None
        if value == "auto":
            return auto_model_budget((reading or self.probe.read()).capacity)
        return int(value)

    def plan(self, model_id: str) -> LoadPlan:
        return plan_load(self.views(), self.entry(model_id).id, budget=self.budget(),
                         max_loaded=self.conf.max_loaded_models)

    def prompt_cache_cap(self) -> int:
        """Each model's prompt cache cap as configured (0 = off), before pressure walks it."""
        return prompt_cache_cap(self.conf, self.budget(), self.probe.read().capacity)

    def cache_stats(self, model_id: str) -> CacheStats | None:
        entry = self.entries[model_id]
        return entry.engine.cache_stats if entry.state == State.LOADED and entry.engine is not None else None

    def loaded(self, *, protocol: str | None = None) -> list[Entry]:
        """Loaded models with their engines (of one protocol's kinds, when given)."""
        return [e for e in self.entries.values() if e.state == State.LOADED and e.engine is not None
                and (protocol is None or e.kind.protocol == protocol)]

    def live_kv_bytes(self) -> int:
        """The KV cache every loaded model's running requests hold (each engine's latest report)."""
        return sum(e.engine.cache_stats.kv_bytes for e in self.loaded())

    def prompt_cache_bytes(self) -> int:
        """What every loaded model's prompt cache holds: free to drop, so reclaimable."""
        return sum(e.engine.cache_stats.prompt_cache_bytes for e in self.loaded())

    # ---- leases --------------------------------------------------------------------------------

    @asynccontextmanager
    async def lease(self, model_id: str, *, keep_alive: float | None = None) -> AsyncIterator[Any]:
        """Hold the model for one request: it is loaded if needed and never evicted meanwhile.
        Yields the engine; only the serving door (pool/serving/door.py) takes leases."""
        entry = self.entry(model_id)
        async with base_held(self, entry):
            entry.leases += 1
            entry.last_access = self.clock()
            entry.busy_keep_alive = idle.merge_keep_alive(entry.busy_keep_alive, keep_alive)
            self.events.changed(Change.REQUEST_START, entry.id)
            try:
                yield await self.ensure_loaded(entry, requested_by=entry.id)
            finally:
                self.end_lease(entry)

    def end_lease(self, entry: Entry, *, request: bool = True) -> None:
        """A lease ends: a request's, or (not `request`) an adapter's hold on its base."""
        entry.leases = max(0, entry.leases - 1)
        if entry.leases == 0:
            entry.idle_since = self.clock()
            entry.keep_alive, entry.busy_keep_alive = entry.busy_keep_alive, None
            if entry.keep_alive == 0 and entry.state == State.LOADED and not entry.pinned:
                self._mark_unloading(entry)     # now: a lease taken before the task runs would get an engine it stops
                self._spawn(self.unload_entry(entry, reason=Reason.KEEP_ALIVE))
        if request:
            self.events.changed(Change.REQUEST_END, entry.id)
        self._wake_loads()

    async def load(self, model_id: str) -> Entry:
        entry = self.entry(model_id)
        async with base_held(self, entry):
            await self.ensure_loaded(entry, requested_by=None)
        return entry

    async def ensure_loaded(self, entry: Entry, *, requested_by: str | None) -> Any:
        waited = 0.0                     # seconds spent waiting for busy models to make room
        while True:
            if entry.state == State.LOADED:
                return entry.engine
            if entry.state == State.FAILED:
                raise ModelUnavailable(f"The model '{entry.id}' failed to load and will not be retried until "
                                       f"models are re-discovered: {entry.failure}", param="model")
            if entry.state == State.LOADING:
                await asyncio.shield(entry.load_future)
            elif entry.state == State.UNLOADING:
                await asyncio.shield(entry.unload_future)
            elif not self._start_load(entry, requested_by, may_wait=True):
                waited = await self._wait_for_room(entry, waited)

    async def _wait_for_room(self, entry: Entry, waited: float) -> float:
        """A load blocked only by models that are busy, loading or unloading waits until one of them
        changes (at most OMLX_LOAD_WAIT in all), then tries again; then it is refused as busy."""
        limit = self.conf.load_wait
        if waited >= limit:
            raise Busy(f"Cannot load '{entry.id}' now: the models in its way stayed busy for {limit:g} s; "
                       "retry shortly.", code="models_busy", param="model")
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

    # ---- loading -------------------------------------------------------------------------------

    def _start_load(self, entry: Entry, requested_by: str | None, *, may_wait: bool = False) -> bool:
        """Start loading; False (with may_wait) when only models that are busy for now are in the way."""
        views, budget, most = self.views(), self.budget(), self.conf.max_loaded_models
        plan = plan_load(views, entry.id, budget=budget, max_loaded=most)
        if not plan.fits:
            if may_wait and plan.code != Refusal.MODEL_TOO_LARGE and \
                    fits_once_idle(views, entry.id, budget=budget, max_loaded=most):
                return False
            error = ModelTooLarge if plan.code == Refusal.MODEL_TOO_LARGE else InsufficientMemory
            raise error(plan.message, code=plan.code, param="model", blockers=list(plan.blockers))
        # made now, not when the victims are gone: an abort must reach the load at any point
        entry.engine = self.engine_maker(entry.kind, entry.id, entry.path, **self._engine_options(entry))
        entry.engine.on_failed = functools.partial(self._engine_failed, entry)    # holds no engine: no cycle
        if entry.kind.protocol == GENERATE:
            entry.engine.prefill_step, entry.engine.prefill_step_alone = self.prefill_step, self.prefill_step_alone
        entry.state, entry.load_started_at, entry.failure = State.LOADING, self.clock(), None
        entry.load_rate = self.load_rate.bytes_per_second()
        entry.load_note = ("" if plan.with_headroom or not entry.kind.keeps_kv
                           else "loaded without KV headroom: it fits only without it")
        entry.load_future = asyncio.get_running_loop().create_future()
        entry.load_future.add_done_callback(lambda f: f.cancelled() or f.exception())
        for victim in plan.victims:
            self._mark_unloading(self.entries[victim.id])
        self._spawn(self._load(entry, plan, requested_by))
        self.events.changed(Change.LOAD_START, entry.id)
        return True

    def _engine_options(self, entry: Entry) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        cache_bytes = int(self.prompt_cache_cap() * self.cache_fraction)
        options = engine_options(self.conf, entry, prompt_cache_bytes=cache_bytes,
                                 # from the engine thread: its running requests' KV grew by a step
                                 on_kv_growth=lambda kv_bytes: loop.call_soon_threadsafe(
                                     self.events.changed, Change.KV_GROWTH, entry.id))
        if entry.base is not None:       # held loaded by base_held
            options["base"] = self.entries[entry.base].engine
        if (draft := draft_of(self.entries, entry)) is not None:
            options["load"] = replace(options["load"], draft=draft.path, draft_dequantize=draft.dequantize,
                                      draft_tokens=self.conf.draft_tokens,
                                      draft_min_acceptance=self.conf.draft_min_acceptance)
        return options

    async def _load(self, entry: Entry, plan: LoadPlan, requested_by: str | None) -> None:
        future = entry.load_future
        detail = f"to load '{entry.id}'{for_request()}" + ("" if plan.with_headroom else " without KV headroom")
        memory_free = threading.Event()
        pending = len(plan.victims)

        def released() -> None:      # a victim's memory is back (its history row is written after)
            nonlocal pending
            pending -= 1
            if pending <= 0:
                memory_free.set()
        if not pending:
            memory_free.set()
        unloads = [self.unload_entry(self.entries[v.id], reason=v.reason, requested_by=requested_by or entry.id,
                                detail=detail, on_released=released) for v in plan.victims]
        try:
            result = await self._load_beside(entry, unloads, memory_free)
        except EngineLoadAborted:
            entry.state, entry.engine = State.UNLOADED, None
            future.set_exception(LoadAborted(f"Loading '{entry.id}' was aborted: process memory pressure. "
                                             "Retry when memory is available."))
        except Exception as e:  # noqa: BLE001 - any load failure is kept and shown to clients
            log.warning("loading %s failed: %s", entry.id, e)
            entry.state, entry.engine, entry.failure = State.FAILED, None, entry.shown_failure(e)
            future.set_exception(ModelUnavailable(f"The model '{entry.id}' failed to load: {entry.failure}",
                                                  param="model"))
        else:
            entry.state, entry.measured_bytes = State.LOADED, result.measured_bytes
            entry.load_seconds = result.seconds
            entry.idle_since = entry.last_access = max(entry.last_access, self.clock())
            self.loads_total += 1
            self.load_seconds_total += result.seconds
            self.load_rate.record(result.measured_bytes, entry.fill_seconds() or result.seconds)
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

    # ---- unloading -----------------------------------------------------------------------------

    async def unload(self, model_id: str, *, force: bool = False) -> Entry:
        """Manual unload: pins do not stop it; requests do unless `force`, which aborts them."""
        entry = self.entry(model_id)
        if entry.state == State.LOADING:
            raise ModelBusy(f"The model '{entry.id}' is loading; unload it once it has loaded.")
        if entry.state == State.UNLOADING:
            await asyncio.shield(entry.unload_future)
            return entry
        if entry.state != State.LOADED:
            return entry
        if entry.leases and not force:
            raise ModelBusy(f"The model '{entry.id}' is serving {entry.leases} request(s); "
                            'send {"force": true} to abort them and unload.', leases=entry.leases)
        await self.unload_entry(entry, reason=Reason.MANUAL, message="the model was unloaded by an operator")
        return entry

    def _engine_failed(self, entry: Entry, engine: Any, message: str) -> None:
        """An engine ended on an error of its own, its requests given theirs: the entry is unloaded,
        so that the next request loads the model again."""
        if entry.engine is engine and entry.state == State.LOADED:
            self._spawn(self.unload_entry(entry, reason=Reason.ENGINE_FAILED, detail=message))

    def _mark_unloading(self, entry: Entry) -> None:
        entry.state = State.UNLOADING
        entry.unload_future = asyncio.get_running_loop().create_future()

    async def unload_entry(self, entry: Entry, *, reason: Reason, requested_by: str | None = None,
                      detail: str = "", message: str | None = None,
                      on_released: Callable[[], None] | None = None) -> None:
        if entry.state == State.LOADED:
            self._mark_unloading(entry)
        elif entry.state != State.UNLOADING or entry.unload_future.done():
            if on_released is not None:
                on_released()
            return
        elif entry.engine is None:
            # marked, and another caller has already taken the engine to stop it (an idle expiry
            # and an eviction can choose the same model): wait for that one
            await asyncio.shield(entry.unload_future)
            if on_released is not None:
                on_released()
            return
        self.events.changed(Change.UNLOAD_START, entry.id)
        engine, entry.engine = entry.engine, None
        await unload_adapters(self, entry, reason, requested_by)
        started = time.perf_counter()
        before = self.probe.read()
        quiet = self._others_idle(entry)
        try:
            release = await engine.stop(message or f"the model was unloaded ({reason})")
            after = self.probe.read()       # before a load waiting for this memory takes it
        finally:
            entry.state, entry.marked_for_unload, entry.keep_alive = State.UNLOADED, None, None
            if not entry.unload_future.done():
                entry.unload_future.set_result(None)
            self.events.changed(Change.UNLOAD, entry.id)
            self._wake_loads()
            if on_released is not None:
                on_released()
        fields = unload_fields(model_id=entry.id, expected=entry.measured_bytes or entry.size_bytes, release=release,
                               before=before, after=after, quiet=quiet and self._others_idle(entry))
        suffix = fields.pop("detail_suffix")
        await self.events.record(
            action=ActionKind.UNLOAD, reason=reason, model_id=entry.id, estimated_bytes=entry.size_bytes,
            requested_by=requested_by or "", duration_ms=(time.perf_counter() - started) * 1000,
            detail=detail + suffix, **fields)

    def _others_idle(self, entry: Entry) -> bool:
        """No other model is loading or running a request (they would move MLX's active memory)."""
        return not any(e is not entry and (e.state == State.LOADING or e.leases)
                       for e in self.entries.values())

    async def expire_idle(self) -> list[str]:
        due = idle.expired(self.views(), self.clock())
        await asyncio.gather(*(self.unload_entry(self.entries[m], reason=r) for m, r in due))
        return [m for m, _ in due]

    def next_expiry_in(self) -> float | None:
        return idle.next_expiry_in(self.views(), self.clock())
