"""A restart of the fleet's PostgreSQL, end to end: while the database is away every host keeps
publishing (each still lists both in /api/fleet); once it is back, a model only h2 has is served
through h1, the hosts read the shared settings again by themselves, and the pinned model stays loaded
on one host throughout, never a second copy. A PostgreSQL of this test's own (the run's shared one
serves other tests meanwhile), stopped with `pg_ctl stop -m fast` and started on the same port and data."""

import time

import pytest

from tests.fleet.hosts import Fleet, holds, hosts_seen, model_row, small_models, wait_until
from tests.fleet.services import Postgres

TTL = 2.0
OUTAGE = 4 * TTL            # every record would have expired twice over without a publish
BACK_SECONDS = 10           # after the database is back: the fleet whole, the settings read again
WITH_FOLDER = ("h1", "h2")


@pytest.fixture
def own_postgres():
    pg = Postgres.start()           # in the system's temp folder: the `postgres` user must reach it
    try:
        yield pg
    finally:
        pg.stop()


@pytest.fixture
def fleet(tmp_path, migrated_db, redis_url, own_postgres, make_model):
    folders = small_models(make_model, "pinned", "x", "only-b")
    fleet = Fleet(tmp_path / "hosts", migrated_db, redis_url, database_url=own_postgres.new_database("restart"),
                  OMLX_FLEET_TTL=TTL)
    try:
        yield fleet.start({"h1": {"pinned": folders["pinned"], "x": folders["x"]},
                           "h2": {"pinned": folders["pinned"], "only-b": folders["only-b"]}})
    finally:
        fleet.close()


def loaded_on(fleet: Fleet) -> list[str]:
    return [h for h in WITH_FOLDER if model_row(fleet[h], "pinned")["state"] in ("loading", "loaded")]


def whole(fleet: Fleet) -> bool:
    return all(hosts_seen(fleet[h]) == {"h1", "h2"} for h in WITH_FOLDER)


def test_the_fleet_stays_whole_through_a_postgresql_restart(fleet, own_postgres):
    h1, h2 = fleet["h1"], fleet["h2"]
    assert h1.post("/admin/model/pinned/settings", {"is_pinned": True}).status_code == 200
    wait_until(lambda: len(loaded_on(fleet)) == 1 and model_row(fleet[loaded_on(fleet)[0]], "pinned")["state"]
               == "loaded", 20, lambda: f"the pin to load on one host: {loaded_on(fleet)}")
    holder = loaded_on(fleet)[0]
    wait_until(lambda: model_row(h2, "pinned")["pinned"], 10, "h2 to read the pin")

    def one_copy() -> bool:
        return loaded_on(fleet) == [holder]

    own_postgres.pause()                                     # pg_ctl stop -m fast
    stopped = time.monotonic()
    try:
        holds(lambda: whole(fleet) and one_copy(), OUTAGE,
              lambda: f"the fleet split while the database was away: h1 sees {hosts_seen(h1)}, "
                      f"h2 sees {hosts_seen(h2)}; pin on {loaded_on(fleet)}\n{fleet.logs()}")
    finally:
        own_postgres.resume()                                # the same port and data
    back = time.monotonic()
    print(f"\nPostgreSQL away for {back - stopped:.1f} s")

    wait_until(lambda: whole(fleet), BACK_SECONDS, lambda: f"both hosts in both /api/fleet\n{fleet.logs()}")
    print(f"both hosts list both in /api/fleet {time.monotonic() - back:.2f} s after PostgreSQL is back")
    started = time.monotonic()
    r = h1.chat("only-b")                                    # a model only h2 has, through h1
    assert r.status_code == 200 and r.headers["x-omlx-host"] == "h2", r.text
    print(f"a chat for only-b through h1, served by h2: {time.monotonic() - started:.2f} s")

    # the hosts read the shared settings again by themselves: a write on h1 reaches h2's router
    assert h1.post("/admin/model/only-b/settings", {"alias": "renamed-b"}).status_code == 200
    wait_until(lambda: h2.chat("renamed-b").status_code == 200, BACK_SECONDS,
               lambda: f"h2 to read a settings write made after the restart\n{fleet.logs()}")
    print(f"h2 reads a settings write made {time.monotonic() - back:.2f} s after the database is back")

    holds(one_copy, 2 * TTL, lambda: f"a second copy of the pin: {loaded_on(fleet)}\n{fleet.logs()}")
    assert model_row(fleet[holder], "pinned")["state"] == "loaded"
