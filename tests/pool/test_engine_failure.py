"""A TextEngine whose device fails mid-generation (real MLX, a random-weight llama): every call that
touches MLX raises, as after a sticky CUDA error, so the step's own error handling fails too. The
requests in flight get an error at once, never a wait; the pool is told (on_failed, on the loop);
a request after it is refused as unloaded, and a stop finds nothing left to release."""

from __future__ import annotations

import asyncio

import pytest

from pool.engines.generator import TextEngine
from pool.engines.lanes import BatchLane
from pool.engines.protocol import EngineError, RequestAborted, SamplingParams
from pool.engines.worker import NOTHING_RELEASED


async def collect(engine: TextEngine, tokens: list[int]) -> str:
    text = ""
    async for chunk in engine.generate(tokens, SamplingParams(max_tokens=64, cache_prompt=False)):
        text += chunk.text
    return text


def test_a_device_error_past_the_steps_own_handling_ends_every_request_and_tells_the_pool(
        stand_in_demo_dir, monkeypatch):
    step, broken = BatchLane.step, {"now": False}

    def failing_step(lane):
        if broken["now"]:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return step(lane)

    def failing_remove(lane, uid, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    async def main():
        engine = TextEngine("m", stand_in_demo_dir)
        await engine.load()
        told: list[tuple] = []
        engine.on_failed = lambda failed, why: told.append((failed, why))
        prompt = await asyncio.to_thread(engine.encode_chat, [{"role": "user", "content": "Hello there"}])
        assert await collect(engine, prompt)                     # it works before the device fails
        monkeypatch.setattr(BatchLane, "step", failing_step)
        monkeypatch.setattr(BatchLane, "remove", failing_remove)
        broken["now"] = True
        results = await asyncio.wait_for(asyncio.gather(*(collect(engine, prompt) for _ in range(3)),
                                                        return_exceptions=True), 30)
        assert all(isinstance(r, EngineError) for r in results), results
        for _ in range(100):           # told once the model is let go, after the requests' errors
            if told:
                break
            await asyncio.sleep(0.05)
        assert len(told) == 1 and told[0][0] is engine and "illegal memory access" in told[0][1]
        with pytest.raises(RequestAborted):
            await collect(engine, prompt)
        assert await asyncio.wait_for(engine.stop(), 10) == NOTHING_RELEASED
        assert engine.parts()[0] is None                          # the model was let go

    asyncio.run(main())
