"""Storage faults in one process, against real SQLite files and real folders: how a failed write is
named (pool/storage.py), that it is reported once, that a client's write is refused and not half
done, and that the server's own rows (history, telemetry) are kept and written later.

Faults are real: another connection's BEGIN EXCLUSIVE (busy), SQLite's own page limit
(`PRAGMA max_page_count`: the SQLITE_FULL a full disk gives), `PRAGMA query_only` (the
SQLITE_READONLY of a read-only file), a folder that is a file (ENOTDIR), and, where this process
may mount, a tiny tmpfs filled to the last byte. The server-level tests are in
tests/api/test_storage_faults_api.py."""

from __future__ import annotations

import asyncio
import errno
import logging
import sqlite3
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache

from pool import events as events_module
from pool import services, storage
from pool.api.errors import error_response, status_of
from pool.engines.disk_cache import DiskCache
from pool.errors import DatabaseBusy, StorageUnavailable
from pool.events import EventLog
from pool.models import EvictionEvent, ModelSettings
from pool.observe.telemetry import RETRY_SECONDS, Telemetry, with_unwritten
from pool.policy.vocabulary import ActionKind, Reason
from pool.storage import Component, Fault, StorageHealth

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


def row(t: float, usage: int = 100, level: str = "ok") -> dict:
    return {"t": t, "usage": usage, "active": usage // 2, "cache": usage // 4, "rss": usage, "model_bytes": usage * 2,
            "ceiling": 1000, "soft": 900, "hard": 950, "level": level, "loaded": 1}


def kv(tokens: int, layers: int = 2) -> list[KVCache]:
    caches = [KVCache() for _ in range(layers)]
    for c in caches:
        c.update_and_fetch(mx.ones((1, 1, tokens, 8)), mx.ones((1, 1, tokens, 8)))
    return caches


def hold_lock(path: Path) -> sqlite3.Connection:
    """Another writer holding the database's write lock (the finding's BEGIN EXCLUSIVE)."""
    conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
    return conn


@pytest.fixture
def global_health():
    """The process-wide record (the disk tier and settings writes report there), fresh."""
    storage.health.reset(settle_seconds=0)
    reports = Reports(storage.health)
    yield reports
    storage.health.reset()


@pytest.fixture
def short_busy_timeout(test_db):
    """This process's connections wait 0.5 s for a lock (OMLX_DB_BUSY_TIMEOUT in a server)."""
    from django.db import connection

    options = connection.settings_dict["OPTIONS"]
    old = options["timeout"]
    options["timeout"] = 0.5
    connection.close()
    yield 0.5
    options["timeout"] = old
    connection.close()


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 1 MB tmpfs (root only): a disk that really fills. Skipped where mounting is not allowed."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root): the full-disk case runs where it can")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(folder: Path) -> Path:
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC
    return filler


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
    body = __import__("json").loads(response.content)["error"]
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


# ---- a client's settings write: refused whole, never half done ---------------------------------

def test_a_settings_write_under_another_writers_lock_is_a_503_within_the_busy_timeout(
        models_dir, test_db, short_busy_timeout, global_health):
    services.write_model_settings(model_id="alpha", changes={"ttl_seconds": 60})
    lock = hold_lock(test_db)
    try:
        started = time.monotonic()
        with pytest.raises(DatabaseBusy) as refused:
            services.write_model_settings(model_id="alpha", changes={"is_pinned": True, "ttl_seconds": 5})
        assert time.monotonic() - started < 0.5 + 1.0
        assert status_of(refused.value) == 503 and refused.value.retry_after == 1
        assert ModelSettings.objects.get(model_id="alpha").ttl_seconds == 60     # reads go on meanwhile
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    row = ModelSettings.objects.get(model_id="alpha")
    assert (row.is_pinned, row.ttl_seconds) == (False, 60)                        # nothing half done
    assert global_health.changes == [("database", "busy")]
    services.write_model_settings(model_id="alpha", changes={"is_pinned": True})
    assert ModelSettings.objects.get(model_id="alpha").is_pinned
    assert global_health.changes == [("database", "busy"), ("database", None)]


@pytest.mark.parametrize("pragma, error, code", [
    ("max_page_count = {pages}", StorageUnavailable, "storage_full"),   # SQLite's SQLITE_FULL
    ("query_only = 1", StorageUnavailable, "storage_read_only"),       # SQLITE_READONLY
])
def test_a_settings_write_the_disk_refuses_is_a_507_and_changes_nothing(models_dir, global_health,
                                                                        pragma, error, code):
    from django.db import connection

    services.write_model_settings(model_id="alpha", changes={"notes": "before"})
    with connection.cursor() as cursor:
        pages = cursor.execute("PRAGMA page_count").fetchone()[0]
        cursor.execute("PRAGMA " + pragma.format(pages=pages))
    try:
        with pytest.raises(error) as refused:
            services.write_model_settings(model_id="alpha", changes={"notes": "after " * 20_000, "is_pinned": True})
        assert status_of(refused.value) == 507 and refused.value.code == code
    finally:
        connection.close()        # the next connection has neither pragma
    row = ModelSettings.objects.get(model_id="alpha")
    assert (row.notes, row.is_pinned) == ("before", False)
    assert global_health.changes == [("database", code.removeprefix("storage_"))]


