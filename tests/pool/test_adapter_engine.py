"""AdapterEngine (pool/engines/adapter.py) with real MLX over random-weight bases of three families
(llama; qwen3_moe, whose experts are SwitchLinear layers; gemma3_text, sliding-window): an adapter
answers as mlx-lm's own load(base, adapter_path=...) and greedy generate do, LoRA and DoRA; the
base's module tree is left as it was and its arrays are shared, not copied: four adapters take
their own bytes of MLX's memory, not the base's; the base answers after an adapter stops; an
adapter made over another model fails to load with a message that says so."""

from __future__ import annotations

import asyncio
import functools
import gc
import json
import shutil
import struct
from contextlib import AsyncExitStack
from pathlib import Path

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from pool.engines.adapter import ADAPTER_LEAVES, AdapterEngine
from pool.engines.generator import TextEngine
from pool.engines.protocol import LoadResult, SamplingParams

ARCHS = ("llama", "qwen3_moe", "gemma3_text")
TOKENS = 12
QUESTION = [{"role": "user", "content": "Tell me about the sea."}]


@pytest.fixture(scope="module", params=ARCHS)
def arch(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def base_dir(arch, make_model) -> Path:
    return make_model(f"arch-{arch}", None, arch=arch)      # the folders tests/pool/test_architectures.py uses


@pytest.fixture(scope="module")
def adapters(arch, base_dir, make_adapter) -> list[Path]:
    return [make_adapter(f"engine-{arch}-lora{seed}", base_dir, seed=seed) for seed in range(4)]


@functools.cache
def mlx_lm_answer(base: Path, adapter: Path | None) -> str:
    from mlx_lm import generate, load

    model, tokenizer = load(str(base), adapter_path=str(adapter) if adapter else None)
    prompt = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True)
    return generate(model, tokenizer, prompt, max_tokens=TOKENS)


async def answer(engine: TextEngine) -> str:
    tokens = await asyncio.to_thread(engine.encode_chat, QUESTION)
    text = ""
    async for chunk in engine.generate(tokens, SamplingParams(max_tokens=TOKENS, cache_prompt=False)):
        text += chunk.text
    return text


async def load(stack: AsyncExitStack, engine: TextEngine) -> LoadResult:
    """Load `engine`, stopped when the stack closes (an adapter before its base: the stack's order)."""
    result = await engine.load()
    stack.push_async_callback(engine.stop)
    return result


async def loaded(stack: AsyncExitStack, engine: TextEngine) -> TextEngine:
    await load(stack, engine)
    return engine


def tensor_bytes(file: Path) -> int:
    """The bytes of a safetensors file's tensors, from its header (nothing loaded)."""
    with file.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    header.pop("__metadata__", None)
    return sum(info["data_offsets"][1] - info["data_offsets"][0] for info in header.values())


def arrays(model) -> dict[str, mx.array]:
    return dict(tree_flatten(model.parameters()))


async def test_each_adapter_answers_as_mlx_lm_loads_it(base_dir, adapters):
    expected = [mlx_lm_answer(base_dir, None)] + [mlx_lm_answer(base_dir, a) for a in adapters[:2]]
    async with AsyncExitStack() as stack:
        base = await loaded(stack, TextEngine("base", base_dir))
        assert await answer(base) == expected[0]
        lora = [await loaded(stack, AdapterEngine(f"base:{a.name}", a, base=base)) for a in adapters[:2]]
        got = [await answer(base)] + [await answer(engine) for engine in lora]
    assert got == expected
    assert len(set(got)) == 3       # each adapter changes the answer: a mix-up would show


async def test_the_base_module_tree_is_untouched_and_its_arrays_are_shared(arch, base_dir, adapters):
    async with AsyncExitStack() as stack:
        base = await loaded(stack, TextEngine("base", base_dir))
        before = await answer(base)
        base_model = base.parts()[0]
        modules = [(name, type(module)) for name, module in base_model.named_modules()]
        weights = arrays(base_model)
        adapter = await loaded(stack, AdapterEngine("base:a", adapters[0], base=base))
        assert [(name, type(module)) for name, module in base_model.named_modules()] == modules
        assert {name: id(value) for name, value in arrays(base_model).items()} == \
            {name: id(value) for name, value in weights.items()}
        assert not any(name.rsplit(".", 1)[-1] in ADAPTER_LEAVES for name in weights)
        own = mx.load(str(adapters[0] / "adapters.safetensors"))
        if arch == "qwen3_moe":
            # LoRA on experts (SwitchLinear) does not mix: the adapter keeps a tree of its own,
            # whose arrays are the base's but for its LoRA matrices
            assert not adapter.mixed
            over = arrays(adapter.parts()[0])
            mine = {name for name in over if name.rsplit(".", 1)[-1] in ADAPTER_LEAVES}
            assert {id(over[name]) for name in over.keys() - mine} == {id(value) for value in weights.values()}
            assert mine == set(own)
        else:
            # a LoRA adapter mixes: its matrices are stacked in the base engine's tree, whose arrays
            # are the base's, the very objects; its own tree is gone
            assert adapter.mixed and adapter.parts()[0] is None
            mixing = base._adapter_set
            assert {id(value) for value in arrays(mixing._tree).values()} == {id(value) for value in weights.values()}
            assert 0 <= mixing.nbytes - sum(value.nbytes for value in own.values()) < 1024   # and a scale a layer
            del mixing
        assert await answer(adapter) != before
        assert await answer(base) == before


