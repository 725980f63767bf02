"""Storage faults named and reported (pool/storage.py), in one process: real SQLite errors (another
connection's BEGIN EXCLUSIVE, `PRAGMA max_page_count`'s SQLITE_FULL, a read-only connection), OSErrors by
errno, a bare error named by probing its folder (a tiny tmpfs filled to the last byte, where this process may
mount), the error a client's refused write gets; then each fault and its recovery reported once, without
folder names, and the gauges. The writes that meet these faults are in test_storage_faults_database.py and
test_storage_faults_telemetry_cache.py; the server-level tests in tests/api/test_storage_faults_api.py."""

from __future__ import annotations

import errno
import json
import logging
import sqlite3
from pathlib import Path

import pytest

from pool import storage
from pool.api.errors import error_response
from pool.storage import Component, Fault, StorageHealth
from tests.pool.storage_fixtures import NOW, Clock, Reports, fill, hold_lock

# ---- naming a fault ---------------------------------------------------------------------------

def real_sqlite_errors(tmp_path: Path) -> dict[str, BaseException]:
    path = tmp_path / "db.sqlite3"
    setup = sqlite3.connect(path, isolation_level=None)
    setup.execute("PRAGMA journal_mode=WAL")
    setup.execute("CREATE TABLE t (x TEXT UNIQUE)")
    setup.execute("INSERT INTO t VALUES ('a')")
    found = {}

    def capture(name, fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            found[name] = e

    locker = hold_lock(path)
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    capture("locked", lambda: other.execute("INSERT INTO t VALUES ('b')"))
    locker.execute("ROLLBACK")
    pages = setup.execute("PRAGMA page_count").fetchone()[0]
    setup.execute(f"PRAGMA max_page_count = {pages}")
    capture("full", lambda: setup.execute("INSERT INTO t VALUES (?)", ("x" * 100_000,)))
    readonly = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    capture("read_only", lambda: readonly.execute("INSERT INTO t VALUES ('c')"))
    capture("constraint", lambda: other.execute("INSERT INTO t VALUES ('a')"))
    for conn in (setup, locker, other, readonly):
        conn.close()
    return found


def django_wrapped(error: BaseException) -> BaseException:
    from django.db.utils import OperationalError
    try:
        raise OperationalError(*error.args) from error
    except OperationalError as wrapped:
        return wrapped


@pytest.mark.parametrize("case, fault", [
    ("locked", Fault.BUSY),
    ("full", Fault.FULL),
    ("read_only", Fault.READ_ONLY),
    ("constraint", None),                     # a bug or a race, not the disk: not storage's
])
def test_real_sqlite_errors_are_named(tmp_path, case, fault):
    error = real_sqlite_errors(tmp_path)[case]
    assert storage.classify(error) == fault
    assert storage.classify(django_wrapped(error)) == fault     # what the ORM raises


@pytest.mark.parametrize("error, fault", [
    (OSError(errno.ENOSPC, "No space left on device"), Fault.FULL),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), Fault.FULL),
    (OSError(errno.EROFS, "Read-only file system"), Fault.READ_ONLY),
    (PermissionError(errno.EACCES, "Permission denied"), Fault.READ_ONLY),
    (OSError(errno.EIO, "Input/output error"), Fault.IO),
    (NotADirectoryError(errno.ENOTDIR, "Not a directory"), Fault.IO),
    (sqlite3.OperationalError("database is locked"), Fault.BUSY),      # no error name: by message
    (sqlite3.OperationalError("no such table: t"), None),
    (ValueError("not storage"), None),
    (RuntimeError("[save_safetensors] could not write"), None),       # mlx: the folder is probed instead
])
def test_errors_are_named_by_errno_or_message(error, fault):
    assert storage.classify(error) == fault


def test_a_bare_runtime_error_is_named_by_probing_its_folder(tmp_path, tiny_tmpfs):
    error = RuntimeError("[save_safetensors] could not write")
    assert storage.fault_of(error, tmp_path) == Fault.IO       # the folder takes writes: just I/O
    fill(tiny_tmpfs)
    assert storage.fault_of(error, tiny_tmpfs) == Fault.FULL


