"""What the engines drop is freed at once, not at the cyclic collector's next pass: a reference cycle
around a model or a KV cache keeps its arrays in MLX's active memory, where the budget counts them
(measured: each adapter attached over a served base held its own matrices twice until a collection,
+5.2 MB an adapter on the demo). The collector is off in each test, so only a cycle can keep them."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest
from mlx_lm import load

from pool.engines import adapter as adapter_module
from pool.engines.adapter import AdapterEngine, shared_copy
from pool.engines.generator import TextEngine
from pool.engines.lanes import BatchLane
from pool.engines.multi_lora import AdapterSet
from pool.engines.protocol import KVConfig


@pytest.fixture
def no_collector():
    gc.collect()
    gc.disable()
    yield
    gc.enable()


@pytest.fixture(scope="module")
def base_dir(make_model):
    return make_model("arch-llama-tiny", None, arch="llama")


def test_a_closed_lane_mixing_adapters_holds_no_model(base_dir, no_collector):
    model, _ = load(str(base_dir))
    alive = weakref.ref(model)
    lane = BatchLane(model, KVConfig(), [[0]], adapters=AdapterSet(model))
    lane.close()
    del lane, model
    assert alive() is None


def test_a_shared_copy_dropped_is_gone(base_dir, no_collector):
    model, _ = load(str(base_dir))
    copied = shared_copy(model)
    assert copied.layers[0].self_attn.q_proj.weight is model.layers[0].self_attn.q_proj.weight
    alive = weakref.ref(copied)
    del copied
    assert alive() is None


async def test_an_attached_adapter_lets_its_own_tree_go_at_once(base_dir, make_adapter, monkeypatch, no_collector):
    trees = []
    real = adapter_module.over_base

    def over_base(base_model, folder):
        model, own = real(base_model, folder)
        trees.append(weakref.ref(model))
        return model, own
    monkeypatch.setattr(adapter_module, "over_base", over_base)
    base = TextEngine("base", base_dir)
    await base.load()
    engines = []
    try:
        for i in range(2):
            folder = make_adapter(f"freed-{i}", base_dir, seed=20 + i, rank=4, layers=2)
            engines.append(AdapterEngine(f"base:freed-{i}", folder, base=base))
            await engines[-1].load()
            assert engines[-1].mixed
        await asyncio.sleep(0)
        assert len(trees) == 2 and [t() for t in trees] == [None, None]
    finally:
        for engine in engines:
            await engine.stop()
        await base.stop()
