"""Decision tables for pool.policy: one row per case. Pure: no Django, no MLX."""

from __future__ import annotations

import pytest

from pool.policy import (
    GIB,
    Action,
    Lines,
    ModelView,
    Readings,
    auto_ceiling,
    auto_model_budget,
    classify,
    decide,
    expired,
    guard_reserve,
    kv_bytes,
    lru_ranks,
    lru_victims,
    merge_keep_alive,
    plan_admission,
    poll_interval,
    prefill_check,
    pressure_lines,
    ttl_remaining,
)


def gib(x: float) -> int:
    return int(x * GIB)


def model(id: str, size: float = 1, state: str = "loaded", **fields) -> ModelView:
    """A model of `size` GiB, loaded and idle unless told otherwise."""
    return ModelView(id=id, state=state, size_bytes=gib(size), **fields)


def unloaded(id: str, size: float = 1, **fields) -> ModelView:
    return model(id, size, state="unloaded", **fields)


# --- LRU victims ---------------------------------------------------------------------------

@pytest.mark.parametrize(
    "models, expected",
    [
        ([model("a", last_access=20), model("b", last_access=10)], ["b", "a"]),
        ([model("b", last_access=5), model("a", last_access=5)], ["a", "b"]),
        ([model("a", pinned=True), model("b")], ["b"]),
        ([model("a", leases=1), model("b")], ["b"]),
        ([model("a", state="loading"), model("b")], ["b"]),
        ([unloaded("a"), model("b")], ["b"]),
        ([model("a", state="failed"), model("b")], ["b"]),
        ([model("a", pinned=True), model("b", leases=2)], []),
    ],
    ids=[
        "least-recently-used-first",
        "ties-broken-by-id",
        "pinned-never-a-victim",
        "busy-never-a-victim",
        "loading-never-a-victim",
        "unloaded-never-a-victim",
        "failed-never-a-victim",
        "nothing-evictable",
    ],
)
def test_lru_victims(models, expected):
    assert [m.id for m in lru_victims(models)] == expected


@pytest.mark.parametrize(
    "models, expected",
    [
        ([model("a", last_access=3), model("b", last_access=1), model("c", last_access=2)],
         {"b": 0, "c": 1, "a": 2}),
        ([model("a", pinned=True), model("b", leases=1), model("c", state="loading"),
          unloaded("d"), model("e")],
         {"e": 0}),
        ([], {}),
    ],
    ids=["ranked-in-eviction-order", "pinned-busy-loading-unloaded-have-no-rank", "no-models"],
)
def test_lru_ranks(models, expected):
    assert lru_ranks(models) == expected


# --- admission -----------------------------------------------------------------------------

# A and B are 1 GiB and loaded; C (1 GiB) is asked for. With 25% headroom C needs 1.25 GiB, so
# under a 2.5 GiB budget exactly one of A and B has to go.
A_USED_LAST = [model("a", last_access=20), model("b", last_access=10), unloaded("c")]


