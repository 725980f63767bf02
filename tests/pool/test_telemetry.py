"""Telemetry: batched writes to its own WAL SQLite file, retention, the since filter and downsampling;
then Metrics, fed by pool listener calls and a snapshot."""

import sqlite3

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pool.observe.metrics import Metrics
from pool.observe.telemetry import PRUNE_EVERY_SECONDS, Telemetry
from pool.policy.vocabulary import Reason
from pool.serving.completion import CompletionSpec
from tests.fakes import Core, Spec, model_folders

DAY = 86400
NOW = 1_800_000_000.0


class Clock:
    def __init__(self, now: float = NOW):
        self.now = now

    def __call__(self) -> float:
        return self.now


def row(t: float, usage: int = 100, level: str = "ok", **extra) -> dict:
    return {"t": t, "usage": usage, "active": usage // 2, "cache": usage // 4, "rss": usage, "model_bytes": usage * 2,
            "ceiling": 1000, "soft": 900, "hard": 950, "level": level, "loaded": 1, **extra}


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def telemetry(tmp_path, clock):
    t = Telemetry(tmp_path / "telemetry.sqlite3", retention_days=7, clock=clock)
    yield t
    t.close()


def stored(telemetry) -> int:
    """Rows on disk, seen from another connection (not through the buffer)."""
    if not telemetry.path.exists():
        return 0
    with sqlite3.connect(telemetry.path) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        return conn.execute("SELECT count(*) FROM telemetry").fetchone()[0] if "telemetry" in tables else 0


def test_rows_are_written_in_batches_of_ten(telemetry):
    for i in range(9):
        telemetry.append(row(NOW + i))
    assert stored(telemetry) == 0
    telemetry.append(row(NOW + 9))
    assert stored(telemetry) == 10
    telemetry.append(row(NOW + 10))
    assert stored(telemetry) == 10


def test_a_batch_is_written_after_five_seconds(telemetry, clock):
    telemetry.append(row(NOW))
    assert stored(telemetry) == 0
    clock.now += 5
    telemetry.append(row(NOW + 5))
    assert stored(telemetry) == 2


def test_query_and_flush_see_buffered_rows(telemetry):
    telemetry.append(row(NOW, usage=7))
    assert [p["usage"] for p in telemetry.query(NOW - 60)] == [7]
    telemetry.append(row(NOW + 1))
    telemetry.flush()
    assert stored(telemetry) == 2


def test_unknown_keys_are_dropped_and_missing_ones_are_null(telemetry):
    telemetry.append({"t": NOW, "usage": 5, "extra": "ignored"})
    (point,) = telemetry.query(NOW - 1)
    assert point["usage"] == 5 and point["ceiling"] is None and "extra" not in point
    assert set(point) == {"t", "usage", "active", "cache", "rss", "model_bytes", "ceiling", "soft", "hard",
                          "level", "loaded"}


def test_wal_mode_and_time_index(telemetry):
    telemetry.append(row(NOW))
    telemetry.flush()
    with sqlite3.connect(telemetry.path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        indexes = {r[1]: r for r in conn.execute("PRAGMA index_list(telemetry)")}
        assert "telemetry_t" in indexes
        assert [r[2] for r in conn.execute("PRAGMA index_info(telemetry_t)")] == ["t"]
        plan = " ".join(str(r) for r in conn.execute("EXPLAIN QUERY PLAN SELECT * FROM telemetry WHERE t >= 1"))
        assert "telemetry_t" in plan


def test_retention_prunes_old_rows_at_most_once_a_minute(telemetry, clock):
    telemetry.append(row(NOW - 8 * DAY))
    telemetry.append(row(NOW - 6 * DAY))
    telemetry.flush()
    assert [p["t"] for p in telemetry.query(0)] == [NOW - 6 * DAY]
    telemetry.append(row(NOW - 9 * DAY))
    telemetry.flush()
    assert stored(telemetry) == 2          # pruned less than a minute ago
    clock.now += PRUNE_EVERY_SECONDS
    telemetry.flush()
    assert [p["t"] for p in telemetry.query(0)] == [NOW - 6 * DAY]


def test_retention_follows_the_setting(tmp_path, clock):
    t = Telemetry(tmp_path / "t.sqlite3", retention_days=1, clock=clock)
    t.append(row(NOW - 2 * DAY))
    t.append(row(NOW - 0.5 * DAY))
    assert [p["t"] for p in t.query(0)] == [NOW - 0.5 * DAY]
    t.close()


def test_since_and_until_filter(telemetry):
    for i in range(10):
        telemetry.append(row(NOW + i, usage=i))
    assert [p["usage"] for p in telemetry.query(NOW + 7)] == [7, 8, 9]
    assert [p["usage"] for p in telemetry.query(NOW + 2, until=NOW + 5)] == [2, 3, 4]
    assert telemetry.query(NOW + 100) == []


def test_downsampling_takes_the_peak_and_the_last_level(telemetry):
    base = NOW  # a multiple of 10, so buckets line up with rows
    usages = [5, 9, 1, 3, 2, 8, 8, 0, 4, 6, 7, 1]
    levels = ["ok", "hard", "soft", "ok", "ok", "soft", "ok", "ok", "ok", "hard", "soft", "ok"]
    for i, (usage, level) in enumerate(zip(usages, levels)):
        telemetry.append(row(base + 2 * i, usage=usage, level=level))   # 5 rows per 10 s bucket
    points = telemetry.query(base, step=10)
    assert [p["t"] for p in points] == [base, base + 10, base + 20]
    assert [p["usage"] for p in points] == [9, 8, 7]
    assert [p["model_bytes"] for p in points] == [18, 16, 14]
    assert [p["level"] for p in points] == ["ok", "hard", "ok"]


def test_downsampling_with_since_inside_a_bucket(telemetry):
    for i in range(20):
        telemetry.append(row(NOW + i, usage=i))
    points = telemetry.query(NOW + 15, step=10)
    assert [(p["t"], p["usage"]) for p in points] == [(NOW + 10, 19)]


def test_points_are_capped_to_the_newest(telemetry):
    for i in range(30):
        telemetry.append(row(NOW + i, usage=i))
    assert [p["usage"] for p in telemetry.query(NOW, limit=5)] == [25, 26, 27, 28, 29]
    assert [p["t"] for p in telemetry.query(NOW, step=10, limit=2)] == [NOW + 10, NOW + 20]


def test_bad_step_is_refused(telemetry):
    for step in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            telemetry.query(NOW, step=step)


def test_a_write_does_not_wait_for_a_reader(telemetry):
    telemetry.append(row(NOW))
    telemetry.flush()
    with telemetry._lock:                   # a query in progress on another thread
        assert telemetry.flush(wait=False) is False
        for i in range(1, 12):
            telemetry.append(row(NOW + i))   # buffered, not blocked
    assert stored(telemetry) == 1
    telemetry.flush()
    assert stored(telemetry) == 12


def test_reopening_keeps_rows(tmp_path, clock):
    path = tmp_path / "t.sqlite3"
    first = Telemetry(path, clock=clock)
    first.append(row(NOW))
    first.close()
    second = Telemetry(path, clock=clock)
    assert len(second.query(0)) == 1
    second.close()


# ---- Metrics: counted from the pool's changes, gauges read from the real snapshot at scrape time ----

MB = 10**6


def samples(metrics) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(metrics.render().decode()) for s in f.samples}