# ---- the server's own history rows: kept, in order, written later -------------------------------

async def test_history_rows_the_locked_database_refuses_are_kept_and_written_later(models_dir, test_db,
                                                                                   monkeypatch):
    monkeypatch.setattr(events_module, "RETRY_SECONDS", 0.1)
    reports, clock = Reports(), Clock()
    log = EventLog(recorder=services.record_event, clock=clock, health=reports.health)
    log.watch_storage()
    lock = hold_lock(test_db)
    try:
        started = time.monotonic()
        first = await log.record(action=ActionKind.UNLOAD, reason=Reason.MANUAL, model_id="a", freed_bytes=10)
        clock.now += 1
        second = await log.record(action=ActionKind.UNLOAD, reason=Reason.LRU, model_id="b", freed_bytes=20)
        assert time.monotonic() - started < 1.5           # the unload does not wait out a busy timeout
        assert first["stored"] is False and second["stored"] is False and first["model"] == "a"
        await asyncio.sleep(0.3)                          # retries meanwhile fail: still kept, reported once
        assert [e["model"] for e in log.unstored()][-2:] == ["b", "a"]
        assert reports.changes == [("database", "busy")]
        assert reports.health.states[Component.DATABASE].pending == 3       # and the fault's own event
        assert await EvictionEvent.objects.acount() == 0
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    for _ in range(50):
        if not log.pending:
            break
        await asyncio.sleep(0.1)
    rows = [r async for r in EvictionEvent.objects.order_by("id")]
    assert [(r.model_id, r.reason) for r in rows][:3] == [("a", "manual"), ("b", "lru"), ("", "storage_fault")]
    assert rows[0].created_at == datetime.fromtimestamp(NOW, timezone.utc)    # its own time, not the write's
    assert rows[1].created_at == datetime.fromtimestamp(NOW + 1, timezone.utc)
    assert first["id"] == rows[0].id and "stored" not in first                # the timeline's copy caught up
    assert reports.changes == [("database", "busy"), ("database", None)]
    for _ in range(50):             # the recovery's own event, written at once
        if await EvictionEvent.objects.filter(reason="storage_recovered").aexists():
            break
        await asyncio.sleep(0.1)
    assert await EvictionEvent.objects.filter(reason="storage_recovered").acount() == 1
    await log.close()


async def test_the_kept_rows_are_bounded_and_what_is_lost_is_counted(models_dir, test_db, monkeypatch, caplog):
    monkeypatch.setattr(events_module, "MAX_PENDING", 3)
    reports = Reports()
    log = EventLog(recorder=services.record_event, health=reports.health)
    lock = hold_lock(test_db)
    try:
        for i in range(5):
            await log.record(action=ActionKind.UNLOAD, reason=Reason.LRU, model_id=f"m{i}")
        assert [e["model"] for e in log.unstored()] == ["m4", "m3", "m2"]
        assert reports.health.states[Component.DATABASE].dropped == 2
        await log.close()                                 # still locked at shutdown: lost, and said so
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    assert reports.health.states[Component.DATABASE].dropped == 5
    assert "history row lost at shutdown" in caplog.text and "'m4'" in caplog.text


async def test_a_row_refused_for_another_reason_is_logged_and_not_retried(caplog):
    async def refuses(**event):
        raise ValueError("a bug")
    reports = Reports()
    log = EventLog(recorder=refuses, health=reports.health)
    shown = await log.record(action=ActionKind.UNLOAD, reason=Reason.LRU, model_id="a")
    assert not log.pending and "stored" not in shown and reports.changes == []
    assert "could not record event lru" in caplog.text


# ---- telemetry: buffered while the disk refuses, reported once, answered all the same ---------