@pytest.mark.parametrize(
    "models, target, options, expected",
    [
        (A_USED_LAST, "c", dict(budget=gib(2.5)),
         (True, ("b",), True, None, ())),
        ([model("a", last_access=20), model("b", last_access=10, pinned=True), unloaded("c")],
         "c", dict(budget=gib(2.5)),
         (True, ("a",), True, None, ())),
        ([model("a", last_access=10, leases=1), model("b", last_access=20), unloaded("c")],
         "c", dict(budget=gib(2.5)),
         (True, ("b",), True, None, ())),
        ([model("a", leases=1), model("b", leases=3), unloaded("c")],
         "c", dict(budget=gib(2.5)),
         (False, (), True, "insufficient_memory", ("a", "b"))),
        ([model("a", pinned=True), model("b", pinned=True), unloaded("c")],
         "c", dict(budget=gib(2.5)),
         (False, (), True, "insufficient_memory", ("a", "b"))),
        ([model("a", pinned=True), model("b", last_access=1), model("d", last_access=2),
          unloaded("c", size=2)],
         "c", dict(budget=gib(2.9)),
         (False, (), True, "insufficient_memory", ("a",))),
        ([model("a"), unloaded("c", size=3)], "c", dict(budget=gib(2.5)),
         (False, (), True, "model_too_large", ())),
        ([model("d", last_access=1), model("b", 0.25, last_access=2),
          model("a", 0.25, last_access=3), unloaded("c", size=3.5)],
         "c", dict(budget=gib(4)),
         (True, ("d",), False, None, ())),
        ([model("a", 2), unloaded("c", size=2)], "c", dict(budget=gib(4.25)),
         (True, ("a",), True, None, ())),
        ([model("a", 2, pinned=True), unloaded("c", size=2)], "c", dict(budget=gib(4.25)),
         (True, (), False, None, ())),
        ([model("a", last_access=3), model("b", last_access=1), model("d", last_access=2),
          unloaded("c")],
         "c", dict(budget=None, max_loaded=2),
         (True, ("b", "d"), True, None, ())),
        ([model("b", 0.5, last_access=1), model("a", 0.5, last_access=2),
          model("d", 0.5, last_access=3), unloaded("c")],
         "c", dict(budget=gib(2.5), max_loaded=2),
         (True, ("b", "a"), True, None, ())),
        ([model("a", pinned=True), model("b", leases=1), unloaded("c")],
         "c", dict(budget=None, max_loaded=2),
         (False, (), True, "too_many_models", ("a", "b"))),
        ([model("a", pinned=True), model("b", last_access=1), unloaded("c")],
         "c", dict(budget=None, max_loaded=2),
         (True, ("b",), True, None, ())),
        ([model("a", 100), model("b", 100), unloaded("c", 100)], "c", dict(budget=None),
         (True, (), True, None, ())),
        (A_USED_LAST, "c", dict(budget=gib(2.5), max_loaded=0),
         (True, ("b",), True, None, ())),
        ([model("a"), model("b"), model("c")], "c", dict(budget=gib(1), max_loaded=1),
         (True, (), True, None, ())),
        ([model("a"), model("c", state="loading")], "c", dict(budget=gib(1)),
         (True, (), True, None, ())),
        ([model("a", state="loading", last_access=1), model("b", last_access=2), unloaded("c")],
         "c", dict(budget=gib(2.5)),
         (True, ("b",), True, None, ())),
        ([model("a", 2, state="loading"), unloaded("c")], "c", dict(budget=gib(2.5)),
         (False, (), True, "insufficient_memory", ("a",))),
        ([model("a", state="loading"), unloaded("c")], "c", dict(budget=None, max_loaded=1),
         (False, (), True, "too_many_models", ("a",))),
        ([model("a", 10, state="failed"), unloaded("b", 10), unloaded("c")],
         "c", dict(budget=gib(1.25)),
         (True, (), True, None, ())),
        ([model("a", 4, measured_bytes=gib(1)), unloaded("c")], "c", dict(budget=gib(2.25)),
         (True, (), True, None, ())),
        ([model("a", last_access=1), unloaded("c", 2)], "c", dict(budget=gib(2), headroom=0),
         (True, ("a",), True, None, ())),
    ],
    ids=[
        "a-used-last-so-b-goes",
        "b-pinned-so-a-goes",
        "a-busy-so-b-goes",
        "both-busy-insufficient-memory-nothing-unloaded",
        "all-pinned-insufficient-memory",
        "all-or-nothing-evicting-every-victim-is-not-enough",
        "target-larger-than-budget",
        "fits-only-without-headroom-minimal-lru-victims",
        "evicting-for-headroom-beats-loading-without-it",
        "fits-without-headroom-beside-a-pinned-model",
        "count-cap-evicts-lru-with-budget-off",
        "memory-and-count-victims-one-lru-list",
        "count-cap-blocked-by-pinned-and-busy",
        "count-cap-skips-pinned",
        "budget-off-fits-anything",
        "max-loaded-zero-means-no-cap",
        "target-already-loaded",
        "target-already-loading",
        "loading-model-counted-but-never-a-victim",
        "loading-model-blocks-when-it-leaves-no-room",
        "loading-model-counts-toward-the-count-cap",
        "failed-and-unloaded-models-take-no-memory",
        "measured-bytes-replace-the-estimate",
        "zero-headroom",
    ],
)
def test_plan_admission(models, target, options, expected):
    plan = plan_admission(models, target, **options)
    assert (plan.fits, plan.victims, plan.with_headroom, plan.code, plan.blockers) == expected


