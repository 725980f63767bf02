"""One image + 64 tokens on each fixture VLM (pool/catalog/fixture_vlms.py), ours (VisionEngine, as the
pool runs it) beside mlx-vlm's own `stream_generate` on the same folder and image, in one run: cold, and a
repeat of the same request (ours from the prompt cache keyed by the image's digest; mlx-vlm's from its
own PromptCacheState). Seconds to the first token and to the last, best of --rounds.

    .venv/bin/python benchmarks/vision.py [--archs qwen2_vl,gemma3_vision] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import time

from _models import CACHE, demo_model

from omlx_site.process import setup_process

setup_process()   # the BLAS and malloc settings, before anything imports MLX

TOKENS = 64
QUESTION = "Describe this picture in detail."


def picture(seed: int):
    from PIL import Image as PILImage

    from pool.serving.images import Image

    buffer = io.BytesIO()
    PILImage.new("RGB", (224, 168), (40 + seed, 120, 200 - seed)).save(buffer, format="PNG")
    data = buffer.getvalue()
    return Image(data=data, digest=hashlib.sha256(data).hexdigest(), width=224, height=168, format="PNG")


def messages(image) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": QUESTION}]}]


async def ours(path, rounds: int) -> dict:
    from pool.engines.protocol import PromptCacheOptions, SamplingParams
    from pool.engines.vision import VisionEngine

    engine = VisionEngine("bench", path, prompt_cache=PromptCacheOptions(max_bytes=256 * 2**20))
    await engine.load()
    out: dict = {}
    try:
        for r in range(rounds):
            image = picture(r)
            for label in ("cold", "cached"):
                tokens = await asyncio.to_thread(engine.encode_chat, messages(image))
                start, first, last = time.perf_counter(), None, None
                async for chunk in engine.generate(tokens, SamplingParams(max_tokens=TOKENS, stop=())):
                    first = first or time.perf_counter()
                    last = chunk
                end = time.perf_counter()
                best = out.get(label)
                row = (first - start, end - start, last.completion_tokens, last.cached_tokens)
                out[label] = row if best is None or row[1] < best[1] else best
    finally:
        await engine.stop()
    return out


def theirs(path, rounds: int) -> dict:
    from mlx_vlm import load, stream_generate
    from mlx_vlm.generate.common import PromptCacheState

    from pool.engines.vision_prompt import pil_images, split_images

    model, processor = load(str(path))
    out: dict = {}
    for r in range(rounds):
        plain, images = split_images(messages(picture(r)))
        prompt = processor.tokenizer.apply_chat_template(plain, add_generation_prompt=True, tokenize=False)
        state = PromptCacheState()
        for label in ("cold", "cached"):
            start, first, last = time.perf_counter(), None, None
            for result in stream_generate(model, processor, prompt, image=pil_images(images), max_tokens=TOKENS,
                                          temperature=0.0, prompt_cache_state=state):
                first = first or time.perf_counter()
                last = result
            end = time.perf_counter()
            row = (first - start, end - start, last.generation_tokens, last.cached_tokens)
            best = out.get(label)
            out[label] = row if best is None or row[1] < best[1] else best
    return out


def main() -> None:
    from pool.catalog.fixture_vlms import VISION_ARCHS, make_vision_fixture

    parser = argparse.ArgumentParser()
    parser.add_argument("--archs", default=",".join(VISION_ARCHS))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    demo = demo_model()
    print(f"one {224}x{168} PNG + {TOKENS} tokens, best of {args.rounds}; seconds to the first token / to the last")
    print(f"{'arch':<15}{'run':<8}{'ours ttft':>11}{'ours total':>12}{'mlx-vlm ttft':>14}{'mlx-vlm total':>15}"
          f"{'ratio':>7}  cached (ours / mlx-vlm)")
    for arch in args.archs.split(","):
        path = CACHE / f"vision-{arch}"
        make_vision_fixture(path, arch, tokenizer_from=demo)
        a, b = asyncio.run(ours(path, args.rounds)), theirs(path, args.rounds)
        for label in ("cold", "cached"):
            (t1, s1, _, c1), (t2, s2, _, c2) = a[label], b[label]
            print(f"{arch:<15}{label:<8}{t1:>11.3f}{s1:>12.3f}{t2:>14.3f}{s2:>15.3f}{s2 / s1:>7.2f}  {c1} / {c2}")


if __name__ == "__main__":
    main()
