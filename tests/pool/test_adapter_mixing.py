"""Requests of several LoRA adapters and of their base in one batch (pool/engines/multi_lora.py):
the stacked layer adds, row by row, what mlx-lm's LoRALinear adds for that row's adapter (ranks
padded, an adapter detached in the middle of the stack); over random-weight bases of two families
(llama, and gemma3_text, whose sliding-window caches keep every request in the batch), requests for
the base and adapters of other ranks and layers arriving together run in one batch and each answers
as mlx-lm's load(base, adapter_path) and greedy generate do; an adapter unloaded mid-request ends
its own request, not the base's."""

from __future__ import annotations

import asyncio
import functools
from contextlib import AsyncExitStack
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.tuner.lora import LoRALinear

from pool.engines.adapter import AdapterEngine
from pool.engines.generator import TextEngine
from pool.engines.multi_lora import AdapterSet, Fixed, Rows, gathered_first, masked_stack, stacking_pays
from pool.engines.protocol import RequestAborted, SamplingParams

TOKENS = 12
QUESTION = [{"role": "user", "content": "Tell me about the sea."}]


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 8)

    def __call__(self, x, cache=None):
        return self.proj(x)


def lora(base: nn.Linear, rank: int, scale: float, seed: int) -> LoRALinear:
    mx.random.seed(seed)
    layer = LoRALinear.from_base(base, r=rank, scale=scale)
    layer.lora_b = mx.random.normal(layer.lora_b.shape) * 0.5
    return layer


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])    # MLX's CPU gather_mm takes float32 only
def test_each_row_adds_its_own_adapters_update(dtype):
    mx.random.seed(0)
    model = Tiny()
    model.set_dtype(dtype)
    one, two = lora(model.proj, 2, 10.0, 1), lora(model.proj, 4, 3.0, 2)    # other ranks: padded
    one.set_dtype(dtype)
    two.set_dtype(dtype)
    tol = 1e-5 if dtype == mx.float32 else 3e-2
    adapters = AdapterSet(model)
    adapters.add("one", {"proj": (one.lora_a, one.lora_b, one.scale)})
    adapters.add("two", {"proj": (two.lora_a, two.lora_b, two.scale)})
    x = mx.random.normal((3, 5, 16)).astype(dtype)
    mixed = adapters.run([adapters.slot("two"), 0, adapters.slot("one")], x)
    for row, want in enumerate([two(x[0:1]), model(x[1:2]), one(x[2:3])]):
        assert mx.allclose(mixed[row:row + 1], want, atol=tol, rtol=tol), row
    assert not mx.allclose(two(x[0:1]), model(x[0:1]), atol=1e-3 if dtype == mx.float32 else 1e-1)    # not nothing
    adapters.remove("one")                       # the stack shrinks: "two" still gets its own
    assert mx.allclose(Fixed(adapters, "two")(x), two(x), atol=tol, rtol=tol)
    assert mx.array_equal(Fixed(adapters, None)(x), model(x))
    assert adapters.nbytes == two.lora_a.nbytes + two.lora_b.nbytes


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_both_ways_of_mixing_give_each_row_its_own_adapters_update(dtype):
    """The stacked product under the mask and gathering each row's matrices first agree, rows out of
    order, one token (a decode step) and several (a prompt); which one runs is stacking_pays'."""
    slots, rank, inputs, outputs = 3, 4, 32, 24
    a = mx.random.normal((inputs, slots, rank), key=mx.random.key(0)).astype(dtype)
    b = mx.random.normal((slots, rank, outputs), key=mx.random.key(1)).astype(dtype)
    index = mx.array([2, 0, 2], mx.uint32)
    rows = Rows()
    rows.current = (index, mx.ones((3,)))
    tol = 1e-4 if dtype == mx.float32 else 5e-2
    for tokens in (1, 5):
        x = mx.random.normal((3, tokens, inputs), key=mx.random.key(tokens)).astype(dtype)
        want = mx.stack([x[i] @ a[:, s] @ b[s] for i, s in enumerate(index.tolist())])
        for got in (masked_stack(x, a, b, rows.mask(slots, rank, dtype)), gathered_first(x, a, b, index)):
            assert mx.allclose(got.astype(mx.float32), want.astype(mx.float32), rtol=tol, atol=tol * 10)
    assert stacking_pays(16 * 8, 2048) and not stacking_pays(64 * 64, 2048)


class Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(16, 16), nn.Linear(16, 8)

    def __call__(self, x, cache=None):
        return self.second(self.first(x))


def test_an_adapter_whose_first_layer_has_scale_0_keeps_its_other_layers_scale():
    """PEFT's per-module alphas: a layer's own scale is kept, even where the first layer's is 0."""
    mx.random.seed(0)
    model = Two()
    first, second = lora(model.first, 2, 0.0, 1), lora(model.second, 2, 4.0, 2)
    adapters = AdapterSet(model)
    adapters.add("peft", {"first": (first.lora_a, first.lora_b, 0.0),
                          "second": (second.lora_a, second.lora_b, 4.0)})
    x = mx.random.normal((2, 3, 16))
    assert mx.allclose(Fixed(adapters, "peft")(x), second(model.first(x)), atol=1e-5)


@pytest.fixture(scope="module", params=("llama", "gemma3_text"))
def arch(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def base_dir(arch, make_model) -> Path:
    return make_model(f"arch-{arch}", None, arch=arch)


@pytest.fixture(scope="module")
def adapters(arch, base_dir, make_adapter) -> list[Path]:
    return [make_adapter(f"mix-{arch}-r4", base_dir, seed=11, rank=4, layers=2),
            make_adapter(f"mix-{arch}-r8", base_dir, seed=12, rank=8, layers=4)]


@functools.cache
def mlx_lm_answer(base: Path, adapter: Path | None) -> str:
    from mlx_lm import generate, load

    model, tokenizer = load(str(base), adapter_path=str(adapter) if adapter else None)
    prompt = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True)
    return generate(model, tokenizer, prompt, max_tokens=TOKENS)


async def answer(engine: TextEngine, max_tokens: int = TOKENS) -> str:
    tokens = await asyncio.to_thread(engine.encode_chat, QUESTION)
    text = ""
    async for chunk in engine.generate(tokens, SamplingParams(max_tokens=max_tokens, cache_prompt=False)):
        text += chunk.text
    return text


async def engines(stack: AsyncExitStack, base_dir: Path, adapters: list[Path]) -> tuple[TextEngine, list]:
    base = TextEngine("base", base_dir)
    await base.load()
    stack.push_async_callback(base.stop)
    lora = []
    for folder in adapters:
        engine = AdapterEngine(f"base:{folder.name}", folder, base=base)
        await engine.load()
        stack.push_async_callback(engine.stop)
        assert engine.mixed
        lora.append(engine)
    return base, lora


async def test_the_base_and_its_adapters_answer_together_in_one_batch(base_dir, adapters):
    expected = [mlx_lm_answer(base_dir, None)] + [mlx_lm_answer(base_dir, a) for a in adapters]
    async with AsyncExitStack() as stack:
        base, lora = await engines(stack, base_dir, adapters)
        calls: list[list[int]] = []
        mixing = base._adapter_set
        run = mixing.run

        def recorded(slots, inputs, **kwargs):
            calls.append(list(slots))
            return run(slots, inputs, **kwargs)
        mixing.run = recorded
        got = await asyncio.gather(answer(base), *(answer(engine) for engine in lora))
        del mixing
    assert got == expected
    assert len(set(got)) == 3
    assert any(sorted(set(slots)) == [0, 1, 2] for slots in calls), calls[:5]


async def test_an_adapter_unloaded_mid_request_ends_its_request_not_the_bases(base_dir, adapters):
    async with AsyncExitStack() as stack:
        base, (first, _) = await engines(stack, base_dir, adapters)
        tokens = await asyncio.to_thread(base.encode_chat, QUESTION)
        long = SamplingParams(max_tokens=2000, cache_prompt=False)
        adapter_stream = first.generate(tokens, long)
        await adapter_stream.__anext__()
        base_answer = asyncio.ensure_future(answer(base))
        await first.stop("unloaded by the test")
        with pytest.raises(RequestAborted) as aborted:
            async for _ in adapter_stream:
                pass
        assert aborted.value.code == "model_unloaded"
        assert await base_answer == mlx_lm_answer(base_dir, None)
        assert first.model_id not in base._adapter_set
