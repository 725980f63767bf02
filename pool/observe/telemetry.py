"""The enforcer's time series: one row per tick in its own SQLite file ($OMLX_HOME/telemetry.sqlite3).

Rows are buffered and written in small batches (WAL, an index on `t`); rows older than the
retention are pruned at most once a minute. Writes are a few rows at a time and run inline on the
event loop; reads (`query`) may run on a worker thread, so one connection is shared under a lock,
and a write that finds a read in progress leaves its rows for the next tick instead of waiting.

A write the disk refuses (full, read-only, locked by another process: the loop waits at most
BUSY_SECONDS) leaves its rows in the buffer, tried again every RETRY_SECONDS; at most MAX_BUFFERED
are kept, the oldest dropped and counted beyond that. The fault and the recovery are reported once
(pool/storage.py: a log line, an event, the storage_* gauges), and `query` answers from what the
file holds plus the unwritten rows, with `note()` saying why they are not stored."""

from __future__ import annotations

import logging
import math
import sqlite3
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable

import sqlite_utils

from .. import storage

log = logging.getLogger(__name__)

TABLE = "telemetry"
COLUMNS = {"t": float, "usage": int, "active": int, "cache": int, "rss": int, "model_bytes": int,
           "ceiling": int, "soft": int, "hard": int, "level": str, "loaded": int}
# per bucket: the peak of the memory quantities, the last value of the lines and the level
PEAK_COLUMNS = ("usage", "active", "cache", "rss", "model_bytes", "loaded")
LAST_COLUMNS = ("ceiling", "soft", "hard", "level")
MAX_POINTS = 2000
PRUNE_EVERY_SECONDS = 60.0
MAX_BUFFERED = 20_000     # rows kept while the disk refuses them: hours of ticks
RETRY_SECONDS = 5.0
BUSY_SECONDS = 0.05       # the loop never waits longer for another process's lock


