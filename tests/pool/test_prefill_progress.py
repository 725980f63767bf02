"""A long prompt's trace learns, step by step, how much of the prompt has been read (the console's
"prefilling 512 of 2,000"): the engine thread sets `prefill_done` on the request's progress object
after each prompt chunk, for a request alone and for one in the batch."""

from __future__ import annotations

import asyncio

import pytest

from pool.engines.generator import TextEngine
from pool.engines.protocol import SamplingParams
from tests.conftest import as_the_pool_loads


class Seen:
    """Stands for a trace: records every value the engine thread gives `prefill_done`."""

    def __init__(self):
        self.reads: list[int] = []
        self.generated = 0

    @property
    def prefill_done(self) -> int:
        return self.reads[-1] if self.reads else 0

    @prefill_done.setter
    def prefill_done(self, value: int) -> None:
        self.reads.append(value)


@pytest.mark.parametrize("company", [0, 2], ids=["alone", "in the batch"])
async def test_the_prompt_read_so_far_reaches_the_request_chunk_by_chunk(demo_model_dir, company):
    engine = TextEngine("demo", demo_model_dir, load=as_the_pool_loads(demo_model_dir))
    await engine.load()
    engine.prefill_step = 64
    try:
        long = engine.encode_chat([{"role": "user", "content": "Tell me about the sea. " * 40}])
        seen = Seen()

        async def run(tokens, params):
            return [c async for c in engine.generate(tokens, params)]

        # company still decoding while the long prompt is read: it enters the batch, not the single path
        others = [asyncio.ensure_future(run(long[:30], SamplingParams(max_tokens=64))) for _ in range(company)]
        await run(long, SamplingParams(max_tokens=2, progress=seen))
        await asyncio.gather(*others)
    finally:
        await engine.stop()
    reads = seen.reads
    assert len(reads) >= len(long) // 64 - 1, reads
    assert reads == sorted(reads) and 0 < reads[0] < reads[-1] < len(long) and seen.generated == 2
