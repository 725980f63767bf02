"""The in-memory copy of the keys (pool/keys/registry.py) over a real SQLite database: read through
the async ORM, read again after its interval or at once after a change in this process, a failed
read keeping the last copy; each key's rate."""

from __future__ import annotations

import pytest

from pool.keys.records import BOOTSTRAP, BOOTSTRAP_RECORD, KeyRecord, key_hash, name_problem
from pool.keys.registry import Registry


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def close_connections() -> None:
    """Django's connections are per thread: the async ORM's thread too."""
    from asgiref.sync import sync_to_async
    from django.db import connections

    connections.close_all()
    await sync_to_async(connections.close_all)()


@pytest.fixture
async def db(tmp_path, monkeypatch):
    """A migrated SQLite database of its own for this test's ORM calls."""
    from asgiref.sync import sync_to_async
    from django.core.management import call_command
    from django.db import connections

    monkeypatch.setitem(connections.databases["default"], "NAME", str(tmp_path / "keys.sqlite3"))
    await close_connections()
    await sync_to_async(call_command)("migrate", verbosity=0)
    yield
    await close_connections()
    from pool.keys.registry import REGISTRY

    REGISTRY.load({})           # the process's copy forgets this database's keys: other tests' servers
    REGISTRY.invalidate()       # in this process read their own


def test_records_scope_the_cache_by_name_unless_shared_and_names_are_checked():
    assert KeyRecord("alice").cache_scope == "alice"
    assert KeyRecord("bob", shares_cache=True).cache_scope is None
    assert BOOTSTRAP_RECORD.cache_scope == BOOTSTRAP and BOOTSTRAP_RECORD.allows("anything")
    assert KeyRecord("c", models=("a",)).allows("a") and not KeyRecord("c", models=("a",)).allows("b")
    assert name_problem("bootstrap") and name_problem("a b") and name_problem("") and not name_problem("team-1.x")


async def test_a_revoke_in_this_process_is_seen_by_the_next_request(db):
    from asgiref.sync import sync_to_async

    from pool.keys import services
    from pool.keys.registry import REGISTRY

    _, plain = await sync_to_async(services.create_key)(name="alice", models=["m"], rate_per_minute=5)
    await REGISTRY.current()
    assert REGISTRY.named([plain]) == KeyRecord("alice", ("m",), 5, False)
    assert REGISTRY.keys_required()
    await sync_to_async(services.revoke_key)(name="alice")     # post_save: the copy is stale at once
    await REGISTRY.current()
    assert REGISTRY.named([plain]) is None
    _, rotated = await sync_to_async(services.rotate_key)(name="alice")
    await REGISTRY.current()
    assert REGISTRY.named([rotated]).name == "alice" and REGISTRY.named([plain]) is None


async def test_another_processs_change_is_read_after_the_interval(db):
    from asgiref.sync import sync_to_async
    from django.db.models.signals import post_save

    from pool.keys import services
    from pool.keys.models import ApiKey
    from pool.keys.signals import key_changed

    clock = Clock()
    registry = Registry(refresh=1.0, clock=clock)
    await registry.current()
    assert registry.names() == []
    post_save.disconnect(key_changed, sender=ApiKey)        # as if another process wrote it
    try:
        _, plain = await sync_to_async(services.create_key)(name="bob")
    finally:
        post_save.connect(key_changed, sender=ApiKey)
    await registry.current()
    assert registry.named([plain]) is None                   # within the interval: the old copy
    clock.now += 1.0
    await registry.current()
    assert registry.named([plain]).name == "bob"


async def test_a_failed_read_keeps_the_last_copy(db, monkeypatch):
    from django.db import connections

    clock = Clock()
    registry = Registry(clock=clock)
    record = KeyRecord("carol")
    registry.load({key_hash("secret"): record})
    clock.now += 5
    monkeypatch.setitem(connections.databases["default"], "NAME", "/nonexistent/folder/db.sqlite3")
    await close_connections()
    await registry.current()
    assert registry.named(["secret"]) == record and registry.readable
    fresh = Registry(clock=clock)
    await fresh.current()
    assert not fresh.readable and fresh.named(["secret"]) is None


def test_the_rate_is_counted_per_key():
    clock = Clock()
    registry = Registry(clock=clock)
    limited, free = KeyRecord("a", rate_per_minute=2), KeyRecord("b")
    assert [registry.admit(limited) for _ in range(2)] == [0.0, 0.0]
    assert registry.admit(limited) == pytest.approx(30.0)
    assert all(registry.admit(free) == 0.0 for _ in range(100))
    clock.now += 30
    assert registry.admit(limited) == 0.0


async def test_when_a_key_was_last_used_is_written_off_the_request_path(db):
    import asyncio

    from asgiref.sync import sync_to_async

    from pool.keys import services
    from pool.keys.models import ApiKey
    from pool.keys.registry import USED_EVERY

    clock = Clock()
    registry = Registry(clock=clock)
    await sync_to_async(services.create_key)(name="erin")
    await registry.current()
    registry.admit(registry.by_name("erin"))
    clock.now += 2
    await registry.current()                                  # read again, but not a minute yet: nothing written
    assert (await ApiKey.objects.aget(name="erin")).last_used_at is None
    clock.now += USED_EVERY
    await registry.current()                                  # a task of its own writes it
    for _ in range(1000):
        if (await ApiKey.objects.aget(name="erin")).last_used_at is not None:
            break
        await asyncio.sleep(0.01)
    assert (await ApiKey.objects.aget(name="erin")).last_used_at is not None
