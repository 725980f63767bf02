"""Pins in a fleet, end to end: a model pinned in the shared settings (a real PostgreSQL) is loaded on
one host of the fleet, not on each; when that host is `kill -9`ed, another host that has the model's
folder loads it once the dead host's record expires (OMLX_FLEET_TTL); the restarted host does not load a
second copy. Three real hosts, a real Redis: a and b have the pinned model's folder, c has not."""

import pytest

from tests.fleet.hosts import Fleet, fleet_state, holds, model_row, small_models, wait_until

TTL = 2.0
WITH_FOLDER = ("a", "b")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, migrated_db, redis, postgres, make_model):
    folders = small_models(make_model, "pinned", "x")
    fleet = Fleet(tmp_path_factory.mktemp("pins"), migrated_db, redis.new_url(),
                  database_url=postgres.new_database("pins"), OMLX_FLEET_TTL=TTL)
    try:
        yield fleet.start({"a": {"pinned": folders["pinned"]}, "b": {"pinned": folders["pinned"]},
                           "c": {"x": folders["x"]}})
    finally:
        fleet.close()


def loaded_on(fleet: Fleet) -> list[str]:
    """The hosts whose own pool has the pinned model loading or loaded."""
    return [h for h in WITH_FOLDER if h in fleet.live() and model_row(fleet[h], "pinned")["state"] in
            ("loading", "loaded")]


def pins_seen(fleet: Fleet) -> dict[str, dict]:
    return {host: fleet_state(server)["pins"] for host, server in fleet.live().items()}


def kept_on(fleet: Fleet, host: str) -> bool:
    """The model is loaded on `host` and nowhere else, and every live host's /api/fleet says so."""
    return (model_row(fleet[host], "pinned")["state"] == "loaded" and loaded_on(fleet) == [host]
            and all(pins == {"pinned": [host]} for pins in pins_seen(fleet).values()))


def test_a_pinned_model_is_kept_on_one_host_and_moves_when_that_host_is_killed(fleet):
    c = fleet["c"]
    assert loaded_on(fleet) == [] and all(p == {} for p in pins_seen(fleet).values())

    r = c.post("/admin/model/pinned/settings", {"is_pinned": True})      # c has no folder: it goes to one that has
    assert r.status_code == 200 and r.json()["is_pinned"] is True, r.text
    holder = wait_until(lambda: next((h for h in WITH_FOLDER if kept_on(fleet, h)), None), 20,
                        lambda: f"the pin to be loaded on one host: {loaded_on(fleet)}; {pins_seen(fleet)}")
    other = next(h for h in WITH_FOLDER if h != holder)
    assert model_row(fleet[other], "pinned")["pinned"] is True           # the other host read the shared setting
    holds(lambda: kept_on(fleet, holder), 2 * TTL, lambda: f"a second copy: {loaded_on(fleet)}; {pins_seen(fleet)}")

    fleet.kill(holder)
    wait_until(lambda: kept_on(fleet, other), TTL + 20,
               lambda: f"{other} to take the pin over: {loaded_on(fleet)}; {pins_seen(fleet)}\n{fleet.logs()}")
    assert model_row(fleet[other], "pinned")["pinned"] is True

    fleet.restart(holder)                                                # back, with the pin still set
    fleet.wait_joined(timeout=20)
    assert model_row(fleet[holder], "pinned")["pinned"] is True
    holds(lambda: kept_on(fleet, other), 2 * TTL,
          lambda: f"the restarted {holder} loaded a second copy: {loaded_on(fleet)}; {pins_seen(fleet)}")


def test_an_unpinned_model_is_no_longer_kept(fleet):
    a = fleet["a"]
    fleet.wait_joined()
    assert a.post("/admin/model/pinned/settings", {"is_pinned": True}).status_code == 200
    holder = wait_until(lambda: next((h for h in WITH_FOLDER if kept_on(fleet, h)), None), 20, "the pin to load")
    assert a.post("/admin/model/pinned/settings", {"is_pinned": False}).status_code == 200
    wait_until(lambda: all(p == {} for p in pins_seen(fleet).values()), 10, lambda: f"no pins: {pins_seen(fleet)}")
    wait_until(lambda: model_row(fleet[holder], "pinned")["pinned"] is False, 10, "the holder to read the change")
    r = fleet[holder].post(f"/api/models/pinned/unload?host={holder}", {})      # it may go now
    assert r.status_code == 200, r.text
    holds(lambda: loaded_on(fleet) == [], 2 * TTL, lambda: f"an unpinned model was loaded: {loaded_on(fleet)}")
