"""Shared by the pool storage-fault tests (test_storage_faults_*.py): a settable clock, a StorageHealth whose
reports are kept, and the real faults: another writer's lock on a SQLite file, a disk filled to the last
byte. The fixtures built on them (`global_health`, `tiny_tmpfs`) are in tests/pool/conftest.py."""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

from pool.storage import StorageHealth

NOW = 1_800_000_000.0


class Clock:
    def __init__(self, now: float = NOW):
        self.now = now

    def __call__(self) -> float:
        return self.now


class Reports:
    """A StorageHealth whose changes are kept, in order (recoveries reported at once unless a
    settle time is given)."""

    def __init__(self, health: StorageHealth | None = None, **kw):
        self.health = health or StorageHealth(**{"settle_seconds": 0, **kw})
        self.changes: list[tuple[str, str | None]] = []
        self.health.subscribe(lambda c: self.changes.append((str(c.component), c.fault and str(c.fault))))


def hold_lock(path: Path) -> sqlite3.Connection:
    """Another writer holding the database's write lock (the finding's BEGIN EXCLUSIVE)."""
    conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
    return conn


def fill(folder: Path) -> Path:
    """Fill the file system under `folder` to the last byte: the file that did (delete it for space)."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC
    return filler
