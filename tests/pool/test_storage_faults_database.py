"""Storage faults meeting the database, in one process against the real test database: a client's
settings write under another writer's lock is a 503 within the busy timeout, one the disk refuses
(SQLite's SQLITE_FULL, SQLITE_READONLY) a 507, and neither is half done; the server's own history rows
the locked database refuses are kept, in order and bounded, and written later with their own times.
How faults are named and reported is in test_storage_faults_reporting.py."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone

import pytest

from pool import events as events_module
from pool import services
from pool.api.errors import status_of
from pool.errors import DatabaseBusy, StorageUnavailable
from pool.events import EventLog
from pool.models import EvictionEvent, ModelSettings
from pool.policy.vocabulary import ActionKind, Reason
from pool.storage import Component
from tests.pool.storage_fixtures import NOW, Clock, Reports, hold_lock


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
