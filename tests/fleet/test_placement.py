"""The fleet's routing decision (pool/fleet/placement.py) and pins (pins.py), over plain data: tables
of hosts and what each publishes."""

from __future__ import annotations

import pytest

from pool.fleet.pins import pin_duties, pin_locations
from pool.fleet.placement import HostView, Why, host_view, place
from pool.fleet.prefix import PrefixLedger, prefix_keys
from pool.policy.load_plan import ModelView
from pool.policy.vocabulary import Level, ModelState

GB = 10**9
L, U = ModelState.LOADED, ModelState.UNLOADED


def m(model_id: str, state=U, gb: float = 10, *, used: float = 0, leases: int = 0, pinned: bool = False) -> ModelView:
    return ModelView(model_id, state, int(gb * GB), pinned=pinned, leases=leases, last_access=used)


def host(host_id: str, *models: ModelView, budget: float | None = 40, level=Level.OK, busy=None, prefixes=None,
         headroom: float | None = None, queued=None):
    return HostView(host_id, tuple(models), None if budget is None else int(budget * GB), level=level,
                    busy=busy or {}, prefixes=prefixes or {}, queued=queued or {},
                    headroom_bytes=None if headroom is None else int(headroom * GB))


CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
KEYS = prefix_keys(CHAT)

CASES = [
    # (name, hosts, model, expected host, why)
    ("no host has the folder", [host("a", m("x")), host("b", m("y"))], "z", None, Why.NO_HOST),
    ("loaded beats room elsewhere", [host("a", m("x"), budget=400), host("b", m("x", L))], "x", "b", Why.LOADED),
    ("least busy of the loaded", [host("a", m("x", L), busy={"x": 3}), host("b", m("x", L), busy={"x": 1})],
     "x", "b", Why.LOADED),
    ("a tie goes to the smaller id", [host("b", m("x", L)), host("a", m("x", L))], "x", "a", Why.LOADED),
    ("the prefix holder, a little busier", [host("a", m("x", L), busy={"x": 1}),
                                            host("b", m("x", L), busy={"x": 2}, prefixes={"x": frozenset(KEYS[:1])})],
     "x", "b", Why.PREFIX),
    ("the prefix holder, much busier", [host("a", m("x", L), busy={"x": 1}),
                                        host("b", m("x", L), busy={"x": 6}, prefixes={"x": frozenset(KEYS)})],
     "x", "a", Why.LOADED),
    ("the longer prefix wins", [host("a", m("x", L), prefixes={"x": frozenset(KEYS[:1])}),
                                host("b", m("x", L), prefixes={"x": frozenset(KEYS[1:])})], "x", "b", Why.PREFIX),
    ("a second copy when the holder queues", [host("a", m("x", L), busy={"x": 20}, queued={"x": 4}), host("b", m("x"))],
     "x", "b", Why.SPILLS),
    ("no second copy at the price of an eviction", [host("a", m("x", L), busy={"x": 20}, queued={"x": 4}),
                                                     host("b", m("x"), m("y", L, 35))], "x", "a", Why.LOADED),
    ("no second copy while a holder has free slots", [host("a", m("x", L), busy={"x": 20}, queued={"x": 4}),
                                                       host("b", m("x", L)),
                                                       host("c", m("x"))], "x", "b", Why.LOADED),
    ("most free bytes", [host("a", m("x"), m("y", L, 20)), host("b", m("x"), m("y", L, 5))], "x", "b", Why.FITS),
    ("fits without eviction beats evicting", [host("a", m("x"), m("y", L, 30), budget=38),
                                              host("b", m("x"), budget=13)], "x", "b", Why.FITS),
    ("the least recently used victim", [host("a", m("x"), m("y", L, 30, used=100)),
                                        host("b", m("x"), m("z", L, 30, used=50))], "x", "b", Why.EVICTS),
    ("no new load under hard pressure", [host("a", m("x"), level=Level.HARD), host("b", m("x"), m("y", L, 30, used=9))],
     "x", "b", Why.EVICTS),
    ("waits where a busy model will go idle", [host("a", m("x"), m("y", L, 35, leases=1)),
                                               host("b", m("x"), m("z", L, 35, pinned=True))], "x", "a", Why.WAITS),
    ("no room anywhere", [host("a", m("x"), m("y", L, 35, pinned=True)), host("b", m("x", gb=50))],
     "x", None, Why.NO_ROOM),
    ("the memory measured free counts", [host("a", m("x"), budget=100, headroom=5), host("b", m("x"), budget=20)],
     "x", "b", Why.FITS),
    ("budget room without memory: last resort", [host("a", m("x"), budget=100, headroom=5)], "x", "a", Why.EVICTS),
    ("no budget: room always", [host("a", m("x"), m("y", L, 900), budget=None)], "x", "a", Why.FITS),
]


