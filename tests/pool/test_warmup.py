"""Shapes warmed at load (issue 22): after a load the engine runs the shapes it will serve most on its
own thread, one at a time and only while nothing else waits, so a request that arrives meanwhile is
served first. A random-weight llama, real MLX."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest

from pool.engines.generator import TextEngine
from pool.engines.protocol import LoadOptions, SamplingParams
from pool.host.engine_options import warm_shapes


async def test_a_request_arriving_during_the_warm_up_goes_before_the_remaining_shapes(make_model, monkeypatch):
    import pool.engines.warmup as warmup

    order: list[str] = []          # appended from the engine thread and the test, in time order
    run_shape = warmup.run_shape
    seen = threading.Event()       # the first shape waits until the test has seen the warm-up running

    def recorded(state, batch, tokens):
        seen.wait(30)
        order.append(f"shape {batch}")
        run_shape(state, batch, tokens)
    monkeypatch.setattr(warmup, "run_shape", recorded)
    engine = TextEngine("warm", make_model("warm-20", 20, seed=4),
                        load=LoadOptions(warm_batches=(2, 3, 4, 5), warm_prompt=32))
    await engine.load()
    assert engine.warming
    seen.set()
    insert = engine._insert

    def recorded_insert(choices):          # on the engine thread; no shape runs while the request does
        order.append("inserted")
        insert(choices)
    engine._insert = recorded_insert
    order.append("request")
    got = [c async for c in engine.generate([5, 6, 7, 8], SamplingParams(max_tokens=6))]
    for _ in range(600):
        if not engine.warming:
            break
        await asyncio.sleep(0.1)
    assert not engine.warming                       # then the rest ran, in the background
    shapes = [e for e in order if e.startswith("shape")]
    assert len(shapes) == 5
    between = order[order.index("request") + 1:order.index("inserted")]
    # the request waited for at most the shape already starting as it came, never for the rest
    assert got and len(between) <= 1, order
    assert engine.cache_stats.kv_bytes == 0         # the shapes' lanes are gone with their KV
    assert [c async for c in engine.generate([5, 6, 7, 8], SamplingParams(max_tokens=3))]
    release = await asyncio.wait_for(engine.stop(), 60)
    assert release.kept_bytes == 0


async def test_an_unload_during_the_warm_up_drops_the_rest(make_model):
    engine = TextEngine("warm", make_model("warm-20", 20, seed=4), load=LoadOptions(warm_batches=(2, 4, 8, 16),
                                                                                    warm_prompt=64))
    await engine.load()
    release = await asyncio.wait_for(engine.stop(), 60)
    assert release.kept_bytes == 0 and engine._idle_jobs == []


@pytest.mark.parametrize(("warmup", "most", "cpu", "expected"), [
    ("on", 16, True, {"warm_batches": (2, 4, 8, 16), "warm_prompt": 2048}),
    ("on", 12, False, {"warm_batches": (2, 4, 8, 12), "warm_prompt": 2048}),
    ("on", 1, False, {"warm_batches": (), "warm_prompt": 2048}),
    ("on", 0, False, {"warm_batches": (2, 4, 8, 16), "warm_prompt": 2048}),     # no limit: the default's
    ("auto", 8, False, {"warm_batches": (2, 4, 8), "warm_prompt": 2048}),      # a GPU
    ("auto", 8, True, {}),                                                     # the CPU backend
    ("off", 8, False, {}),
])
def test_the_shapes_follow_the_concurrency_limit_and_the_lone_prefill_step(monkeypatch, warmup, most, cpu, expected):
    import pool.host.engine_options as options

    monkeypatch.setattr(options, "cpu_backend", lambda: cpu)
    assert warm_shapes(SimpleNamespace(warmup=warmup, max_concurrent=most, prefill_step=512,
                                       prefill_step_alone=2048)) == expected


def test_the_snapshot_says_while_a_model_warms_up(start_server):
    from tests.conftest import DEMO

    server = start_server(OMLX_WARMUP="on", OMLX_MAX_CONCURRENT="2", OMLX_PREFILL_STEP_ALONE="512")
    assert server.model(DEMO)["warming"] is False                   # not loaded
    assert server.post(f"/api/models/{DEMO}/load", {}).status_code == 200
    assert server.model(DEMO)["warming"] is True        # its lone prompt alone reads 560 tokens on the CPU
    assert server.chat(DEMO).status_code == 200          # served meanwhile
    server.wait_for(lambda: server.model(DEMO)["warming"] is False, timeout=300)