@pytest.mark.parametrize(
    "models, options, expected",
    [
        (A_USED_LAST, dict(budget=gib(2.5)), (gib(1.25), gib(2), gib(2.5))),
        ([model("d", last_access=1), model("b", 0.25, last_access=2),
          model("a", 0.25, last_access=3), unloaded("c", size=3.5)],
         dict(budget=gib(4)), (gib(3.5), gib(1.5), gib(4))),
        ([model("a", 4, measured_bytes=gib(1)), unloaded("c")], dict(budget=None),
         (gib(1.25), gib(1), None)),
        ([model("a"), model("c", 2)], dict(budget=gib(4)), (0, gib(1), gib(4))),
    ],
    ids=["with-headroom", "without-headroom-needs-s-alone", "measured-footprint", "already-loaded"],
)
def test_plan_admission_bytes(models, options, expected):
    plan = plan_admission(models, "c", **options)
    assert (plan.needed_bytes, plan.resident_bytes, plan.budget_bytes) == expected


GB = 10**9


@pytest.mark.parametrize(
    "models, options, expected",
    [
        ([ModelView("a", "loaded", GB, pinned=True), ModelView("b", "loaded", GB, leases=1),
          ModelView("c", "unloaded", int(1.2 * GB))],
         dict(budget=2 * GB),
         "cannot load 'c' (1.2 GB + 25% KV headroom): 'a' is pinned and 'b' is serving a "
         "request; budget 2.0 GB"),
        ([ModelView("a", "loading", GB), ModelView("b", "loaded", GB, leases=2),
          ModelView("d", "loaded", GB, pinned=True), ModelView("c", "unloaded", GB)],
         dict(budget=3 * GB),
         "cannot load 'c' (1.0 GB + 25% KV headroom): 'a' is loading, 'b' is serving 2 requests "
         "and 'd' is pinned; budget 3.0 GB"),
        ([ModelView("c", "unloaded", 3 * GB)], dict(budget=2 * GB),
         "cannot load 'c': it needs 3.0 GB but the model budget is 2.0 GB"),
        ([ModelView("a", "loaded", GB, last_access=1), ModelView("b", "loaded", GB, last_access=2),
          ModelView("c", "unloaded", GB)],
         dict(budget=2 * GB),
         "loading 'c' (1.0 GB + 25% KV headroom) after unloading 'a' and 'b'; budget 2.0 GB"),
        ([ModelView("a", "loaded", GB), ModelView("c", "unloaded", int(1.8 * GB))],
         dict(budget=2 * GB),
         "loading 'c' (1.8 GB, without its 25% KV headroom) after unloading 'a'; budget 2.0 GB"),
        ([ModelView("c", "unloaded", GB)], dict(budget=None),
         "loading 'c' (1.0 GB + 25% KV headroom); memory budget off"),
        ([ModelView("a", "loaded", GB, pinned=True), ModelView("c", "unloaded", GB)],
         dict(budget=None, max_loaded=1),
         "cannot load 'c': at most 1 model may be loaded and 'a' is pinned"),
        ([ModelView("c", "loaded", GB)], dict(budget=GB), "'c' is already loaded"),
    ],
    ids=[
        "blocked-by-pinned-and-busy",
        "blocked-by-loading-busy-and-pinned",
        "too-large",
        "fits-after-unloading",
        "fits-without-headroom",
        "budget-off",
        "too-many-models",
        "already-loaded",
    ],
)
def test_plan_admission_message(models, options, expected):
    assert plan_admission(models, "c", **options).message == expected