class Telemetry:
    def __init__(self, path: Path | str, *, retention_days: float = 7, batch_size: int = 10,
                 flush_seconds: float = 5.0, clock: Callable[[], float] = time.time,
                 health: storage.StorageHealth | None = None):
        self.path = Path(path)
        self.retention_seconds = retention_days * 86400
        self.batch_size = batch_size
        self.flush_seconds = flush_seconds
        self.clock = clock
        self.health = health if health is not None else storage.health
        self._buffer: deque[dict] = deque()   # appended on the loop, drained under the lock
        self._buffer_lock = threading.Lock()  # only for the buffer's own changes: never waits on disk
        self._lock = threading.Lock()
        self._db: sqlite_utils.Database | None = None
        self._flushed_at = clock()
        self._retry_at = 0.0
        self._pruned_at: float | None = None

    # ---- writing -----------------------------------------------------------------------------

    def append(self, row: dict) -> None:
        with self._buffer_lock:
            self._buffer.append({name: row.get(name) for name in COLUMNS})
            over = len(self._buffer) - MAX_BUFFERED
            for _ in range(max(0, over)):
                self._buffer.popleft()
        if over > 0:
            self.health.dropped(storage.Component.TELEMETRY, over,
                                why=f"more than {MAX_BUFFERED} telemetry rows wait for the disk")
        self.health.settle()                  # once a tick: recoveries that have become certain
        now = self.clock()
        if now < self._retry_at:
            return
        if len(self._buffer) >= self.batch_size or now - self._flushed_at >= self.flush_seconds:
            self.flush(wait=False)

    def flush(self, *, wait: bool = True) -> bool:
        """Write the buffered rows; False when `wait` is off and a read holds the connection, or
        when the disk refuses them: the fault is reported (once), not raised, and the rows stay
        buffered. The enforcer's tick and the chart's reads go on either way."""
        try:
            written = self._write(wait=wait)
        except (sqlite3.Error, OSError) as e:
            self._retry_at = self.clock() + RETRY_SECONDS
            self.health.set_pending(storage.Component.TELEMETRY, len(self._buffer))
            self.health.failed(storage.Component.TELEMETRY, storage.fault_of(e, self.path.parent),
                               f"{self.path.name}: {e}")
            return False
        if written:
            self._retry_at = 0.0
            self.health.set_pending(storage.Component.TELEMETRY, len(self._buffer))
            self.health.succeeded(storage.Component.TELEMETRY)
        return written

    def _write(self, *, wait: bool) -> bool:
        """Write the buffered rows; raises the disk's error, and the rows then stay buffered."""
        if not self._lock.acquire(blocking=wait):
            return False
        try:
            db = self._open()
            with self._buffer_lock:
                rows = list(self._buffer)
            if rows:
                with db.atomic():             # one transaction: all the rows or none, never twice
                    db[TABLE].insert_all(rows, batch_size=len(rows))
                written = {id(r) for r in rows}
                with self._buffer_lock:       # the rows written, not any appended (or dropped) since
                    while self._buffer and id(self._buffer[0]) in written:
                        self._buffer.popleft()
            self._flushed_at = now = self.clock()
            if self._pruned_at is None or now - self._pruned_at >= PRUNE_EVERY_SECONDS:
                self._pruned_at = now
                db[TABLE].delete_where("t < ?", [now - self.retention_seconds])
            return True
        finally:
            self._lock.release()

    def close(self) -> None:
        if not self.flush() and self._buffer:
            self.health.dropped(storage.Component.TELEMETRY, len(self._buffer),
                                why=f"{len(self._buffer)} telemetry rows could not be written before shutdown")
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def note(self) -> str | None:
        """Why recent points are not stored, for a reply that answers all the same."""
        return self.health.note(storage.Component.TELEMETRY)

    def _open(self) -> sqlite_utils.Database:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # shared with query threads; every use holds self._lock
            conn = sqlite3.connect(self.path, check_same_thread=False, timeout=BUSY_SECONDS)
            try:
                db = sqlite_utils.Database(conn)
                db.enable_wal()
                db.execute("PRAGMA synchronous=NORMAL")   # WAL's usual pairing: no fsync per commit
                db[TABLE].create(COLUMNS, if_not_exists=True)
                db[TABLE].create_index(["t"], index_name=f"{TABLE}_t", if_not_exists=True)
            except BaseException:
                conn.close()        # tried again on the next flush
                raise
            self._db = db
        return self._db

    # ---- reading -----------------------------------------------------------------------------

    def query(self, since: float, step: float | None = None, until: float | None = None, *,
              limit: int = MAX_POINTS) -> list[dict]:
        """Rows with since <= t < until, oldest first; at most the newest `limit`. With `step`, one
        point per `step`-second bucket, its `t` the bucket's start."""
        if step is not None and not (math.isfinite(step) and step > 0):
            raise ValueError(f"step must be a positive number, not {step!r}")
        self.flush()
        with self._buffer_lock:
            unwritten = [r for r in self._buffer if r["t"] >= since and (until is None or r["t"] < until)]
        where, params = "t >= :since", {"since": since, "limit": limit}
        if until is not None:
            where += " AND t < :until"
            params["until"] = until
        if step is None:
            sql = (f"SELECT {', '.join(COLUMNS)} FROM {TABLE} WHERE {where} ORDER BY t DESC LIMIT :limit")
        else:
            params["step"] = step
            peaks = ", ".join(f"max({c}) AS {c}" for c in PEAK_COLUMNS)
            # rows are appended in tick order, so the largest rowid of a bucket is its last row
            sql = (f"WITH b AS (SELECT CAST(t / :step AS INTEGER) AS bucket, max(rowid) AS last_id, {peaks} "
                   f"FROM {TABLE} WHERE {where} GROUP BY bucket ORDER BY bucket DESC LIMIT :limit) "
                   f"SELECT b.bucket * :step AS t, {', '.join('b.' + c for c in PEAK_COLUMNS)}, "
                   f"{', '.join('r.' + c for c in LAST_COLUMNS)} "
                   f"FROM b JOIN {TABLE} r ON r.rowid = b.last_id ORDER BY b.bucket DESC")
        try:
            with self._lock:
                rows = list(self._open().query(sql, params))
        except (sqlite3.Error, OSError) as e:    # the file cannot be read: the unwritten rows only
            self.health.failed(storage.Component.TELEMETRY, storage.fault_of(e, self.path.parent),
                               f"{self.path.name}: {e}")
            rows = []
        rows.reverse()
        points = [{name: row[name] for name in COLUMNS} for row in rows]
        return with_unwritten(points, unwritten, step)[-limit:] if unwritten else points


def with_unwritten(points: list[dict], rows: list[dict], step: float | None) -> list[dict]:
    """Stored points (oldest first) and rows not written yet, as one series: with `step`, the rows
    are bucketed as the SQL does (peaks, the last row's lines), joining a stored bucket of the same t."""
    if step is None:
        return sorted(points + rows, key=lambda p: p["t"])
    merged: dict[float, dict] = {}
    for point in points + [{**r, "t": int(r["t"] / step) * step} for r in rows]:
        merged[point["t"]] = _later(merged.get(point["t"]), point)
    return sorted(merged.values(), key=lambda p: p["t"])


def _later(earlier: dict | None, point: dict) -> dict:
    """One bucket from two: the peaks of both, the lines and level of the later."""
    if earlier is None:
        return point
    peaks = {c: max((v for v in (earlier[c], point[c]) if v is not None), default=None) for c in PEAK_COLUMNS}
    return {**point, **peaks}
