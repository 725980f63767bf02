"""EnginePool and the serving door in-process, over fake engines: milliseconds per test."""

from __future__ import annotations

import asyncio
import time

import pytest

from pool.errors import Busy, InsufficientMemory, ModelNotFound, ModelTooLarge, ModelUnavailable
from pool.policy.vocabulary import Reason
from pool.serving.completion import CompletionSpec
from tests.fakes import Core, Spec, model_folders

MB = 10**6


@pytest.fixture
def models(tmp_path):
    return model_folders(tmp_path / "models", a=100 * MB, b=100 * MB, c=100 * MB, big=300 * MB)


async def test_loads_on_demand_and_evicts_the_least_recently_used(models):
    core = Core(models, max_model_memory=260 * MB)
    await core.complete("a")
    core.clock.advance(1)
    await core.complete("b")
    core.clock.advance(1)
    await core.complete("a")          # a is now the most recently used
    core.clock.advance(1)
    await core.complete("c")
    assert core.states() == {"a": "loaded", "b": "unloaded", "c": "loaded", "big": "unloaded"}
    assert core.events() == [("unload", "lru", "b")]
    event = core.pool.events.recent[-1]
    assert event["requested_by"] == "c" and event["freed_bytes"] == 100 * MB


@pytest.mark.parametrize("keep", ["pinned", "busy"])
async def test_a_pinned_or_busy_model_is_never_evicted_and_a_refusal_unloads_nothing(models, keep):
    core = Core(models, max_model_memory=260 * MB, specs={"a": Spec(tokens=1000, token_seconds=0.01)})
    await core.complete("b")
    if keep == "pinned":
        core.router.apply_model_settings("a", {"is_pinned": True})
        await core.pool.load("a")
        core.clock.advance(10)
        await core.complete("b")      # b, not a, is the next victim
    else:
        stream = await core.router.generate(CompletionSpec(model="a", prompt="x"))
    core.clock.advance(1)
    await core.complete("c")          # b goes, a stays
    assert core.states()["a"] == "loaded" and core.states()["b"] == "unloaded"
    core.router.apply_model_settings("c", {"is_pinned": True})
    if keep == "pinned":
        with pytest.raises(InsufficientMemory) as refused:
            await core.complete("b")
        assert refused.value.code == "insufficient_memory" and "'a' is" in refused.value.message
        assert core.states() == {"a": "loaded", "b": "unloaded", "c": "loaded", "big": "unloaded"}
        return
    # only busy for now: the load waits for it instead of refusing, and goes once it is idle
    waiting = asyncio.create_task(core.complete("b"))
    await asyncio.sleep(0.1)
    assert not waiting.done() and core.states() == {"a": "loaded", "b": "unloaded", "c": "loaded", "big": "unloaded"}
    await stream.aclose()
    await asyncio.wait_for(waiting, 5)
    assert core.states() == {"a": "unloaded", "b": "loaded", "c": "loaded", "big": "unloaded"}


async def test_a_load_waits_for_busy_models_only_so_long_then_a_503(models):
    core = Core(models, max_model_memory=260 * MB, load_wait=0.3, specs={"a": Spec(tokens=1000, token_seconds=0.01)})
    await core.complete("c")
    core.router.apply_model_settings("c", {"is_pinned": True})
    stream = await core.router.generate(CompletionSpec(model="a", prompt="x"))
    with pytest.raises(Busy) as refused:
        await core.complete("b")
    assert refused.value.code == "models_busy" and refused.value.retry_after >= 1
    assert core.states() == {"a": "loaded", "b": "unloaded", "c": "loaded", "big": "unloaded"}
    await stream.aclose()


async def test_a_model_larger_than_the_budget_is_refused_at_once(models):
    core = Core(models, max_model_memory=260 * MB)
    with pytest.raises(ModelTooLarge):
        await core.complete("big")
    assert core.engines.loads == {}


async def test_the_count_cap_says_why_its_victim_goes(models):
    core = Core(models, max_loaded_models=2)
    await core.complete("a")
    core.clock.advance(1)
    await core.complete("b")
    await core.complete("c")
    assert core.events() == [("unload", "count_cap", "a")]


