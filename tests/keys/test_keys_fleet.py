"""Named keys in a real two-host fleet (a real Redis; each host on a SQLite of its own): a client's named
key is checked where it enters (host a, which has no models), and the hop carries the key's name to
the host that serves (b), which keeps each key's prompt cache apart although it never saw the keys."""

from __future__ import annotations

import pytest

from tests.conftest import DEMO
from tests.fleet.conftest import fleet_services, redis  # noqa: F401 - the fleet tests' shared Redis
from tests.fleet.hosts import Fleet
from tests.keys.helpers import BOOT, made, status
from tests.keys.test_keys_cache import cached


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, migrated_db, redis, demo_model_dir):  # noqa: F811 - the fixture imported above
    fleet = Fleet(tmp_path_factory.mktemp("keys-fleet"), migrated_db, redis.new_url())
    try:
        fleet.start({"a": {}, "b": {DEMO: demo_model_dir}}, env={host: {"OMLX_API_KEY": BOOT} for host in "ab"})
        fleet.wait_published()
        yield fleet
    finally:
        fleet.close()


def test_a_key_entering_one_host_keeps_its_prompt_cache_on_the_host_that_serves(fleet):
    a, b = fleet["a"], fleet["b"]
    alice, bob = made(a, "alice", "--models", DEMO), made(a, "bob")
    assert status(b, alice) == 401                     # b has never seen the key: it came to a
    assert cached(a, alice) == 0
    assert cached(a, bob) == 0                         # served on b, in bob's scope: not alice's prefix
    assert cached(a, alice) > 100
    assert cached(a, bob) > 100
    assert b.model(DEMO)["state"] == "loaded" and DEMO not in a.states()
