"""This host as a member of the fleet: it publishes its record (its snapshot, its prompt-prefix keys,
its requests, how to reach it) every third of OMLX_FLEET_TTL and soon after every pool change and
every request that begins or ends, reads the others' for routing, loads the pinned models the fleet
has nowhere else (pins.py), and takes the settings other hosts wrote to the shared database.

Publishing never waits on the database: the settings are read on a loop of their own, so a database
that is away (or restarting) leaves this host in the fleet on the settings it last read, and the read
reopens its connection once the database is back."""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import suppress
from typing import Any

from asgiref.sync import sync_to_async

from ..policy.vocabulary import RESIDENT_STATES, Change
from .pins import pin_duties, pin_locations
from .placement import HostView, host_view
from .prefix import PrefixLedger
from .registry import Registry

log = logging.getLogger(__name__)

MIN_INTERVAL = 0.1      # between two publishes
READ_SECONDS = 0.05     # how old a read of the fleet may be when a request is routed
STOP_SECONDS = 3.0


class FleetMember:
    def __init__(self, runtime):
        conf = runtime.settings
        self.runtime = runtime
        self.host_id, self.url, self.key = conf.host_id, conf.advertise_url, conf.fleet_key
        self.registry = Registry(conf.redis_url, conf.fleet_ttl, conf.fleet_key) if conf.redis_url else None
        self.shared_database = bool(conf.database_url)
        self.interval = max(0.1, conf.fleet_ttl / 3)
        self.ledger = PrefixLedger()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._settings_task: asyncio.Task | None = None
        self._records: list[dict[str, Any]] = []
        self._own: dict[str, Any] | None = None     # this host's record as of the last read
        self._read_at = 0.0
        self._settings_mark: Any = None
        self._pin_loads: set[str] = set()
        self._failing: set[str] = set()      # what is failing now: logged once, and once when it heals
        runtime.traces.watch(self._wake.set)    # a request's start or end reaches every host's console soon

    # ---- what this host publishes --------------------------------------------------------------

    def record(self, *, requests: bool = True) -> dict[str, Any]:
        snapshot = self.runtime.snapshot()
        resident = [m["id"] for m in snapshot["models"] if m["state"] in RESIDENT_STATES]
        record: dict[str, Any] = {"host": self.host_id, "url": self.url, "sent_at": time.time(),
                                  "snapshot": snapshot, "prefixes": self.ledger.published(resident)}
        if requests:
            record["requests"] = self.runtime.traces.published()
        return record

    def changed(self, change) -> None:
        if change.kind == Change.UNLOAD and change.model:
            self.ledger.forget(change.model)
        self._wake.set()

    # ---- the fleet as read -----------------------------------------------------------------------

    async def records(self, *, fresh: bool = False) -> list[dict[str, Any]]:
        """Every live host's record, read at most READ_SECONDS ago (this host's own built then too: a
        routed request does not pay a memory probe and a snapshot of its own)."""
        if fresh or self._own is None or time.monotonic() - self._read_at > READ_SECONDS:
            if self.registry is not None:
                try:
                    self._records = await self.registry.hosts()
                    self._healthy("redis")
                except Exception as e:  # noqa: BLE001 - without Redis, this host serves alone
                    self._failed("redis", "cannot read the fleet from Redis", e)
            # routing reads no requests: a busy host would build every in-flight row per read
            self._own, self._read_at = self.record(requests=False), time.monotonic()
        others = [r for r in self._records if r.get("host") != self.host_id]
        return sorted([self._own, *others], key=lambda r: r["host"])

    async def views(self, *, exclude: tuple[str, ...] = ()) -> tuple[list[HostView], dict[str, dict]]:
        records = {r["host"]: r for r in await self.records() if r["host"] not in exclude}
        return [host_view(r) for r in records.values()], records

    def forget(self, host_id: str) -> None:
        """A host that did not answer is left out until it publishes again."""
        self._records = [r for r in self._records if r.get("host") != host_id]

    def pinned(self) -> set[str]:
        return {model_id for model_id, values in self.runtime.router.model_settings.items() if values.get("is_pinned")}

    async def state(self) -> dict[str, Any]:
        """GET /api/fleet."""
        records = await self.records(fresh=True)
        views = [host_view(r) for r in records]
        now = time.time()
        here = self.runtime.traces.published()
        return {"host": self.host_id, "fleet": self.registry is not None,
                "hosts": [{"host": r["host"], "url": r["url"], "age_seconds": round(max(0.0, now - r["sent_at"]), 2),
                           "snapshot": r["snapshot"], "prefix_keys": sum(len(k) for k in r["prefixes"].values()),
                           "requests": here if r["host"] == self.host_id else r.get("requests")}
                          for r in records],
                "pins": pin_locations(self.pinned(), views)}

    # ---- the loop ------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())
        if self.shared_database and self._settings_task is None:
            self._settings_task = asyncio.ensure_future(self._follow_settings())

    async def stop(self) -> None:
        """Leave the fleet; bounded, since a stop must never wait on Redis."""
        tasks = [t for t in (self._task, self._settings_task) if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            try:
                async with asyncio.timeout(STOP_SECONDS):
                    await asyncio.gather(*tasks, return_exceptions=True)
            except TimeoutError:
                log.warning("the fleet loop did not end within %g s of its cancel", STOP_SECONDS)
            self._task = self._settings_task = None
        if self.registry is not None:
            try:
                async with asyncio.timeout(STOP_SECONDS):
                    await self.registry.leave(self.host_id)       # out of the routing now, not after the TTL
                    await self.registry.close()
            except Exception as e:  # noqa: BLE001 - leaving is a courtesy; the TTL does it anyway
                log.info("could not leave the fleet: %s: %s", type(e).__name__, e)
        log.info("left the fleet")

    async def _run(self) -> None:
        while True:
            try:
                await self.cycle()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the next cycle tries again
                self._failed("redis", "a fleet cycle failed", e)
            try:   # not asyncio.wait_for: on 3.11 a wake that comes with the cancel swallows the cancel
                async with asyncio.timeout(self.interval):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            await asyncio.sleep(MIN_INTERVAL)

    async def cycle(self) -> None:
        if self.registry is None:
            return
        await self.registry.publish(self.host_id, self.record())
        self._healthy("redis")
        views = [host_view(r) for r in await self.records(fresh=True)]
        for model_id, host in pin_duties(self.pinned(), views).items():
            if host == self.host_id and model_id not in self._pin_loads:
                self._pin_loads.add(model_id)
                asyncio.ensure_future(self._load_pinned(model_id))

    async def _load_pinned(self, model_id: str) -> None:
        try:
            log.info("loading pinned %s: no live host of the fleet has it", model_id)
            await self.runtime.host.load(model_id)
        except Exception as e:  # noqa: BLE001 - shown on the model (its failure) and retried next cycle
            log.warning("could not load pinned %s: %s", model_id, e)
        finally:
            self._pin_loads.discard(model_id)
            self._wake.set()

    async def _follow_settings(self) -> None:
        while True:
            try:
                await self.take_settings()
                self._healthy("database")
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the settings last read stay in force; the next read tries again
                self._failed("database", "cannot read the shared settings", e)
            await asyncio.sleep(self.interval)

    async def take_settings(self) -> None:
        """The shared settings, when any changed since the last read."""
        mark, rows = await sync_to_async(_settings_since)(self._settings_mark)
        for model_id, values in rows or ():
            self.runtime.router.apply_model_settings(model_id, values)
        self._settings_mark = mark

    def _failed(self, part: str, what: str, error: Exception) -> None:
        if part not in self._failing:
            log.warning("%s: %s: %s", what, type(error).__name__, error)
        self._failing.add(part)

    def _healthy(self, part: str) -> None:
        if part in self._failing:
            log.info("the fleet's %s is reachable again", part)
        self._failing.discard(part)


def _settings_since(mark: Any) -> tuple[Any, list[tuple[str, dict]] | None]:
    """(the settings' mark, every row's values when the mark moved from `mark`, else None). On an error
    this thread's connection is closed: one the server dropped (a restart) would otherwise stay closed."""
    from django.db import connection
    from django.db.models import Count, Max

    from ..models import ModelSettings
    from ..services import settings_dict

    try:
        now = ModelSettings.objects.aggregate(latest=Max("updated_at"), rows=Count("id"))
        if now == mark:
            return now, None
        return now, [(row.model_id, settings_dict(row, row.model_id)) for row in ModelSettings.objects.all()]
    except Exception:
        with suppress(Exception):
            connection.close()
        raise