async def test_concurrent_requests_share_one_load(models):
    core = Core(models, specs={"a": Spec(load_seconds=0.05)})
    results = await asyncio.gather(*(core.complete("a") for _ in range(5)))
    assert [len(chunks) for chunks in results] == [3] * 5
    assert core.engines.loads == {"a": 1}
    assert core.pool.loads_total == 1


async def test_a_loaded_model_serves_while_another_loads(models):
    load_seconds = 0.5
    core = Core(models, specs={"b": Spec(load_seconds=load_seconds)})
    await core.complete("a")
    loading = asyncio.ensure_future(core.pool.load("b"))
    while core.pool.entries["b"].state != "loading":
        await asyncio.sleep(0)
    started = time.perf_counter()
    await core.complete("a")
    served_in = time.perf_counter() - started
    assert core.pool.entries["b"].state == "loading"
    await loading
    assert served_in < load_seconds / 5, f"a request for a waited {served_in:.3f} s behind b's load"


async def test_ttl_and_keep_alive_unload_idle_models(models):
    core = Core(models, idle_ttl=60.0)
    await core.complete("a")
    await core.complete("b", keep_alive=-1)      # until evicted for space
    await core.complete("c", keep_alive=0)       # unloaded when the request ends
    await asyncio.sleep(0.01)
    assert core.states()["c"] == "unloaded"
    core.clock.advance(59)
    assert await core.pool.expire_idle() == []
    core.clock.advance(1)
    assert await core.pool.expire_idle() == ["a"]
    assert core.states() == {"a": "unloaded", "b": "loaded", "c": "unloaded", "big": "unloaded"}
    assert [(a, r) for a, r, _ in core.events()] == [("unload", "keep_alive"), ("unload", "ttl")]


async def test_a_request_leased_as_a_keep_alive_0_request_ends_is_served(models):
    """The unload keep_alive 0 asks for is decided as its request ends: a request that leases the
    model before the unload runs waits for it and loads the model again, instead of holding an
    engine that is stopped under it ("the model was unloaded", a 503)."""
    core = Core(models, specs={"c": Spec(tokens=5, token_seconds=0.002)})
    async with await core.router.generate(CompletionSpec(model="c", prompt="x", keep_alive=0)) as first:
        assert len([chunk async for chunk in first.chunks()]) == 5
    async with await core.router.generate(CompletionSpec(model="c", prompt="x")) as second:   # no await between
        chunks = [chunk async for chunk in second.chunks()]
    assert len(chunks) == 5 and chunks[-1].finish_reason is not None
    assert core.states()["c"] == "loaded"      # the second request's model: not stopped under it
    assert [(a, r) for a, r, _ in core.events()] == [("unload", "keep_alive")] and core.engines.loads["c"] == 2


async def test_a_failed_load_is_kept_until_models_are_rediscovered(models):
    core = Core(models, specs={"a": Spec(fail="truncated weights")})
    for _ in range(2):
        with pytest.raises(ModelUnavailable, match="truncated weights"):
            await core.complete("a")
    assert core.engines.loads == {} and core.states()["a"] == "failed"
    core.engines.specs.clear()
    core.pool.rediscover()
    assert len(await core.complete("a")) == 3


async def test_names_resolve_by_alias_and_ignoring_case(models):
    core = Core(models)
    core.router.apply_model_settings("b", {"alias": "Bee"})
    assert core.router.resolve("bee").model_id == "b" and core.router.resolve("A").model_id == "a"
    with pytest.raises(ModelNotFound, match="Available models: Bee, a, big, c"):
        core.router.resolve("zzz")


