"""A long prompt's trace learns, step by step, how much of the prompt has been read (the console's
"prefilling 512 of 2,000"): the engine thread sets `prefill_done` on the request's progress object
after each prompt chunk, for a request alone and for one in the batch. A request alone reads its
prompt in chunks of the engine's lone step (OMLX_PREFILL_STEP_ALONE), one with company in chunks of
the shared one (OMLX_PREFILL_STEP)."""

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
    engine.prefill_step, engine.prefill_step_alone = 64, 128
    step = 64 if company else 128
    try:
        long = engine.encode_chat([{"role": "user", "content": "Tell me about the sea. " * 40}])
        seen = Seen()

        async def run(tokens, params, decoding: asyncio.Event | None = None):
            chunks = []
            async for chunk in engine.generate(tokens, params):
                chunks.append(chunk)
                if decoding is not None:
                    decoding.set()
            return chunks

        # company decoding before the long prompt comes, and still while it is read (no end of
        # sequence for them): it enters the batch, not the single path
        never_end = tuple((t, -100.0) for t in sorted(engine.tokenizer.eos_token_ids))
        decoding = [asyncio.Event() for _ in range(company)]
        others = [asyncio.ensure_future(run(long[:30], SamplingParams(max_tokens=64, logit_bias=never_end), d))
                  for d in decoding]
        for d in decoding:
            await asyncio.wait_for(d.wait(), 120)
        await run(long, SamplingParams(max_tokens=2, progress=seen))
        await asyncio.gather(*others)
    finally:
        await engine.stop()
    reads = seen.reads
    assert len(reads) >= len(long) // step - 1 and reads[0] == step, reads
    assert reads == sorted(reads) and 0 < reads[0] < reads[-1] < len(long) and seen.generated == 2