def watched(core: Core) -> Metrics:
    metrics = Metrics(snapshot=core.host.state)
    metrics.watch(core.pool)
    return metrics


@pytest.fixture
def core(tmp_path):
    """This process as a host over fake engines: a and b of 100 MB, a budget of 500 MB."""
    return Core(model_folders(tmp_path / "models", a=100 * MB, b=100 * MB), max_model_memory=500 * MB,
                memory_ceiling=1000 * MB, specs={"a": Spec(tokens=50, token_seconds=0.01)})


async def test_requests_are_counted_per_model(core):
    metrics = watched(core)
    for model in ("a", "a", "b", "a"):
        await core.complete(model)
    got = samples(metrics)
    assert got[("requests_total", (("model", "a"),))] == 3
    assert got[("requests_total", (("model", "b"),))] == 1
    await core.pool.shutdown()


async def test_unloads_count_as_evictions_and_every_event_by_reason(core):
    metrics = watched(core)
    await core.pool.load("a")
    await core.pool.unload("a")                                     # manual: an eviction
    await core.pool.load("b")
    await core.host.actions.mark_for_unload("b", reason=Reason.EMERGENCY)
    await core.host.actions.abort_requests("b", reason=Reason.EMERGENCY, message="x", code="memory_pressure")
    await core.host.actions.reclaim_caches()
    core.gate.on_reject("queue_full")
    got = samples(metrics)
    assert got[("evictions_total", (("reason", "manual"),))] == 1
    assert ("evictions_total", (("reason", "emergency"),)) not in got
    assert ("evictions_total", (("reason", "cache_reclaim"),)) not in got
    assert {r: got[("pool_events_total", (("reason", r),))] for r in ("manual", "emergency", "cache_reclaim")} == {
        "manual": 1, "emergency": 2, "cache_reclaim": 1}
    await core.pool.shutdown()


async def test_gauges_come_from_the_snapshot(core):
    metrics = watched(core)
    stream = await core.router.generate(CompletionSpec(model="a", prompt="x"))   # a loads and runs one
    core.memory.base = 805 * MB               # 905 MB of the 1000 MB ceiling: soft, and a is busy
    await core.enforcer.tick()
    got = samples(metrics)
    assert got[("memory_usage_bytes", ())] == 905 * MB and got[("model_budget_bytes", ())] == 500 * MB
    assert got[("memory_ceiling_bytes", ())] == 1000 * MB
    assert got[("memory_pressure_level", ())] == 1
    assert got[("memory_pressure", (("level", "soft"),))] == 1 and got[("memory_pressure", (("level", "ok"),))] == 0
    assert got[("admission_paused", ())] == 1 and got[("admission_waiting", ())] == 0
    assert got[("loaded_models", ())] == 1
    assert got[("active_requests", (("model", "a"),))] == 1
    assert got[("model_state", (("model", "b"), ("state", "unloaded")))] == 1
    assert got[("model_measured_bytes", (("model", "a"),))] == 100 * MB
    assert got[("model_loads_total", ())] == 1 and got[("model_load_seconds_total", ())] == 0
    await stream.aclose()
    core.memory.base = 0
    await core.enforcer.tick()
    assert samples(metrics)[("memory_pressure_level", ())] == 0
    await core.pool.shutdown()


async def test_each_runtime_has_its_own_registry(tmp_path):
    first = Core(model_folders(tmp_path / "one", a=MB))
    second = Core(model_folders(tmp_path / "two", a=MB))
    first_metrics, second_metrics = watched(first), watched(second)
    await first.complete("a")
    assert samples(first_metrics)[("requests_total", (("model", "a"),))] == 1
    assert ("requests_total", (("model", "a"),)) not in samples(second_metrics)
    await first.pool.shutdown()