def test_plan_admission_unknown_target():
    with pytest.raises(KeyError):
        plan_admission([model("a")], "zzz", budget=None)


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
    "total, expected",
    [
        (8 * GIB, GIB * 540 // 100),  # reserve clamped up to 2 GiB: 0.9 * 6
        (16 * GIB, GIB * 1152 // 100),  # reserve 3.2 GiB: 0.9 * 12.8
        (24 * GIB, GIB * 1728 // 100),  # reserve 4.8 GiB: 0.9 * 19.2
        (64 * GIB, GIB * 5040 // 100),  # reserve clamped down to 8 GiB: 0.9 * 56
        (256 * GIB, GIB * 22320 // 100),  # reserve 8 GiB: 0.9 * 248
    ],
    ids=["8GiB", "16GiB", "24GiB", "64GiB", "256GiB"],
)
def test_auto_model_budget(total, expected):
    assert auto_model_budget(total) == expected


@pytest.mark.parametrize(
    "guard, total, expected",
    [
        ("safe", 64 * GIB, 8 * GIB),
        ("balanced", 64 * GIB, 6 * GIB),
        ("aggressive", 64 * GIB, 4 * GIB),
        ("safe", 24 * GIB, 8 * GIB),
        ("safe", 24 * GIB - 1, 4 * GIB),
        ("safe", 16 * GIB, 4 * GIB),
        ("balanced", 16 * GIB, 4 * GIB),
        ("aggressive", 8 * GIB, 4 * GIB),
    ],
    ids=[
        "safe-64GiB",
        "balanced-64GiB",
        "aggressive-64GiB",
        "safe-at-24GiB-is-not-small",
        "safe-just-under-24GiB-is-small",
        "safe-16GiB",
        "balanced-16GiB",
        "aggressive-8GiB",
    ],
)
def test_guard_reserve(guard, total, expected):
    assert guard_reserve(guard, total) == expected


def test_guard_reserve_unknown_guard():
    with pytest.raises(ValueError):
        guard_reserve("reckless", 64 * GIB)


@pytest.mark.parametrize(
    "total, guard, device_limit, expected",
    [
        (64 * GIB, "balanced", None, 58 * GIB),
        (64 * GIB, "balanced", 48 * GIB, 48 * GIB),
        (64 * GIB, "balanced", 60 * GIB, 58 * GIB),
        (64 * GIB, "safe", 0, 56 * GIB),
        (16 * GIB, "safe", None, 12 * GIB),
    ],
    ids=[
        "no-device-limit",
        "device-limit-binds",
        "reserve-binds",
        "zero-device-limit-means-unknown",
        "small-system",
    ],
)
def test_auto_ceiling(total, guard, device_limit, expected):
    assert auto_ceiling(total, guard, device_limit) == expected


@pytest.mark.parametrize(
    "args, expected",
    [
        ((100 * GIB,), Lines(100 * GIB, 90 * GIB, 95 * GIB)),
        ((1000, 0.8, 0.9), Lines(1000, 800, 900)),
        ((999,), Lines(999, 899, 949)),
    ],
    ids=["default-fractions", "explicit-fractions", "rounds-down"],
)
def test_pressure_lines(args, expected):
    assert pressure_lines(*args) == expected


@pytest.mark.parametrize(
    "shape, expected",
    [
        (dict(layers=32, kv_heads=8, head_dim=128, bytes_per_element=2, tokens=1), 131072),
        (dict(layers=32, kv_heads=8, head_dim=128, bytes_per_element=2, tokens=8192), GIB),
        (dict(layers=32, kv_heads=8, head_dim=128, bytes_per_element=2, tokens=0), 0),
    ],
    ids=["one-token-of-an-8b-model", "8k-tokens-is-1GiB", "no-tokens"],
)
def test_kv_bytes(shape, expected):
    assert kv_bytes(**shape) == expected


@pytest.mark.parametrize(
    "usage, evictable, kv, expected",
    [
        (90, 0, 5, True),
        (90, 0, 6, False),
        (90, 10, 15, True),
        (90, 10, 16, False),
    ],
    ids=["fits-at-the-line", "over-the-line", "fits-after-evicting", "over-even-after-evicting"],
)
def test_prefill_check(usage, evictable, kv, expected):
    fits = prefill_check(kv_estimate=kv, usage=usage, evictable_bytes=evictable, hard_line=95)
    assert fits is expected


# --- the enforcer tick ---------------------------------------------------------------------

LINES = Lines(ceiling=gib(20), soft=gib(18), hard=gib(19))


@pytest.mark.parametrize(
    "usage, polls, expected",
    [
        (gib(10), 0, ("ok", 0)),
        (gib(18), 0, ("soft", 0)),
        (gib(19), 0, ("hard", 0)),
        (gib(20), 0, ("hard", 1)),
        (gib(20), 1, ("emergency", 2)),
        (gib(21.9), 0, ("hard", 1)),
        (gib(22), 0, ("emergency", 1)),
        (gib(19.5), 1, ("hard", 0)),
        (gib(10), 5, ("ok", 0)),
        (gib(20.5), 4, ("emergency", 5)),
    ],
    ids=[
        "ok",
        "soft-at-the-line",
        "hard-at-the-line",
        "first-poll-at-the-ceiling-is-hard",
        "second-poll-at-the-ceiling-is-emergency",
        "just-under-the-margin-is-hard",
        "emergency-by-margin",
        "below-ceiling-resets-the-counter",
        "ok-resets-the-counter",
        "counter-keeps-counting",
    ],
)
def test_classify(usage, polls, expected):
    assert classify(usage, LINES, polls) == expected


def unload(id, reason):
    return Action("unload", id, reason)


def abort_requests(id, reason):
    return Action("abort_requests", id, reason)


RECLAIM = Action("reclaim", reason="cache_reclaim")


@pytest.mark.parametrize(
    "usage, reclaimable, models, polls, reclaimed, expected",
    [
        (gib(10), 0, [model("a"), model("b")], 0, False,
         ("ok", False, (), 0)),
        (gib(10), gib(5), [model("a"), model("b")], 0, False,
         ("ok", False, (), 0)),
        (gib(10), 0, [model("a", marked_for_unload="emergency"), model("b")], 0, False,
         ("ok", False, (unload("a", "emergency"),), 0)),
        (gib(10), 0, [model("a", marked_for_unload="emergency", leases=1)], 0, False,
         ("ok", False, (), 0)),
        (gib(18.5), 0, [model("a"), model("p", pinned=True)], 0, False,
         ("soft", True, (), 0)),
        (gib(18.5), 0, [model("a", last_access=2), model("b", last_access=1)], 0, False,
         ("soft", True, (unload("b", "pressure_soft"),), 0)),
        (gib(18.9), 0, [model("a", 0.5, last_access=1), model("b", 0.5, last_access=2)], 0, False,
         ("soft", True, (unload("a", "pressure_soft"),), 0)),
        (gib(18.5), 0, [model("a", last_access=1), model("b", leases=1, last_access=2)], 0, False,
         ("soft", True, (unload("a", "pressure_soft"),), 0)),
        (gib(18.5), gib(1), [model("a", last_access=1), model("b", last_access=2)], 0, False,
         ("soft", True, (RECLAIM,), 0)),
        (gib(18.5), gib(1),
         [model("m", marked_for_unload="emergency"), model("a", last_access=1), model("b")],
         0, False,
         ("soft", True, (unload("m", "emergency"), RECLAIM), 0)),
        (gib(18.5), gib(1), [model("a", last_access=1), model("b", last_access=2)], 0, True,
         ("soft", True, (unload("a", "pressure_soft"),), 0)),
        (gib(19.5), gib(1), [model("a")], 0, True,
         ("hard", True, (unload("a", "pressure_hard"),), 0)),
        (gib(18.5), 0,
         [model("m", marked_for_unload="emergency", last_access=9), model("a", last_access=1),
          model("b", last_access=2)],
         0, False,
         ("soft", True, (unload("m", "emergency"),), 0)),
        (gib(19.5), 0, [model("a", 2)], 0, False,
         ("hard", True, (unload("a", "pressure_hard"),), 0)),
        (gib(19.5), 0, [model("a", last_access=1), model("b", last_access=2)], 0, False,
         ("hard", True, (unload("a", "pressure_hard"), unload("b", "pressure_hard")), 0)),
        (gib(19.5), 0,
         [model("a", leases=1, last_access=5), model("b", leases=2, last_access=1),
          model("p", pinned=True, leases=1, last_access=0)],
         0, False,
         ("hard", True, (abort_requests("b", "requests_aborted"),), 0)),
        (gib(19.5), 0,
         [model("l", state="loading"), model("a", leases=1), model("p", pinned=True)], 0, False,
         ("hard", True,
          (Action("abort_load", "l", "load_aborted"), abort_requests("a", "requests_aborted")), 0)),
        (gib(19.5), 0, [model("l", 2, state="loading"), model("a", leases=1)], 0, False,
         ("hard", True, (Action("abort_load", "l", "load_aborted"),), 0)),
        (gib(19.5), 0, [model("p", pinned=True), model("q", pinned=True, leases=1)], 0, False,
         ("hard", True, (), 0)),
        (gib(20), 0, [model("a", 0.5, last_access=1), model("b", leases=1)], 0, False,
         ("hard", True,
          (unload("a", "pressure_hard"), abort_requests("b", "requests_aborted")), 1)),
        (gib(22), 0,
         [model("a", last_access=9), model("b", leases=1, last_access=5),
          model("c", leases=1, last_access=7), model("p", pinned=True, leases=1, last_access=1),
          model("q", pinned=True)],
         0, False,
         ("emergency", True,
          (unload("a", "emergency"), abort_requests("p", "emergency"),
           abort_requests("b", "emergency"), abort_requests("c", "emergency"),
           Action("mark_unload", "b", "emergency")),
          1)),
        (gib(20), 0, [model("p", pinned=True, leases=1), model("b", leases=1, last_access=3)],
         1, False,
         ("emergency", True,
          (abort_requests("p", "emergency"), abort_requests("b", "emergency"),
           Action("mark_unload", "b", "emergency")),
          2)),
        (gib(22), 0, [model("a", 5), model("b", leases=1)], 0, False,
         ("emergency", True, (unload("a", "emergency"),), 1)),
        (gib(22), 0, [model("l", state="loading"), model("p", pinned=True, leases=1)], 0, False,
         ("emergency", True,
          (Action("abort_load", "l", "load_aborted"), abort_requests("p", "emergency")), 1)),
        (gib(22), 0, [model("b", leases=1, marked_for_unload="emergency")], 0, False,
         ("emergency", True, (abort_requests("b", "emergency"),), 1)),
        (gib(22), gib(1), [model("a"), model("b", leases=1)], 0, False,
         ("emergency", True, (RECLAIM,), 1)),
        (gib(19.5), 0, [model("p", pinned=True, marked_for_unload="emergency")], 0, False,
         ("hard", True, (), 0)),
    ],
    ids=[
        "ok-does-nothing",
        "ok-never-reclaims",
        "unload-mark-fires-when-pressure-is-already-ok",
        "unload-mark-waits-while-busy",
        "soft-keeps-the-only-unpinned-model",
        "soft-with-two-unpinned-evicts-the-lru",
        "soft-never-evicts-the-last-unpinned",
        "soft-counts-busy-unpinned-as-loaded",
        "soft-reclaims-first",
        "reclaim-comes-with-drained-marks",
        "soft-after-reclaim-runs-the-ladder",
        "hard-after-reclaim-runs-the-ladder",
        "drained-mark-counts-toward-the-prediction",
        "hard-evicts-the-last-idle-model",
        "hard-evicts-until-under-soft",
        "hard-with-only-busy-aborts-the-lru-unpinned",
        "hard-aborts-loads-then-requests",
        "hard-aborted-load-frees-enough",
        "hard-with-only-pinned-does-nothing-but-pause",
        "first-poll-at-ceiling-is-hard",
        "emergency-by-margin-aborts-all-and-marks-the-lru-busy",
        "emergency-by-two-polls",
        "emergency-eviction-is-enough",
        "emergency-aborts-loads-and-pinned-requests",
        "emergency-does-not-mark-twice",
        "emergency-still-reclaims-first",
        "pinned-mark-never-unloads",
    ],
)
def test_decide(usage, reclaimable, models, polls, reclaimed, expected):
    readings = Readings(usage=usage, reclaimable=reclaimable, lines=LINES)
    decision = decide(readings, models, over_ceiling_polls=polls, reclaimed=reclaimed)
    assert (
        decision.level, decision.admission_paused, decision.actions, decision.over_ceiling_polls
    ) == expected


# --- polling -------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "state, expected",
    [
        (dict(level="soft"), 1.0),
        (dict(level="emergency", loaded_count=0), 1.0),
        (dict(requests_running=True), 1.0),
        (dict(loading=True, loaded_count=0), 1.0),
        (dict(seconds_since_wake=1.9), 1.0),
        (dict(seconds_since_wake=2.0), 10.0),
        (dict(seconds_since_wake=None), 10.0),
        (dict(), 10.0),
        (dict(loaded_count=0), 30.0),
        (dict(loaded_count=0, seconds_since_wake=0.0), 1.0),
    ],
    ids=[
        "pressure",
        "emergency-with-nothing-loaded",
        "requests-running",
        "loading",
        "just-woken",
        "wake-window-over",
        "never-woken",
        "loaded-and-idle",
        "nothing-loaded",
        "nothing-loaded-but-just-woken",
    ],
)
def test_poll_interval(state, expected):
    arguments = dict(
        level="ok", requests_running=False, loading=False, seconds_since_wake=None, loaded_count=1
    )
    assert poll_interval(**{**arguments, **state}) == expected
