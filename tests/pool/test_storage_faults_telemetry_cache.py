"""Storage faults meeting what the server writes in the background, in one process: telemetry rows the
disk refuses (a full file, another writer's lock, a data folder that is a file) are buffered, reported
once and still answered from memory, joined to the stored series; the prompt cache's disk tier counts a
refused spill (a folder gone, a tiny tmpfs filled to the last byte), reports it once and recovers, and
deletes at start the files a kill left unindexed. How faults are named and reported is in
test_storage_faults_reporting.py."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache

from pool.engines.disk_cache import DiskCache
from pool.observe.telemetry import RETRY_SECONDS, Telemetry, with_unwritten
from pool.storage import Component
from tests.pool.storage_fixtures import NOW, Clock, Reports, fill, hold_lock


def row(t: float, usage: int = 100, level: str = "ok") -> dict:
    return {"t": t, "usage": usage, "active": usage // 2, "cache": usage // 4, "rss": usage, "model_bytes": usage * 2,
            "ceiling": 1000, "soft": 900, "hard": 950, "level": level, "loaded": 1}


def kv(tokens: int, layers: int = 2) -> list[KVCache]:
    caches = [KVCache() for _ in range(layers)]
    for c in caches:
        c.update_and_fetch(mx.ones((1, 1, tokens, 8)), mx.ones((1, 1, tokens, 8)))
    return caches


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
