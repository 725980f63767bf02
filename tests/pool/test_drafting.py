"""A model with a draft (engines/drafting.py), on real MLX (a two-layer random llama; a random phi3,
whose head is not its embedding, as the draft that does not agree): a lone request decodes through mlx-lm's
speculative_generate_step and answers exactly as plain greedy decoding does; an agreeing draft has
every proposed token accepted; a draft that does not agree stops being used within the request and
for the next ones (only the periodic probe tries it again); requests together decode in the batch,
plainly; the pair's bytes are counted as the model's."""

import asyncio

import pytest

from pool.engines.generator import TextEngine
from pool.engines.protocol import LoadOptions, SamplingParams
from pool.policy.drafts import MIN_TOKENS

TOKENS = 30
QUESTION = "Tell me a story about the sea, number {}."


async def answer(engine, i: int, tokens: int = TOKENS):
    prompt = await asyncio.to_thread(engine.encode_chat, [{"role": "user", "content": QUESTION.format(i)}])
    text, last = "", None
    async for chunk in engine.generate(prompt, SamplingParams(max_tokens=tokens, temperature=0, cache_prompt=False)):
        text += chunk.text
        last = chunk
    return text, last


def dense(draft) -> LoadOptions:
    """Target and draft read dequantized where quantized, as the pool reads a 4-bit model on the CPU
    backend (whose quantized matmuls are several times slower)."""
    return LoadOptions(draft=draft, dequantize=True, draft_dequantize=True)


async def answers(draft, count: int, base) -> list:
    engine = TextEngine("m", base, load=dense(draft))
    loaded = await engine.load()
    try:
        return [loaded, engine] + [await answer(engine, i) for i in range(count)]
    finally:
        await engine.stop()


@pytest.fixture(scope="module")
def plain(stand_in_demo_dir):
    return asyncio.run(answers(None, 3, stand_in_demo_dir))[2:]


def test_an_agreeing_draft_has_every_token_accepted_and_changes_no_answer(stand_in_demo_dir, plain):
    loaded, engine, *drafted = asyncio.run(answers(stand_in_demo_dir, 2, stand_in_demo_dir))
    assert [text for text, _ in drafted] == [text for text, _ in plain[:2]]
    first = drafted[0][1]
    assert first.draft_proposed >= TOKENS * 3 // 4 - 3 and first.draft_accepted == first.draft_proposed
    assert drafted[1][1].draft_proposed > 0      # the first was cold, its rate not counted: drafted again
    assert loaded.measured_bytes == 2 * loaded.model_info["draft"]["bytes"]     # the pair (the same model twice)


def test_a_draft_that_does_not_agree_is_dropped_and_changes_no_answer(stand_in_demo_dir, make_model, plain):
    unrelated = make_model("arch-phi3", None, arch="phi3")      # the same tokenizer, its own random head
    _, _, *drafted = asyncio.run(answers(unrelated, 3, stand_in_demo_dir))
    assert [text for text, _ in drafted] == [text for text, _ in plain]
    first = drafted[0][1]
    # judged once MIN_TOKENS were proposed: it went on plainly from there
    assert MIN_TOKENS <= first.draft_proposed < MIN_TOKENS + 6 and first.draft_accepted < 0.3 * first.draft_proposed
    assert drafted[1][1].draft_proposed == 0          # then plain decoding (measured once) ...
    assert drafted[2][1].draft_proposed == 0          # ... and not the draft again: its acceptance is too low


def test_requests_together_decode_plainly_in_the_batch(stand_in_demo_dir):
    async def run():
        engine = TextEngine("m", stand_in_demo_dir, load=dense(stand_in_demo_dir))
        await engine.load()
        try:
            alone = [await answer(engine, i, 12) for i in range(2)]
            together = await asyncio.gather(*(answer(engine, i, 12) for i in range(2)))
            return alone, together
        finally:
            await engine.stop()
    alone, together = asyncio.run(run())
    # a request that began alone, drafting, hands its KV over to the batch as the other arrives
    assert [t for t, _ in together] == [t for t, _ in alone]


def test_dropping_the_draft_mid_request_goes_on_plainly(stand_in_demo_dir, plain):
    """Memory pressure's DROP_DRAFT: the lone drafting request continues without it, to the same answer."""
    async def run():
        engine = TextEngine("m", stand_in_demo_dir, load=dense(stand_in_demo_dir))
        loaded = await engine.load()
        try:
            prompt = await asyncio.to_thread(engine.encode_chat, [{"role": "user", "content": QUESTION.format(0)}])
            text, last, freed = "", None, None
            async for chunk in engine.generate(prompt, SamplingParams(max_tokens=TOKENS, temperature=0,
                                                                      cache_prompt=False)):
                text += chunk.text
                last = chunk
                if freed is None and text:
                    freed = await engine.drop_draft()
            return loaded, engine, text, last, freed, await engine.drop_draft()
        finally:
            await engine.stop()
    loaded, engine, text, last, freed, again = asyncio.run(run())
    assert text == plain[0][0]
    assert freed > 0 and 2 * freed == loaded.measured_bytes and again == 0     # the draft is the model's twin
    assert 0 < last.draft_proposed < TOKENS - 3                # it drafted, then stopped
    assert "draft" not in engine.model_info


@pytest.mark.parametrize("dequantize", [False, True])
def test_a_quantized_draft_is_read_as_its_own_folder_asks(demo_model_dir, dequantize):
    # the pool dequantizes a folder on the CPU backend by the folder (its `dequantize`), the draft's
    # own, whatever its model's: a 4-bit draft of a bf16 model is read dense where its folder would be
    import json

    import mlx.nn as nn

    from pool.engines.drafting import load_drafter

    config = json.loads((demo_model_dir / "config.json").read_text())
    assert "quantization" in config
    drafter = load_drafter(LoadOptions(draft=demo_model_dir, draft_dequantize=dequantize), config, "m")
    assert drafter is not None
    quantized = [m for _, m in drafter.model.named_modules() if isinstance(m, nn.QuantizedLinear)]
    assert bool(quantized) != dequantize
