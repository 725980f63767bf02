"""The vision engine on the two fixture VLMs (pool/catalog/fixture_vlms.py): an answer with an image is
mlx-vlm's own greedy answer, text-only chat works, the same image twice reuses the prompt cache and
another image does not, concurrent image requests all answer, the load plan's estimate of a VLM is
within 10% of what it measured."""

import asyncio
import hashlib
import io

import pytest
from PIL import Image as PILImage

from pool.catalog.discovery import weights_size
from pool.catalog.fixture_vlms import VISION_ARCHS
from pool.catalog.kinds import VISION, folder_kind
from pool.engines.protocol import PromptCacheOptions, SamplingParams
from pool.engines.vision import VisionEngine
from pool.serving.images import Image

TOKENS = 12


def png(color, size=(64, 48)) -> Image:
    buffer = io.BytesIO()
    PILImage.new("RGB", size, color).save(buffer, format="PNG")
    data = buffer.getvalue()
    return Image(data=data, digest=hashlib.sha256(data).hexdigest(), width=size[0], height=size[1], format="PNG")


def chat(image: Image | None, text: str = "What is in this picture?") -> list[dict]:
    parts = [{"type": "text", "text": text}]
    if image is not None:
        parts.insert(0, {"type": "image", "image": image})
    return [{"role": "user", "content": parts}]


@pytest.fixture(scope="module", params=VISION_ARCHS)
def vlm(request, make_model):
    return make_model(f"vlm-{request.param}", None, arch=request.param)


async def answer(engine, messages, **params) -> tuple[str, object]:
    tokens = await asyncio.to_thread(engine.encode_chat, messages)
    text, last = "", None
    async for chunk in engine.generate(tokens, SamplingParams(max_tokens=TOKENS, **params)):
        text += chunk.text
        last = chunk
    return text, last


def mlx_vlm_answer(path, messages, image) -> str:
    """mlx-vlm's own greedy answer; its detokenizer keeps the first token's leading space, which
    mlx-lm's (this server's, for every model) drops."""
    from mlx_vlm import generate, load

    from pool.engines.vision_prompt import pil_images, split_images

    model, processor = load(str(path))
    plain, images = split_images(messages)
    prompt = processor.tokenizer.apply_chat_template(plain, add_generation_prompt=True, tokenize=False)
    return generate(model, processor, prompt, image=pil_images(images) or None, max_tokens=TOKENS,
                    temperature=0.0, verbose=False).text.lstrip()


def test_a_vlm_folder_is_of_the_vision_kind(vlm):
    assert folder_kind(vlm) is VISION
    assert "vision" in VISION.capabilities and VISION.takes(folder_kind(vlm))


async def test_an_image_answer_is_mlx_vlms_own_and_text_only_works(vlm):
    engine = VisionEngine("vlm", vlm, prompt_cache=PromptCacheOptions(max_bytes=64 * 2**20))
    await engine.load()
    try:
        red = png((220, 30, 40))
        text, last = await answer(engine, chat(red), cache_prompt=False)
        assert text.lstrip() == await asyncio.to_thread(mlx_vlm_answer, vlm, chat(red), red)
        assert last.finish_reason in ("length", "stop") and last.prompt_tokens > 20   # image tokens counted
        plain, last_plain = await answer(engine, chat(None, "Hello"))
        assert last_plain.finish_reason in ("length", "stop") and last_plain.prompt_tokens < last.prompt_tokens
        assert plain.lstrip() == await asyncio.to_thread(mlx_vlm_answer, vlm, chat(None, "Hello"), None)
    finally:
        await engine.stop()


async def test_the_same_image_reuses_the_cache_and_another_does_not(vlm):
    engine = VisionEngine("vlm", vlm, prompt_cache=PromptCacheOptions(max_bytes=64 * 2**20))
    await engine.load()
    try:
        red, blue = png((220, 30, 40)), png((20, 40, 230))
        first, cold = await answer(engine, chat(red))
        again, warm = await answer(engine, chat(red))
        assert cold.cached_tokens == 0 and warm.cached_tokens == warm.prompt_tokens - 1
        assert again == first
        _, other = await answer(engine, chat(blue))
        assert other.cached_tokens == 0 and other.prompt_tokens == warm.prompt_tokens
        _, scoped = await answer(engine, chat(red), cache_scope="another-key")
        assert scoped.cached_tokens == 0
    finally:
        await engine.stop()


async def test_concurrent_image_requests_all_answer(vlm):
    engine = VisionEngine("vlm", vlm)
    await engine.load()
    try:
        images = [png((40 * i, 200 - 30 * i, 90)) for i in range(4)]
        alone = [(await answer(engine, chat(image)))[0] for image in images]
        together = await asyncio.gather(*(answer(engine, chat(image)) for image in images))
        assert [text for text, _ in together] == alone
        assert all(last.finish_reason in ("length", "stop") for _, last in together)
    finally:
        await engine.stop()


async def test_the_load_estimate_is_within_ten_percent_of_the_measured_bytes(vlm):
    engine = VisionEngine("vlm", vlm)
    loaded = await engine.load()
    try:
        assert abs(weights_size(vlm) - loaded.measured_bytes) <= 0.1 * loaded.measured_bytes
        assert engine.model_info["kv_layout"] is not None and engine.model_info["context_length"] == 4096
    finally:
        await engine.stop()


async def test_running_requests_kv_is_counted_as_live_kv(vlm):
    """The enforcer sees a vision request's KV grow: the engine counts the caches its running
    requests fill (live KV), and none once they end."""
    engine = VisionEngine("vlm", vlm)
    await engine.load()
    try:
        seen: list[int] = []
        tokens = await asyncio.to_thread(engine.encode_chat, chat(png((10, 90, 200))))
        async for _ in engine.generate(tokens, SamplingParams(max_tokens=TOKENS, cache_prompt=False)):
            seen.append(engine.cache_stats.kv_bytes)
        assert max(seen) > 0, seen
        await asyncio.sleep(0.2)
        assert engine.cache_stats.kv_bytes == 0
    finally:
        await engine.stop()