async def test_four_adapters_take_their_own_bytes_not_the_bases(base_dir, adapters):
    files = [tensor_bytes(a / "adapters.safetensors") for a in adapters]
    async with AsyncExitStack() as stack:
        base = TextEngine("base", base_dir)
        base_bytes = (await load(stack, base)).measured_bytes
        gc.collect()
        mx.clear_cache()     # a cached buffer reused for a smaller array counts whole: start from none
        start = mx.get_active_memory()
        lora = [AdapterEngine(f"base:{a.name}", a, base=base) for a in adapters]
        measured = [(await load(stack, engine)).measured_bytes for engine in lora]
        gc.collect()
        grown = mx.get_active_memory() - start
        for got, want in zip(measured, files):
            assert abs(got - want) <= 0.03 * want, (measured, files)
        assert abs(grown - sum(files)) <= 0.1 * sum(files), (grown, files)
        for engine in lora:      # a copied weight would be made by a first answer, not by the load
            await answer(engine)
        gc.collect()
        assert mx.get_active_memory() - start < base_bytes / 2, (mx.get_active_memory() - start, base_bytes)


async def test_a_dora_adapter_answers_as_mlx_lm_loads_it(arch, base_dir, adapters, make_adapter, tmp_path):
    async with AsyncExitStack() as stack:
        base = await loaded(stack, TextEngine("base", base_dir))
        if arch == "qwen3_moe":
            # mlx-lm has no DoRA for SwitchLinear experts: such an adapter fails to load, saying so
            dora = shutil.copytree(adapters[0], tmp_path / "dora")
            config = json.loads((dora / "adapter_config.json").read_text())
            (dora / "adapter_config.json").write_text(json.dumps({**config, "fine_tune_type": "dora"}))
            with pytest.raises(ValueError, match="DoRA"):
                await AdapterEngine("base:dora", dora, base=base).load()
            assert await answer(base) == mlx_lm_answer(base_dir, None)
            return
        dora = make_adapter(f"engine-{arch}-dora", base_dir, seed=7, dora=True)
        assert json.loads((dora / "adapter_config.json").read_text())["fine_tune_type"] == "dora"
        engine = AdapterEngine("base:dora", dora, base=base)
        assert (await load(stack, engine)).measured_bytes == tensor_bytes(dora / "adapters.safetensors")
        got = await answer(engine)
    assert got == mlx_lm_answer(base_dir, dora) != mlx_lm_answer(base_dir, None)


async def test_the_base_answers_after_its_adapter_stops(base_dir, adapters):
    async with AsyncExitStack() as stack:
        base = await loaded(stack, TextEngine("base", base_dir))
        before = await answer(base)
        adapter = AdapterEngine("base:a", adapters[1], base=base)
        own = (await load(stack, adapter)).measured_bytes
        assert await answer(adapter) == mlx_lm_answer(base_dir, adapters[1])
        released = await adapter.stop()      # (the stack's stop, after, finds it stopped)
        assert released.held_bytes >= own and released.kept_bytes == 0   # its own arrays, and they went
        assert await answer(base) == before == mlx_lm_answer(base_dir, None)


def other_rank(adapter: Path, out: Path) -> Path:
    """The adapter with its config's rank doubled: LoRA layers of the same names, of other shapes."""
    copy = shutil.copytree(adapter, out)
    config = json.loads((copy / "adapter_config.json").read_text())
    config["lora_parameters"]["rank"] *= 2
    (copy / "adapter_config.json").write_text(json.dumps(config))
    return copy


@pytest.mark.parametrize("misfit", ["another model", "another rank"])
async def test_an_adapter_that_does_not_fit_its_base_fails_to_load_saying_so(misfit, base_dir, adapters, make_model,
                                                                            make_adapter, tmp_path):
    if misfit == "another model":     # a wider llama with more layers (tests/api's tiny-20)
        folder = make_adapter("engine-misfit-tiny-20", make_model("tiny-20", 20))
        detail = "no such layer in the base"
    else:
        folder = other_rank(adapters[0], tmp_path / "rank")
        detail = "where the base takes"
    async with AsyncExitStack() as stack:
        base = await loaded(stack, TextEngine("base", base_dir))
        with pytest.raises(ValueError) as failed:
            await AdapterEngine("base:misfit", folder, base=base).load()
        message = str(failed.value)
        assert message.startswith("adapters.safetensors does not fit its base model") and detail in message, message
        assert "/" not in message and folder.name not in message, message     # no path: clients see it
        assert await answer(base) == mlx_lm_answer(base_dir, None)
