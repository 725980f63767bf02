"""The soak script (benchmarks/soak.py): its rules fire, one summary per rule, and a short real run
against a real server passes them."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import pytest

from tests.conftest import DEMO, ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

from soak_checks import EndState, Sample, Summary, all_loaded_once, bad_5xx, failures, hard_overrun_ticks, summarize
from soak_kinds import DROPPED, ERROR, OK, STREAM_ERROR, TIMEOUT, Result

MB = 10**6
GOOD = Summary(seconds=60, clients=2, requests={"200 ok": 50}, samples=60, hard_bytes=950 * MB,
               peak_usage=600 * MB, hard_overrun_ticks=1, loads=20, evictions_metric={"lru": 18, "manual": 2},
               evictions_history={"lru": 18, "manual": 2}, rss_start=150 * MB, rss_end=450 * MB, rotations=20,
               rss_first_rotation=400 * MB, overhead_first_rotation=250 * MB, overhead_last_rotation=285 * MB,
               end_active=190 * MB, end_accounted=185 * MB, flushed_active=1 * MB)


def test_a_good_run_breaks_no_rule():
    assert failures(GOOD) == []


@pytest.mark.parametrize("change, message", [
    ({"died": True}, "the server process died"),
    ({"health_failures": 2}, "/health failed at 2 of 60 samples"),
    ({"bad_5xx": {"chat 500 engine_error": 3}}, "3 x chat 500 engine_error: a 5xx other than"),
    ({"unanswered": {"chat-stream dropped: RemoteProtocolError": 1}}, "every request must get an answer"),
    ({"hard_overrun_ticks": 2}, "above the hard line for 2 enforcer ticks"),
    ({"evictions_history": {"lru": 17, "manual": 2}}, "1 'lru' eviction(s) counted by /metrics are missing"),
    ({"evictions_unfreed": 1}, "1 eviction(s) in the history with no bytes freed"),
    ({"end_leases": 1}, "1 lease(s) still held"),
    ({"end_requests": 1}, "1 request(s) still running or queued"),
    ({"end_active": 195 * MB}, "with the clients stopped is more than 1.05 x"),
    ({"flushed_active": 12 * MB}, "after every model was unloaded"),
    ({"overhead_last_rotation": 291 * MB}, "RSS grew by 41 MB beside MLX's memory"),
])
def test_each_rule_fails_the_run(change, message):
    broken = failures(replace(GOOD, **change))
    assert len(broken) == 1 and message in broken[0], broken


def test_a_truncated_history_is_not_called_missing():
    assert failures(replace(GOOD, evictions_history={"lru": 3}, history_truncated=True)) == []


@pytest.mark.parametrize("result, bad", [
    (Result("chat", "m", OK, 200), False),
    (Result("chat", "m", ERROR, 503, "memory_pressure", retry_after=True), False),
    (Result("chat", "m", ERROR, 503, "memory_pressure", retry_after=False), True),    # 503 needs Retry-After
    (Result("anthropic", "m", ERROR, 529, "overloaded_error", retry_after=True), False),
    (Result("chat", "m", ERROR, 507, "insufficient_memory"), False),
    (Result("chat", "m", ERROR, 500, "engine_error"), True),
    (Result("chat", "m", ERROR, 502, None), True),
    (Result("chat", "m", ERROR, 409, "load_aborted"), False),
    (Result("chat", "m", STREAM_ERROR, 200, "memory_pressure"), False),
    (Result("chat", "m", STREAM_ERROR, 200, "engine_error"), True),
    (Result("anthropic", "m", STREAM_ERROR, 200, "api_error"), True),
    (Result("chat", "m", DROPPED), False),        # no status: counted as unanswered instead
])
def test_which_answers_are_a_bad_5xx(result, bad):
    assert bad_5xx(result) is bad


def _over(t, tick, usage=1000):
    return Sample(t, True, True, usage=usage, hard=950, last_tick_at=tick, rss=usage)


@pytest.mark.parametrize("samples, ticks", [
    ([_over(0, 0, 500), _over(1, 1, 500)], 0),
    ([_over(0, 0), _over(1, 0)], 0),                     # no tick since it crossed
    ([_over(0, 0), _over(1, 1), _over(2, 1, 500)], 1),   # one tick, then under
    ([_over(0, 0), _over(1, 1), _over(2, 2)], 2),        # still over after a second tick
    ([_over(0, 0), _over(1, 1), _over(2, 2, 500), _over(3, 3), _over(4, 4)], 1),   # two separate stretches
])
def test_ticks_above_the_hard_line(samples, ticks):
    assert hard_overrun_ticks(samples) == ticks


def test_summarize_counts_missing_history_and_leftover_requests():
    metrics = ('# TYPE evictions counter\nevictions_total{reason="lru"} 3.0\n'
               '# TYPE model_loads counter\nmodel_loads_total 4.0\n')
    end = EndState(settled={"models": [{"id": "a", "state": "loaded", "active_requests": 1, "running": 1,
                                        "queued": 0, "measured_bytes": 50 * MB}],
                            "memory": {"active_bytes": 50 * MB}},
                   flushed={"memory": {"active_bytes": 0}},
                   history=[{"action": "unload", "reason": "lru", "freed_bytes": 50 * MB},
                            {"action": "unload", "reason": "lru", "freed_bytes": 0},
                            {"action": "reclaim", "reason": "cache_reclaim", "freed_bytes": 0}],
                   metrics_text=metrics)
    results = [Result("chat", "a", OK, 200, seconds=1.0), Result("chat", "a", TIMEOUT, detail="no answer")]
    s = summarize(results, [], end, seconds=10, clients=1)
    assert s.loads == 4 and s.evictions_metric == {"lru": 3} and s.evictions_history == {"lru": 2}
    assert (s.evictions_unfreed, s.end_leases, s.end_requests) == (1, 1, 1)
    assert s.unanswered == {"chat timeout: no answer": 1}
    assert len(failures(s)) == 5, failures(s)


@pytest.mark.parametrize("loaded, warm_at", [
    ([("a",), ("a", "b"), ("b",), ("c",), ("a", "c")], 3.0),     # c loads first at t=3
    ([("a",), ("a",), ("a",)], 0.0),
    ([(), ("a",), ("b",)], 2.0),
    ([], 0.0),
])
def test_rotations_count_once_every_model_has_loaded(loaded, warm_at):
    assert all_loaded_once([Sample(float(t), True, True, loaded=names) for t, names in enumerate(loaded)]) == warm_at


def test_the_first_rotation_is_taken_once_every_model_has_loaded():
    """Growth while the first loads build what the server keeps per model is not a leak: with c's
    late first load the early rotations (overhead 100 MB) are left out, and 200 -> 210 MB passes."""
    samples = [Sample(float(t), True, True, rss=600 * MB, overhead=(100 if t < 12 else 200 + (t >= 30) * 10) * MB,
                      loads=t, loaded=("a", "b") if t < 12 else ("b", "c")) for t in range(40)]
    end = EndState(settled={"models": []}, flushed={"memory": {"active_bytes": 0}}, history=[],
                   metrics_text="")
    s = summarize([], samples, end, seconds=40, clients=1)
    assert s.rotations_from == 12.0
    assert (s.overhead_first_rotation, s.overhead_last_rotation) == (200 * MB, 210 * MB)


def test_a_short_soak_against_the_real_server_passes(session_dir, demo_model_dir):
    cache = session_dir / "soak-cache"
    cache.mkdir(exist_ok=True)
    if not (cache / DEMO).exists():
        (cache / DEMO).symlink_to(demo_model_dir)
    env = {**os.environ, "OMLX_BENCH_CACHE": str(cache), "OMLX_BENCH_LOG": str(session_dir / "soak-server.log")}
    run = subprocess.run([sys.executable, "benchmarks/soak.py", "--minutes", "0.3", "--clients", "2",
                          "--sizes", "20,22,24,26,28,30", "--budget", "75MB",
                          "--kinds", "chat,chat-stream,completion-stream,multiturn,multiturn-stream,tools,"
                                     "json-schema,anthropic-stream"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    out = run.stdout
    assert "PASSED: every check held" in out and "requests by status and code:" in out
    assert "200 ok" in out and "evictions by reason" in out and "skipped" not in out, out
