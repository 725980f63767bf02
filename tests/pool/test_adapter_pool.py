"""Adapters in the engine pool, over fake engines: an adapter's request loads its base first and
holds it; a base goes only after its adapters, and never while one is busy or pinned; adapters
have their own LRU place, TTL and pins, and do not count against OMLX_MAX_LOADED_MODELS."""

from __future__ import annotations

import asyncio

import pytest

from pool.errors import Busy, InsufficientMemory
from pool.serving.completion import CompletionSpec
from tests.fakes import Core, Spec, adapter_folder, model_folders

MB = 10**6


@pytest.fixture
def models(tmp_path):
    root = model_folders(tmp_path / "models", base=100 * MB, other=100 * MB)
    adapter_folder(root, "a1", "base", 2 * MB)
    adapter_folder(root, "a2", "base", 2 * MB)
    return root


async def test_an_adapter_loads_its_base_first_and_shares_it(models):
    core = Core(models, max_model_memory=300 * MB)
    assert {"base:a1", "base:a2"} <= set(core.states())
    await core.complete("base:a1")
    await core.complete("base:a2")
    assert core.states() == {"base": "loaded", "base:a1": "loaded", "base:a2": "loaded", "other": "unloaded"}
    assert core.engines.loads["base"] == 1
    assert core.engines.engines["base:a1"].options["base"] is core.engines.engines["base"]
    pool = core.pool
    assert pool.entries["base:a1"].measured_bytes == 2 * MB and pool.entries["base"].leases == 0


async def test_evicting_a_base_first_unloads_its_adapters(models):
    core = Core(models, max_model_memory=205 * MB)
    await core.complete("base:a1")
    core.clock.advance(1)
    await core.complete("other")        # base (100) + a1 (2) + other (100) > 205: base and a1 go
    assert core.states() == {"base": "unloaded", "base:a1": "unloaded", "base:a2": "unloaded", "other": "loaded"}
    unloads = [(action, model) for action, _, model in core.events() if action == "unload"]
    assert unloads == [("unload", "base:a1"), ("unload", "base")]


async def test_a_busy_or_pinned_adapter_keeps_its_base(models):
    core = Core(models, max_model_memory=201 * MB, load_wait=0.2,      # base + a1 + other: 202
                specs={"base:a1": Spec(tokens=1000, token_seconds=0.01)})
    stream = await core.router.generate(CompletionSpec(model="base:a1", prompt="x"))
    await asyncio.sleep(0.05)
    assert core.pool.entries["base"].leases == 1          # the adapter's request holds its base
    with pytest.raises(Busy) as refused:
        await core.complete("other")
    assert refused.value.code == "models_busy"
    await stream.aclose()
    core.router.apply_model_settings("base:a1", {"is_pinned": True})
    with pytest.raises(InsufficientMemory) as pinned:
        await core.complete("other")
    assert "'base' is pinned" in pinned.value.message
    assert core.states()["base"] == core.states()["base:a1"] == "loaded"


async def test_an_idle_adapter_is_an_lru_victim_of_its_own_and_expires_alone(models):
    core = Core(models, max_model_memory=310 * MB, idle_ttl=60)
    await core.complete("base:a1")
    core.clock.advance(10)
    await core.complete("base")
    core.router.apply_model_settings("base:a2", {"ttl_seconds": 5})
    await core.complete("base:a2")
    core.clock.advance(6)
    assert await core.pool.expire_idle() == ["base:a2"]
    assert core.states() == {"base": "loaded", "base:a1": "loaded", "base:a2": "unloaded", "other": "unloaded"}


async def test_adapters_do_not_count_against_the_loaded_model_cap(models):
    core = Core(models, max_loaded_models=1)
    await core.complete("base:a1")
    await core.complete("base:a2")
    assert core.states() == {"base": "loaded", "base:a1": "loaded", "base:a2": "loaded", "other": "unloaded"}
    await core.complete("other")         # the cap's one model: the base goes, its adapters before it
    assert core.states() == {"base": "unloaded", "base:a1": "unloaded", "base:a2": "unloaded", "other": "loaded"}


async def test_a_manual_unload_of_a_base_takes_its_adapters(models):
    core = Core(models)
    await core.complete("base:a1")
    await core.pool.unload("base")
    assert core.states()["base:a1"] == "unloaded" and core.states()["base"] == "unloaded"
    await core.complete("base:a1")       # and loads both again
    assert core.engines.loads["base"] == 2
