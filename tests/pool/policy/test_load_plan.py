"""Decision tables for pool.policy.load_plan: who goes so that a model can load. One row per case;
pure: no Django, no MLX."""

from __future__ import annotations

import pytest

from pool.policy.load_plan import ModelView, Victim, auto_model_budget, lru_ranks, lru_victims, plan_load
from pool.policy.units import GIB
from pool.policy.vocabulary import Reason

from .tables import gib, model, unloaded

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
    plan = plan_load(models, target, **options)
    assert (plan.fits, plan.victim_ids, plan.with_headroom, plan.code, plan.blockers) == expected


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
    plan = plan_load(models, "c", **options)
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
    assert plan_load(models, "c", **options).message == expected


def test_plan_admission_unknown_target():
    with pytest.raises(KeyError):
        plan_load([model("a")], "zzz", budget=None)


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
    "models, options, expected",
    [
        ([model("a", last_access=1), model("b", last_access=2), unloaded("c")], dict(budget=gib(2.5)),
         (Victim("a", Reason.LRU),)),
        ([model("a", last_access=1), model("b", last_access=2), unloaded("c")], dict(budget=None, max_loaded=1),
         (Victim("a", Reason.COUNT_CAP), Victim("b", Reason.COUNT_CAP))),
        ([model("a", last_access=1), model("b", last_access=2), model("d", last_access=3), unloaded("c")],
         dict(budget=gib(3.5), max_loaded=2),
         (Victim("a", Reason.LRU), Victim("b", Reason.COUNT_CAP))),
        ([model("a", last_access=1), model("b", last_access=2), unloaded("c")], dict(budget=gib(1.25), max_loaded=1),
         (Victim("a", Reason.LRU), Victim("b", Reason.LRU))),
    ],
    ids=["memory", "count-cap-only", "memory-then-count-cap", "memory-covers-the-count-cap"],
)
def test_each_victim_says_why_it_goes(models, options, expected):
    assert plan_load(models, "c", **options).victims == expected