async def test_the_serving_door_maps_an_abort_to_a_503_and_releases_the_lease(models):
    core = Core(models, specs={"a": Spec(tokens=1000, token_seconds=0.01)})
    completion = await core.router.generate(CompletionSpec(model="a", prompt="x y"))
    assert completion.prompt_tokens == 2 and core.pool.entries["a"].leases == 1
    got = []

    async def read():
        async for chunk in completion.chunks():
            got.append(chunk)
    reader = asyncio.ensure_future(read())
    while not got:
        await asyncio.sleep(0.005)
    await core.host.actions.abort_requests("a", reason=Reason.REQUESTS_ABORTED, message="pressure",
                                           code="memory_pressure")
    with pytest.raises(Busy) as aborted:
        await reader
    assert aborted.value.code == "memory_pressure" and aborted.value.retry_after >= 1
    await completion.aclose()
    assert core.pool.entries["a"].leases == 0
    assert core.events()[-1] == ("abort_requests", "requests_aborted", "a")


async def test_model_defaults_apply_when_the_request_leaves_them_out(models):
    core = Core(models, specs={"a": Spec(tokens=100)})
    core.router.apply_model_settings("a", {"max_tokens": 5})
    assert len(await core.complete("a")) == 5
    assert len(await core.complete("a", max_tokens=2)) == 2


async def test_a_load_fills_its_weights_once_its_victim_is_freed_not_after_the_history_row(models):
    core = Core(models, max_model_memory=260 * MB)
    await core.pool.load("a")
    await core.pool.load("b")
    writing = asyncio.Event()
    history_written = asyncio.Event()

    async def slow_history(**event):          # the database is slow to take the eviction's row
        writing.set()
        await history_written.wait()
    core.pool.events.recorder = slow_history
    core.clock.advance(1)
    load = asyncio.ensure_future(core.pool.load("c"))
    await asyncio.wait_for(writing.wait(), 1)
    assert "a" not in core.memory.held              # the victim's memory is back first
    for _ in range(200):                            # then c's weights arrive, the row still unwritten
        if "c" in core.memory.held:
            break
        await asyncio.sleep(0.005)
    assert "c" in core.memory.held and not history_written.is_set()
    history_written.set()
    await asyncio.wait_for(load, 1)
    assert core.states() == {"a": "unloaded", "b": "loaded", "c": "loaded", "big": "unloaded"}


async def test_two_unloads_of_one_model_stop_it_once(models):
    """An idle expiry and an eviction can pick the same model: the second waits for the first
    instead of stopping an engine already gone (seen in the soak: AttributeError on None.stop, then
    the unload's future set twice)."""
    core = Core(models)
    await core.pool.load("a")
    entry, engine = core.pool.entries["a"], core.pool.entries["a"].engine
    stop, stops = engine.stop, []

    async def slow_stop(message="the model was unloaded"):
        stops.append(message)
        await asyncio.sleep(0.05)
        return await stop(message)
    engine.stop = slow_stop
    manual = asyncio.ensure_future(core.pool.unload("a"))
    await asyncio.sleep(0.01)                                  # it has taken the engine and is stopping it
    await core.pool.unload_entry(entry, reason=Reason.TTL)     # the second caller, as expire_idle calls it
    await manual
    assert len(stops) == 1 and core.states()["a"] == "unloaded"
    assert core.events() == [("unload", "manual", "a")]


async def test_an_engine_that_fails_is_unloaded_and_the_next_request_loads_it_again(models):
    """An engine thread that ends on an error of its own (engines/worker.py) tells the pool, from the
    loop: the entry goes, with an engine_failed event, and is loaded afresh by the next request; a
    notice from an engine already replaced changes nothing."""
    core = Core(models)
    await core.complete("a")
    failed = core.pool.entries["a"].engine
    failed.on_failed(failed, "the engine failed: RuntimeError: device error")
    for _ in range(20):
        await asyncio.sleep(0.01)
        if core.states()["a"] == "unloaded":
            break
    assert core.states()["a"] == "unloaded"
    assert core.events() == [("unload", "engine_failed", "a")]
    assert "device error" in core.pool.events.recent[-1]["detail"]
    assert await core.complete("a")
    assert core.states()["a"] == "loaded" and core.engines.loads["a"] == 2
    failed.on_failed(failed, "the engine failed: late")          # the old engine's notice, after the reload
    await asyncio.sleep(0.05)
    assert core.states()["a"] == "loaded" and len(core.events()) == 1
