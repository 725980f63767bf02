"""This process's copy of the keys: {SHA-256: KeyRecord} of every key not revoked, read from the
database through Django's async ORM (the event loop never waits on it), and each key's request rate.

The copy is read again when a request finds it older than REFRESH_SECONDS, and at the next request
after a key changes in this process (signals.py): a revoke in the admin is refused at once here,
and within a second on the other processes and hosts that share the database. A failed read keeps
the last copy (and is tried again a second later); before any read has worked, named keys are
unknown and a request without OMLX_API_KEY is refused as the server not being ready, never let in.

When keys were last used is written off the request path, at most once a minute, by a task of its own."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime, timezone
from typing import Callable, Iterable, Mapping

from ..conf import get_settings
from ..policy.rate import Bucket, take
from .records import BOOTSTRAP, BOOTSTRAP_RECORD, KeyRecord, key_hash

log = logging.getLogger(__name__)

REFRESH_SECONDS = 1.0
USED_EVERY = 60.0           # seconds between writes of last_used_at


class Registry:
    def __init__(self, *, refresh: float = REFRESH_SECONDS, clock: Callable[[], float] = time.monotonic):
        self.refresh, self.clock = refresh, clock
        self._by_hash: dict[str, KeyRecord] = {}
        self._by_name: dict[str, KeyRecord] = {}
        self._loaded_at: float | None = None
        self.readable = False                  # a read has worked: named keys are known
        self._generation = 0                   # bumped by each change: a read begun before it is not enough
        self._reading: tuple[int, asyncio.Future] | None = None
        self._buckets: dict[str, Bucket] = {}
        self._used: dict[str, datetime] = {}
        self._used_written = clock()

    # ---- the copy ------------------------------------------------------------------------------------

    def invalidate(self) -> None:
        """A key changed: the next request reads them again (any thread may call this)."""
        self._generation += 1
        self._loaded_at = None

    async def current(self) -> None:
        """Make the copy at most `refresh` seconds old (one read at a time, shared by the waiting requests)."""
        if self._loaded_at is not None and self.clock() - self._loaded_at < self.refresh:
            return
        generation, loop = self._generation, asyncio.get_running_loop()
        reading = self._reading
        if reading is None or reading[0] != generation or reading[1].done() or reading[1].get_loop() is not loop:
            reading = self._reading = (generation, loop.create_task(self._read(generation)))
        await asyncio.shield(reading[1])
        self._write_used_soon()

    async def _read(self, generation: int) -> None:
        from .models import ApiKey

        started = self.clock()
        try:
            rows = [row async for row in ApiKey.objects.filter(revoked_at__isnull=True).values_list(
                "name", "key_hash", "models", "rate_per_minute", "shares_cache")]
        except Exception as e:  # noqa: BLE001 - a database fault keeps the last copy
            if self.readable:
                log.warning("the API keys could not be read again (the last copy stays): %s", e)
            else:
                log.error("the API keys could not be read: %s", e)
            self._loaded_at = started
            return
        by_hash = {digest: KeyRecord(name, tuple(models or ()), rate, bool(shares))
                   for name, digest, models, rate, shares in rows}
        self._by_hash, self._by_name = by_hash, {r.name: r for r in by_hash.values()}
        self.readable = True
        if generation == self._generation:
            self._loaded_at = started

    def load(self, records: Mapping[str, KeyRecord]) -> None:
        """Set the copy directly ({hash: record}; tests)."""
        self._by_hash, self._by_name = dict(records), {r.name: r for r in records.values()}
        self._loaded_at, self.readable = self.clock(), True

    # ---- questions -------------------------------------------------------------------------------------

    def keys_required(self) -> bool:
        """Whether a request needs a key: OMLX_API_KEY is set, or a named key exists."""
        return bool(get_settings().api_key) or bool(self._by_hash)

    def named(self, given: Iterable[str]) -> KeyRecord | None:
        """The named key among those a request offers (pool/api_key.given_keys), or None."""
        for key in given:
            found = self._by_hash.get(key_hash(key))
            if found is not None:
                return found
        return None

    def by_name(self, name: str) -> KeyRecord | None:
        """A key by its name (a fleet's hop carries the name, not the key)."""
        return BOOTSTRAP_RECORD if name == BOOTSTRAP else self._by_name.get(name)

    def names(self) -> list[str]:
        return sorted(self._by_name)

    # ---- the rate, and when a key was used ----------------------------------------------------------

    def admit(self, record: KeyRecord) -> float:
        """0.0 when the key's request may go now (it is counted), else the seconds until one may."""
        self._used[record.name] = datetime.now(timezone.utc)
        if record.rate_per_minute is None:
            return 0.0
        bucket, wait = take(self._buckets.get(record.name), per_minute=record.rate_per_minute, now=self.clock())
        self._buckets[record.name] = bucket
        return wait

    def _write_used_soon(self) -> None:
        if not self._used or self.clock() - self._used_written < USED_EVERY:
            return
        used, self._used, self._used_written = self._used, {}, self.clock()
        asyncio.get_running_loop().create_task(_write_used(used))


async def _write_used(used: dict[str, datetime]) -> None:
    from .models import ApiKey

    try:
        for name, when in used.items():
            if name != BOOTSTRAP:
                await ApiKey.objects.filter(name=name).aupdate(last_used_at=when)
    except Exception as e:  # noqa: BLE001 - only the admin's "last used" column is late
        log.warning("could not record when keys were last used: %s", e)


REGISTRY = Registry()
