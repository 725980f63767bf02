"""Decision tables for pool.policy.idle: TTL and keep-alive. One row per case; pure."""

from __future__ import annotations

import pytest

from pool.policy.idle import expired, merge_keep_alive, next_expiry_in, ttl_remaining

from .tables import model, unloaded

# --- idle expiry ---------------------------------------------------------------------------

@pytest.mark.parametrize(
    "m, now, expected",
    [
        (model("m", idle_since=100, ttl_seconds=60), 159.9, []),
        (model("m", idle_since=100, ttl_seconds=60), 160, [("m", "ttl")]),
        (model("m", idle_since=100, ttl_seconds=60), 1000, [("m", "ttl")]),
        (model("m", idle_since=100, ttl_seconds=0), 100, [("m", "ttl")]),
        (model("m", idle_since=100, ttl_seconds=None), 10**9, []),
        (model("m", idle_since=100, ttl_seconds=60, pinned=True), 1000, []),
        (model("m", idle_since=100, ttl_seconds=60, leases=1), 1000, []),
        (model("m", state="loading", idle_since=100, ttl_seconds=60), 1000, []),
        (unloaded("m", idle_since=100, ttl_seconds=60), 1000, []),
        (model("m", state="failed", idle_since=100, ttl_seconds=60), 1000, []),
        (model("m", idle_since=100, ttl_seconds=600, keep_alive=0), 100, [("m", "keep_alive")]),
        (model("m", idle_since=100, keep_alive=0, leases=1), 100, []),
        (model("m", idle_since=100, keep_alive=0, pinned=True), 100, []),
        (model("m", idle_since=100, ttl_seconds=600, keep_alive=30), 129, []),
        (model("m", idle_since=100, ttl_seconds=600, keep_alive=30), 130, [("m", "keep_alive")]),
        (model("m", idle_since=100, ttl_seconds=10, keep_alive=30), 120, []),
        (model("m", idle_since=100, ttl_seconds=60, keep_alive=-1), 10**9, []),
    ],
    ids=[
        "ttl-just-before-the-boundary",
        "ttl-at-the-boundary",
        "ttl-long-past",
        "ttl-zero-unloads-once-idle",
        "no-ttl-never",
        "pinned-never",
        "busy-never",
        "loading-never",
        "unloaded-never",
        "failed-never",
        "keep-alive-zero-unloads-at-once",
        "keep-alive-zero-waits-while-busy",
        "keep-alive-zero-pinned-stays",
        "keep-alive-positive-before",
        "keep-alive-positive-at-the-boundary",
        "keep-alive-outranks-a-shorter-ttl",
        "keep-alive-minus-one-never-by-time",
    ],
)
def test_expired(m, now, expected):
    assert expired([m], now) == expected


def test_expired_reports_every_due_model_in_order():
    models = [
        model("a", idle_since=0, ttl_seconds=10),
        model("b", idle_since=0, ttl_seconds=100),
        model("c", idle_since=0, keep_alive=0),
        model("d", idle_since=0, ttl_seconds=10, pinned=True),
    ]
    assert expired(models, now=50) == [("a", "ttl"), ("c", "keep_alive")]


@pytest.mark.parametrize(
    "m, now, expected",
    [
        (model("m", idle_since=100, ttl_seconds=60), 130, 30.0),
        (model("m", idle_since=100, ttl_seconds=60), 500, 0.0),
        (model("m", idle_since=100, ttl_seconds=600, keep_alive=30), 110, 20.0),
        (model("m", idle_since=100, keep_alive=0), 100, 0.0),
        (model("m", idle_since=100, ttl_seconds=60, keep_alive=-1), 130, None),
        (model("m", idle_since=100, ttl_seconds=None), 130, None),
        (model("m", idle_since=100, ttl_seconds=60, pinned=True), 130, None),
        (model("m", idle_since=100, ttl_seconds=60, leases=1), 130, None),
        (unloaded("m", ttl_seconds=60), 130, None),
        (model("m", state="loading", ttl_seconds=60), 130, None),
    ],
    ids=[
        "ttl-counting-down",
        "ttl-due",
        "keep-alive-counting-down",
        "keep-alive-zero-due",
        "keep-alive-minus-one",
        "no-ttl",
        "pinned",
        "busy",
        "unloaded",
        "loading",
    ],
)
def test_ttl_remaining(m, now, expected):
    assert ttl_remaining(m, now) == expected


@pytest.mark.parametrize(
    "current, new, expected",
    [
        (None, None, None),
        (None, 300, 300),
        (300, None, 300),
        (None, 0, 0),
        (0, 300, 300),
        (300, 0, 300),
        (60, 300, 300),
        (300, 60, 300),
        (-1, 300, -1),
        (300, -1, -1),
        (-1, 0, -1),
        (0, 0, 0),
        (-1, -1, -1),
    ],
    ids=[
        "no-opinions",
        "none-takes-new",
        "new-none-keeps-current",
        "none-takes-zero",
        "positive-beats-zero",
        "zero-loses-to-positive",
        "longer-positive-wins",
        "longer-positive-stays",
        "forever-beats-positive",
        "positive-loses-to-forever",
        "forever-beats-zero",
        "zero-and-zero",
        "forever-and-forever",
    ],
)
def test_merge_keep_alive(current, new, expected):
    assert merge_keep_alive(current, new) == expected


# --- budget and ceiling maths --------------------------------------------------------------


@pytest.mark.parametrize(
    "models, expected",
    [
        ([], None),
        ([model("a", idle_since=100, ttl_seconds=60), model("b", idle_since=100, ttl_seconds=30)], 10),
        ([model("a", idle_since=100, ttl_seconds=60), model("b", idle_since=100, keep_alive=5)], 0),
        ([model("a", idle_since=100, ttl_seconds=60, pinned=True), unloaded("b", ttl_seconds=1)], None),
    ],
    ids=["no-models", "soonest-ttl", "a-due-keep-alive", "nothing-time-unloads"],
)
def test_next_expiry_in(models, expected):
    assert next_expiry_in(models, now=120) == expected
