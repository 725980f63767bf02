"""The runtime of this server process, built once: this process as a host (its engine pool, gate,
door and enforcer), the router in front of it, the metrics, the telemetry and the dashboard's
broadcaster.

Daphne has no lifespan protocol: `serve` starts the runtime when the server is ready, and the
first request starts it otherwise (never AppConfig.ready(), which also runs for migrate)."""

from __future__ import annotations

import asyncio
import logging
import time

from .conf import get_settings
from .errors import ServerNotReady
from .events import EventLog, PoolChange
from .memory import make_probe
from .router import Router

log = logging.getLogger(__name__)

# A runtime that failed to start is tried again by a request at most this often.
START_RETRY_SECONDS = 5.0



class Runtime:
    def __init__(self):
        from . import storage
        from .host.local import LocalHost  # here, not at import: the routes import this module
        from .observe.broadcast import Broadcaster
        from .observe.metrics import Metrics
        from .observe.telemetry import Telemetry
        from .services import record_event
        from .traces.registry import Traces

        self.settings = get_settings()
        self.probe = make_probe(self.settings)
        self.events = EventLog(recorder=record_event, host=self.settings.host_id)
        self.telemetry = Telemetry(self.settings.home / "telemetry.sqlite3",
                                   retention_days=self.settings.telemetry_days)
        self.metrics = Metrics(snapshot=self.snapshot)
        self.host = LocalHost(self.settings, self.probe, events=self.events, telemetry=self.telemetry,
                              on_reject=self.metrics.admission_rejected)
        self.metrics.watch(self.host.pool)
        self.probe.prompt_cache_bytes = self.host.pool.prompt_cache_bytes   # reclaimable, for the enforcer
        self.router = Router([self.host])
        self.broadcaster = Broadcaster(self)
        self.traces = Traces(self.settings, metrics=self.metrics, on_change=self.broadcaster.requests_changed)
        self.events.subscribe(self.traces.on_pool_change)
        self.fleet = None
        if self.settings.redis_url or self.settings.database_url:
            from .fleet.member import FleetMember
            self.fleet = FleetMember(self)
            self.events.subscribe(self.fleet.changed)
        # this runtime's record (tests build several in one process)
        storage.health.reset(settle_seconds=self.settings.storage_settle)
        self.metrics.registry.register(storage.StorageCollector(storage.health))
        self.events.subscribe(self._on_pool_change)
        self.started = False
        self.failure: str | None = None     # why the last start failed; /health shows it
        self._failed_at = 0.0
        self._start_lock: asyncio.Lock | None = None

    def _on_pool_change(self, change: PoolChange) -> None:
        self.broadcaster.schedule()

    def snapshot(self) -> dict:
        return self.host.state()

    async def start(self) -> None:
        """Start once. A failure is kept (and logged once, with its traceback) instead of raised:
        requests then get a 503 naming it, and a later request tries again."""
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self.started or (self.failure and time.monotonic() - self._failed_at < START_RETRY_SECONDS):
                return
            try:
                await self._start()
            except Exception as e:
                failure = f"{type(e).__name__}: {e}"
                if failure != self.failure:
                    log.exception("the server could not start: %s", failure)
                self.failure, self._failed_at = failure, time.monotonic()
            else:
                self.failure = None

    async def _start(self) -> None:
        from .services import load_all_settings, recent_events

        self.events.watch_storage()     # data folder faults and recoveries become events
        self.router.rediscover()
        await load_all_settings(self.router)
        self.events.remember(list(reversed(await recent_events(limit=50))))
        await self.host.start()
        if self.fleet is not None:
            self.fleet.start()
        self.started = True
        log.info("pool ready: %d models in %s", len(self.router.models()),
                 ", ".join(str(d) for d in self.settings.model_dirs))

    def end_requests(self, message: str, code: str) -> None:
        """Shutdown's grace is over: every running request ends with this error (an SSE error
        chunk, or a 503 envelope); the models stay loaded until stop()."""
        self.host.end_requests(message, code)

    async def stop(self) -> None:
        log.info("stopping: ending engine threads")
        if self.fleet is not None:
            await self.fleet.stop()       # out of the fleet's routing before the models go
        await self.host.stop()
        self.telemetry.close()
        await self.events.close()       # history rows the database could not take yet: a last try
        await asyncio.to_thread(self.traces.close)    # the traces handed over are written first
        self.broadcaster.close()


_runtime: Runtime | None = None


def get_runtime() -> Runtime:
    global _runtime
    if _runtime is None:
        _runtime = Runtime()
    return _runtime


def ready_runtime() -> Runtime:
    """The started runtime, for a route or a consumer; ServerNotReady (a 503 naming the reason) while
    it is not. Starting it is the site's (omlx_site.startup, `serve`), not the routes'."""
    runtime = get_runtime()
    if not runtime.started:
        why = runtime.failure or "it is starting"
        raise ServerNotReady(f"The server could not start: {why}" if runtime.failure else
                             f"The server is not ready: {why}; retry shortly.")
    return runtime


async def reset_runtime() -> None:
    """Tests: stop this process's runtime so the next one starts from the environment again."""
    global _runtime
    if _runtime is not None:
        await _runtime.stop()
    _runtime = None
