"""The enforcer's time series: one row per tick in its own SQLite file ($OMLX_HOME/telemetry.sqlite3).

Rows are buffered and written in small batches (WAL, an index on `t`); rows older than the
retention are pruned at most once a minute. Writes are a few rows at a time and run inline on the
event loop; reads (`query`) may run on a worker thread, so one connection is shared under a lock,
and a write that finds a read in progress leaves its rows for the next tick instead of waiting."""

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

log = logging.getLogger(__name__)

TABLE = "telemetry"
COLUMNS = {"t": float, "usage": int, "active": int, "cache": int, "rss": int, "model_bytes": int,
           "ceiling": int, "soft": int, "hard": int, "level": str, "loaded": int}
# per bucket: the peak of the memory quantities, the last value of the lines and the level
PEAK_COLUMNS = ("usage", "active", "cache", "rss", "model_bytes", "loaded")
LAST_COLUMNS = ("ceiling", "soft", "hard", "level")
MAX_POINTS = 2000
PRUNE_EVERY_SECONDS = 60.0


class Telemetry:
    def __init__(self, path: Path | str, *, retention_days: float = 7, batch_size: int = 10,
                 flush_seconds: float = 5.0, clock: Callable[[], float] = time.time):
        self.path = Path(path)
        self.retention_seconds = retention_days * 86400
        self.batch_size = batch_size
        self.flush_seconds = flush_seconds
        self.clock = clock
        self._buffer: deque[dict] = deque()   # appended on the loop, drained under the lock
        self._lock = threading.Lock()
        self._db: sqlite_utils.Database | None = None
        self._flushed_at = clock()
        self._pruned_at: float | None = None

    # ---- writing -----------------------------------------------------------------------------

    def append(self, row: dict) -> None:
        self._buffer.append({name: row.get(name) for name in COLUMNS})
        if len(self._buffer) >= self.batch_size or self.clock() - self._flushed_at >= self.flush_seconds:
            try:
                self.flush(wait=False)
            except (sqlite3.Error, OSError):  # a full disk must not stop the enforcer's tick
                log.exception("could not write telemetry to %s", self.path)

    def flush(self, *, wait: bool = True) -> bool:
        """Write the buffered rows; False when `wait` is off and a read holds the connection."""
        if not self._lock.acquire(blocking=wait):
            return False
        try:
            db = self._open()
            rows = []
            while self._buffer:
                rows.append(self._buffer.popleft())
            if rows:
                db[TABLE].insert_all(rows, batch_size=len(rows))
            self._flushed_at = now = self.clock()
            if self._pruned_at is None or now - self._pruned_at >= PRUNE_EVERY_SECONDS:
                db[TABLE].delete_where("t < ?", [now - self.retention_seconds])
                self._pruned_at = now
            return True
        finally:
            self._lock.release()

    def close(self) -> None:
        self.flush()
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def _open(self) -> sqlite_utils.Database:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # shared with query threads; every use holds self._lock
            db = sqlite_utils.Database(sqlite3.connect(self.path, check_same_thread=False))
            db.enable_wal()
            db.execute("PRAGMA synchronous=NORMAL")   # WAL's usual pairing: no fsync per commit
            db[TABLE].create(COLUMNS, if_not_exists=True)
            db[TABLE].create_index(["t"], index_name=f"{TABLE}_t", if_not_exists=True)
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
        with self._lock:
            rows = list(self._open().query(sql, params))
        rows.reverse()
        return [{name: row[name] for name in COLUMNS} for row in rows]