def stored(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT count(*) FROM telemetry").fetchone()[0]


def test_telemetry_rows_the_full_file_refuses_are_kept_and_written_when_it_takes_them(tmp_path):
    clock = Clock()
    reports = Reports(clock=clock, settle_seconds=15)
    t = Telemetry(tmp_path / "telemetry.sqlite3", clock=clock, health=reports.health)
    t.append(row(NOW))
    t.flush()
    pages = t._db.execute("PRAGMA page_count").fetchone()[0]
    t._db.execute(f"PRAGMA max_page_count = {pages}")     # SQLite's SQLITE_FULL, as a full disk gives
    for i in range(1, 400):
        clock.now = NOW + i
        t.append(row(NOW + i, usage=i))
    assert reports.changes == [("telemetry", "full")]        # once, not per tick
    assert 0 < stored(t.path) < 400
    points = t.query(NOW - 1)
    assert [p["t"] for p in points] == [NOW + i for i in range(400)]     # the chart still sees every tick
    assert "the disk is full" in t.note()
    assert [p["usage"] for p in t.query(NOW, step=100)] == [100, 199, 299, 399]
    t._db.execute("PRAGMA max_page_count = 1073741823")     # space again
    clock.now += RETRY_SECONDS
    t.append(row(clock.now, usage=1))
    assert stored(t.path) == 401 and t.note() is None
    assert reports.changes == [("telemetry", "full")]        # settling: no failure for 15 s yet
    clock.now += 15
    t.append(row(clock.now, usage=1))
    assert reports.changes == [("telemetry", "full"), ("telemetry", None)]
    t.close()


def test_telemetry_never_makes_the_loop_wait_for_another_writers_lock(tmp_path):
    reports, clock = Reports(), Clock()
    t = Telemetry(tmp_path / "telemetry.sqlite3", clock=clock, health=reports.health, batch_size=1)
    t.append(row(NOW))
    lock = hold_lock(t.path)
    waits = []
    for i in range(1, 50):
        clock.now = NOW + i
        started = time.monotonic()
        t.append(row(NOW + i))
        waits.append(time.monotonic() - started)
    assert max(waits) < 0.5                              # a try of ~50 ms every 5 s, never seconds
    assert sum(w > 0.02 for w in waits) <= 10
    assert reports.changes == [("telemetry", "busy")]
    lock.execute("ROLLBACK")
    lock.close()
    clock.now += RETRY_SECONDS
    t.append(row(clock.now))
    assert stored(t.path) == 51 and reports.changes[-1] == ("telemetry", None)
    t.close()


def test_telemetry_that_cannot_open_its_file_answers_from_memory(tmp_path):
    (tmp_path / "home").write_text("a file where the data folder should be")
    reports, clock = Reports(), Clock()
    t = Telemetry(tmp_path / "home" / "telemetry.sqlite3", clock=clock, health=reports.health, batch_size=2)
    for i in range(5):
        t.append(row(NOW + i, usage=i))
    assert [p["usage"] for p in t.query(NOW)] == [0, 1, 2, 3, 4]
    assert reports.changes == [("telemetry", "io_error")] and "5 rows wait in memory" in t.note()
    t.close()
    assert reports.health.states[Component.TELEMETRY].dropped == 5     # lost at shutdown, and counted


@pytest.mark.parametrize("stored_points, rows, step, expected", [
    ([], [row(10, 1), row(12, 5)], None, [(10, 1), (12, 5)]),
    ([row(5, 9)], [row(10, 1)], None, [(5, 9), (10, 1)]),
    ([row(0, 3)], [row(2, 7), row(4, 1), row(11, 2)], 10, [(0, 7), (10, 2)]),    # joins the stored bucket
    ([row(0, 9)], [row(3, 1)], 10, [(0, 9)]),                                     # the stored peak stays
])
def test_unwritten_rows_join_the_stored_series(stored_points, rows, step, expected):
    assert [(p["t"], p["usage"]) for p in with_unwritten(stored_points, rows, step)] == expected


def test_a_merged_bucket_takes_the_later_level():
    (point,) = with_unwritten([row(0, 5, level="hard")], [row(3, 1, level="ok")], 10)
    assert (point["usage"], point["level"]) == (5, "ok")


# ---- the prompt cache's disk tier: a refused spill is counted and reported once ----------------

def test_spills_into_a_folder_that_is_gone_are_reported_once_and_never_raise(tmp_path, global_health):
    folder = tmp_path / "m"
    disk = DiskCache(folder, max_bytes=10**9, fingerprint="f")
    disk.put([1] * 20, kv(20))
    for child in folder.iterdir():
        child.unlink()
    folder.rmdir()
    folder.write_text("not a folder any more")
    for i in range(5):
        disk.put([i + 2] * 20, kv(20))
    assert disk.stats.spill_failures == 5 and disk.stats.writes == 1
    assert global_health.changes == [("prompt_cache", "io_error")]


def test_spills_into_a_full_disk_are_reported_once_and_recover(tiny_tmpfs, global_health):
    disk = DiskCache(tiny_tmpfs / "m", max_bytes=10**9, fingerprint="f")
    filler = fill(tiny_tmpfs)
    for i in range(3):
        disk.put([i] * 200, kv(200))
    assert disk.stats.spill_failures == 3 and disk.entries == 0
    assert not list((tiny_tmpfs / "m").glob("*.safetensors"))      # no half file left behind
    filler.unlink()
    disk.put([7] * 200, kv(200))
    assert disk.entries == 1 and disk.load(disk.longest_prefix([7] * 200)[0]) is not None
    assert global_health.changes == [("prompt_cache", "full"), ("prompt_cache", None)]


def test_files_a_kill_left_unindexed_are_deleted_at_start(tmp_path):
    folder = tmp_path / "m"
    disk = DiskCache(folder, max_bytes=10**9, fingerprint="f")
    disk.put(list(range(30)), kv(30))
    (folder / "0123abcd.safetensors").write_bytes(b"renamed, but the index was not written")
    (folder / "0123abcd.partial.safetensors").write_bytes(b"half a file")
    again = DiskCache(folder, max_bytes=10**9, fingerprint="f")
    assert again.entries == 1 and sorted(p.name for p in folder.glob("*.safetensors")) == list(again._index)