@pytest.mark.parametrize("hosts, model, expected, why", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_placement(hosts, model, expected, why):
    placement = place(model, hosts, prefix_keys=KEYS)
    assert (placement.host, placement.why) == (expected, why)


def test_an_eviction_names_its_victims():
    hosts = [host("a", m("x"), m("old", L, 20, used=1), m("new", L, 20, used=2))]
    assert place("x", hosts).evicts == ("old",)


def test_no_room_says_why_on_each_host():
    hosts = [host("a", m("x"), m("y", L, 35, pinned=True)), host("b", m("x", gb=50))]
    refusals = place("x", hosts).refusals
    assert set(refusals) == {"a", "b"}
    assert "'y' is pinned" in refusals["a"] and "model budget" in refusals["b"]


def test_an_excluded_host_is_left_out():
    hosts = [host("a", m("x", L)), host("b", m("x"))]
    assert place("x", hosts, exclude=["a"]).host == "b"
    assert place("x", hosts, exclude=["a", "b"]).why == Why.NO_HOST


def test_a_published_record_becomes_a_view():
    record = {"host": "b", "prefixes": {"x": ["k1"]},
              "snapshot": {"max_loaded_models": 2, "memory": {"model_budget_bytes": 40 * GB, "level": "soft",
                                                               "hard_bytes": 60 * GB, "usage_bytes": 45 * GB},
                           "models": [{"id": "x", "state": "loaded", "size_bytes": 10 * GB, "measured_bytes": 9 * GB,
                                       "pinned": False, "active_requests": 2, "last_access": 5.0, "running": 1,
                                       "queued": 1, "failure": None},
                                      {"id": "broken", "state": "unloaded", "size_bytes": GB, "failure": "bad"}]}}
    view = host_view(record)
    assert [v.id for v in view.models] == ["x"]            # a model that failed to load there is not offered
    assert view.model("x").footprint == 9 * GB and view.model("x").leases == 2
    assert view.queued == {"x": 1}
    assert (view.busy, view.level, view.max_loaded, view.free_bytes()) == ({"x": 2, "broken": 0}, Level.SOFT, 2,
                                                                           15 * GB)
    assert view.prefixes == {"x": frozenset({"k1"})}


# ---- pins ----------------------------------------------------------------------------------------

def test_a_pinned_model_loaded_somewhere_is_nobodys_duty():
    hosts = [host("a", m("p")), host("b", m("p", L))]
    assert pin_duties(["p"], hosts) == {}
    assert pin_locations(["p"], hosts) == {"p": ["b"]}


def test_a_pinned_model_loaded_nowhere_goes_where_it_fits():
    hosts = [host("a", m("p"), m("y", L, 35)), host("b", m("p"))]
    assert pin_duties(["p"], hosts) == {"p": "b"}
    assert pin_locations(["p"], hosts) == {"p": []}


def test_a_pinned_model_no_live_host_has_is_nobodys_duty():
    assert pin_duties(["p"], [host("a", m("x"))]) == {}


# ---- prompt-prefix keys --------------------------------------------------------------------------

def test_a_later_turn_carries_the_keys_of_the_earlier_one():
    turn2 = [*CHAT, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    assert prefix_keys(turn2)[: len(CHAT)] == KEYS
    assert prefix_keys([{"role": "user", "content": "other"}])[0] != KEYS[0]


def test_the_ledger_keeps_recent_keys_of_served_chats():
    now = [0.0]
    ledger = PrefixLedger(clock=lambda: now[0])
    ledger.served("x", KEYS)
    assert ledger.published(["x", "y"]) == {"x": [KEYS[-1]]}
    now[0] = 301.0
    assert ledger.published(["x"]) == {}
    ledger.served("x", KEYS)
    ledger.forget("x")
    assert ledger.published(["x"]) == {}
