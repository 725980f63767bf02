"""The measured load rate, a loading model's progress and the words a stream and a refusal use."""

from __future__ import annotations

import pytest

from pool.policy.load_progress import DEFAULT_BYTES_PER_SECOND, LOADS_KEPT, LoadRate, describe, progress


def test_the_rate_is_the_default_until_a_load_is_measured():
    rate = LoadRate()
    assert rate.bytes_per_second() == DEFAULT_BYTES_PER_SECOND
    rate.record(0, 1.0)             # nothing read, or no time measured: not a measurement
    rate.record(10**9, None)
    rate.record(10**9, 0.0)
    assert rate.measured == 0 and rate.bytes_per_second() == DEFAULT_BYTES_PER_SECOND


def test_the_rate_is_bytes_over_seconds_of_the_last_loads():
    rate = LoadRate()
    rate.record(2 * 10**9, 1.0)
    rate.record(10**9, 3.0)
    assert rate.bytes_per_second() == pytest.approx(3 * 10**9 / 4)
    for _ in range(LOADS_KEPT):
        rate.record(10**8, 1.0)     # the oldest are forgotten
    assert rate.bytes_per_second() == pytest.approx(10**8)


@pytest.mark.parametrize(("done", "total", "rate", "expected"), [
    (0, 1000, 100.0, {"bytes_done": 0, "bytes_total": 1000, "eta_seconds": 10.0}),
    (450, 1000, 100.0, {"bytes_done": 450, "bytes_total": 1000, "eta_seconds": 5.5}),
    (1200, 1000, 100.0, {"bytes_done": 1000, "bytes_total": 1000, "eta_seconds": 0.0}),   # never past the total
    (10, 1000, 0.0, {"bytes_done": 10, "bytes_total": 1000, "eta_seconds": None}),
])
def test_progress(done, total, rate, expected):
    assert progress(done, total, rate) == expected


@pytest.mark.parametrize(("load", "words"), [
    ({"bytes_done": 1_215_000_000, "bytes_total": 2_700_000_000, "eta_seconds": 3.2},
     "loading m 45% (1.2 GB of 2.7 GB), ~3 s left"),
    ({"bytes_done": 0, "bytes_total": 2_700_000_000, "eta_seconds": 0.2}, "loading m 0% (0 B of 2.7 GB), ~1 s left"),
    ({"bytes_done": 5, "bytes_total": 10, "eta_seconds": None}, "loading m 50% (5 B of 10 B)"),
    (None, "waiting for m"),
])
def test_describe(load, words):
    assert describe("m", load) == words
