"""Decision tables for pool.policy.pressure: the enforcer's levels and actions. One row per case;
pure: no Django, no MLX."""

from __future__ import annotations

import pytest

from pool.policy.pressure import (
    Action,
    Lines,
    Readings,
    auto_ceiling,
    classify,
    decide,
    guard_reserve,
    poll_interval,
    prefill_verdict,
    pressure_lines,
)
from pool.policy.units import GIB

from .tables import gib, model


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
    "usage, evictable, reclaimable, live_kv, kv, expected",
    [
        (90, 0, 0, 0, 5, "fits"),
        (90, 0, 0, 0, 6, "too_large"),
        (90, 10, 0, 0, 15, "fits"),
        (90, 10, 0, 0, 16, "too_large"),
        (90, 10, 5, 0, 20, "fits"),
        (90, 10, 5, 30, 21, "busy"),
        (90, 10, 5, 30, 50, "busy"),
        (90, 10, 5, 30, 51, "too_large"),
        (90, 0, 0, 30, 5, "fits"),
    ],
    ids=["fits-at-the-line", "over-the-line", "fits-after-evicting", "over-even-after-evicting",
         "fits-once-caches-are-reclaimed", "fits-only-once-running-requests-end",
         "busy-at-the-line", "too-large-even-then", "live-kv-does-not-matter-when-it-fits"],
)
def test_prefill_verdict(usage, evictable, reclaimable, live_kv, kv, expected):
    verdict = prefill_verdict(kv_estimate=kv, usage=usage, evictable_bytes=evictable, reclaimable_bytes=reclaimable,
                              live_kv_bytes=live_kv, hard_line=95)
    assert verdict == expected


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
        (gib(18.5), 0, [model("a", last_access=1), model("b", 2, last_access=2, loaded_draft_bytes=gib(0.6))],
         0, False,
         ("soft", True, (Action("drop_draft", "b", "pressure_soft"),), 0)),
        (gib(19.5), 0,
         [model("p", pinned=True, leases=1, loaded_draft_bytes=gib(0.3), last_access=1),
          model("b", leases=1, loaded_draft_bytes=gib(0.3), last_access=2), model("a", last_access=0)],
         0, False,
         ("hard", True, (Action("drop_draft", "p", "pressure_hard"), Action("drop_draft", "b", "pressure_hard"),
                         unload("a", "pressure_hard")), 0)),
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
        "a-draft-goes-before-any-model",
        "drafts-of-pinned-and-busy-models-go-too-then-models",
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
