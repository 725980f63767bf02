"""A call that reaches an engine as it unloads is answered with an error, never left waiting (the
soak found the enforcer's cache walk calling an engine that had just been unloaded)."""

import asyncio

import pytest

from pool.engines.generator import TextEngine
from pool.engines.protocol import EngineError, RequestAborted, SamplingParams


async def test_commands_queued_behind_the_stop_and_sent_after_it_are_errors(make_model):
    engine = TextEngine("tiny", make_model("pool-a", 30, seed=0))
    await engine.load()
    stop = asyncio.ensure_future(engine.stop())
    await asyncio.sleep(0)                    # the stop is queued first
    behind = asyncio.ensure_future(engine.call(lambda: "ran"))
    release, behind_result = await asyncio.wait_for(asyncio.gather(stop, behind, return_exceptions=True), 30)
    assert not isinstance(release, BaseException)
    assert isinstance(behind_result, RequestAborted) and behind_result.code == "model_unloaded"

    with pytest.raises(RequestAborted):
        await asyncio.wait_for(engine.shrink_prompt_cache(cap_bytes=0), 5)
    stream = engine.generate([1, 2, 3], SamplingParams(max_tokens=2))
    with pytest.raises(RequestAborted):
        await asyncio.wait_for(anext(stream), 5)
    assert (await asyncio.wait_for(engine.stop(), 5)).active_before == 0      # a second stop is a no-op


async def test_an_embedding_engine_answers_a_call_sent_after_its_stop(minilm_dir):
    from pool.engines.encoder import EmbeddingEngine

    engine = EmbeddingEngine("minilm", minilm_dir)
    await engine.load()
    await asyncio.wait_for(engine.stop(), 30)
    with pytest.raises(RequestAborted):
        await asyncio.wait_for(engine.embed([[101, 102]]), 5)


async def test_a_step_that_fails_outside_a_lane_ends_its_requests_with_an_error(make_model, monkeypatch):
    from pool.engines.lanes import BatchLane

    engine = TextEngine("tiny", make_model("pool-a", 30, seed=0))
    await engine.load()
    try:
        def broken(self, tokens):
            raise RuntimeError("a bug in the step")
        monkeypatch.setattr(BatchLane, "set_prefill_step", broken)
        with pytest.raises(EngineError, match="RuntimeError"):
            await asyncio.wait_for(anext(engine.generate([1, 2, 3], SamplingParams(max_tokens=2))), 30)
        monkeypatch.undo()
        assert [c async for c in engine.generate([1, 2, 3], SamplingParams(max_tokens=2))]   # the thread goes on
    finally:
        await asyncio.wait_for(engine.stop(), 30)