@pytest.mark.parametrize("fault, status, code, retry_after", [
    (Fault.BUSY, 503, "database_busy", "3"),
    (Fault.FULL, 507, "storage_full", None),
    (Fault.READ_ONLY, 507, "storage_read_only", None),
    (Fault.IO, 503, "storage_error", "3"),
])
def test_a_clients_write_that_cannot_be_stored_is_a_clear_error(fault, status, code, retry_after):
    response = error_response(storage.client_error(fault, retry_after=2.5))
    assert response.status_code == status
    assert response.get("Retry-After") == retry_after
    body = json.loads(response.content)["error"]
    assert body["code"] == code and "nothing was changed" in body["message"]


# ---- reporting once ---------------------------------------------------------------------------

@pytest.mark.parametrize("reported, fault, age, expected", [
    (False, Fault.FULL, None, "fault"),          # the first failure of an episode
    (True, Fault.FULL, 0, None),                 # the same episode: not again
    (True, Fault.IO, 0, None),                   # another kind within it: the gauge moves, no report
    (True, None, 3, None),                       # it works, but failed 3 s ago: not settled yet
    (True, None, 15, "recovered"),
    (False, None, 100, None),                    # all was well and is
])
def test_what_is_reported(reported, fault, age, expected):
    last = None if age is None else NOW - age
    assert storage.to_report(reported=reported, fault=fault, now=NOW, last_failure=last, settle=15) == expected


# (seconds from the start, outcome): what is reported, with a 15 s settle time
@pytest.mark.parametrize("outcomes, reported", [
    ([(0, "full"), (1, "full"), (2, "io_error"), (3, "full")], [("telemetry", "full")]),
    ([(0, "full"), (5, "ok"), (8, "full"), (30, "ok")], [("telemetry", "full"), ("telemetry", None)]),
    ([(0, "full"), (20, "ok")], [("telemetry", "full"), ("telemetry", None)]),
    ([(0, "ok"), (1, "ok")], []),
])
def test_a_fault_and_its_recovery_are_reported_once(outcomes, reported, caplog):
    clock = Clock()
    reports = Reports(clock=clock, settle_seconds=15)
    caplog.set_level(logging.INFO, "pool.storage")
    for at, outcome in outcomes:
        clock.now = NOW + at
        if outcome == "ok":
            reports.health.succeeded(Component.TELEMETRY)
        else:
            reports.health.failed(Component.TELEMETRY, Fault(outcome), "detail")
    assert reports.changes == reported
    assert len([r for r in caplog.records if r.name == "pool.storage"]) == len(reported)


def test_a_recovery_is_reported_on_a_quiet_tick_once_settled():
    clock = Clock()
    reports = Reports(clock=clock, settle_seconds=15)
    reports.health.failed(Component.DATABASE, Fault.BUSY, "locked")
    clock.now += 1
    reports.health.succeeded(Component.DATABASE, "3 history rows written late")
    reports.health.settle()
    assert reports.changes == [("database", "busy")]
    assert reports.health.states[Component.DATABASE].fault is None          # the gauge says so at once
    clock.now += 15
    reports.health.settle()
    assert reports.changes == [("database", "busy"), ("database", None)]


def test_events_and_notes_name_no_folders():
    reports = Reports()
    seen = []
    reports.health.subscribe(seen.append)
    reports.health.failed(Component.PROMPT_CACHE, Fault.FULL,
                          "a spill for m: Failed to open file /home/me/.omlx/prompt-cache/m/ab.partial")
    assert seen[0].text == "prompt_cache: the disk is full (a spill for m: Failed to open file ab.partial)"
    assert "/home" not in reports.health.note(Component.PROMPT_CACHE)


def test_the_gauges_follow_the_state():
    from prometheus_client import CollectorRegistry, generate_latest

    health = StorageHealth()
    registry = CollectorRegistry()
    registry.register(storage.StorageCollector(health))
    health.failed(Component.PROMPT_CACHE, Fault.READ_ONLY, "x")
    health.set_pending(Component.DATABASE, 3)
    health.dropped(Component.TELEMETRY, 2, why="test")
    text = generate_latest(registry).decode()
    assert 'storage_failing{component="prompt_cache"} 1.0' in text
    assert 'storage_failing{component="database"} 0.0' in text
    assert 'storage_fault{component="prompt_cache",fault="read_only"} 1.0' in text
    assert 'storage_pending_rows{component="database"} 3.0' in text
    assert 'storage_dropped_rows_total{component="telemetry"} 2.0' in text
    assert 'storage_write_failures_total{component="prompt_cache"} 1.0' in text
    health.succeeded(Component.PROMPT_CACHE)
    assert 'storage_failing{component="prompt_cache"} 0.0' in generate_latest(registry).decode()
