"""An unload gives the model's memory back: no frame, lane, generator or traceback holds its weights
when MLX's buffer cache is cleared, so they are not left in the cache (issue 22: a 20 GB model sat in
the cache on CUDA until the process exited). Weak references to the weights prove it; the demo model
and a random-weight llama, real MLX throughout."""

from __future__ import annotations

import asyncio
import weakref

import mlx.core as mx
from mlx.utils import tree_flatten

from pool.engines.generator import TextEngine
from pool.engines.protocol import PromptCacheOptions, SamplingParams


async def _chat(engine: TextEngine, tokens: list[int], max_tokens: int, *, cut_after: int | None = None) -> int:
    got = 0
    async for _ in engine.generate(tokens, SamplingParams(max_tokens=max_tokens)):
        got += 1
        if cut_after is not None and got >= cut_after:
            break
    return got


async def test_an_unload_leaves_neither_the_weights_nor_the_cache_behind(demo_model_dir):
    engine = TextEngine("demo", demo_model_dir, prompt_cache=PromptCacheOptions(max_bytes=64 * 2**20))
    loaded = await engine.load()
    weights = [weakref.ref(w) for _, w in tree_flatten(engine._model.parameters())]
    prompt = engine.encode_chat([{"role": "user", "content": "Say hello."}])
    # every way a request uses the model: alone, batched, cut short, a prompt-cache hit, and one
    # still decoding when the unload comes
    await _chat(engine, prompt, 6)
    await asyncio.gather(_chat(engine, prompt, 6), _chat(engine, prompt, 9), _chat(engine, prompt, 30, cut_after=2))
    running = asyncio.ensure_future(_chat(engine, prompt, 400))
    await asyncio.sleep(0.2)

    release = await asyncio.wait_for(engine.stop(), 60)
    await asyncio.gather(running, return_exceptions=True)

    assert release.kept_bytes == 0                        # nothing held them when the cache was cleared
    assert all(ref() is None for ref in weights)
    assert release.cache_after < 0.05 * loaded.measured_bytes, release
    assert release.freed_bytes >= 0.9 * loaded.measured_bytes, release
    assert mx.get_cache_memory() < 0.05 * loaded.measured_bytes


async def test_a_load_that_fails_after_its_weights_lets_them_go(make_model, monkeypatch):
    """The failure's traceback reaches the waiting coroutine (and the pool keeps it): its frames must
    not keep the weights read before the failure."""
    import pool.engines.generator as generator

    weights: list[weakref.ref] = []
    fill = generator.fill_weights

    def watched_fill(model, group_bytes, progress=None):
        weights.extend(weakref.ref(w) for _, w in tree_flatten(model.parameters()))
        return fill(model, group_bytes, progress)

    def broken(model, config):
        raise RuntimeError("config unreadable")
    monkeypatch.setattr(generator, "fill_weights", watched_fill)
    monkeypatch.setattr(generator, "model_info", broken)
    engine = TextEngine("broken", make_model("release-broken", 20, seed=3))
    try:
        await asyncio.wait_for(engine.load(), 60)
    except RuntimeError as e:
        error = e                                       # kept, as the pool keeps a load's failure
    else:
        raise AssertionError("the load should have failed")
    await asyncio.to_thread(engine._thread.join, 30)
    assert weights and all(ref() is None for ref in weights)
    assert error.__traceback__ is not None and mx.get_cache_memory() < 5 * 10**6
