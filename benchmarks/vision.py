"""One image + 64 tokens on each fixture VLM (pool/catalog/fixture_vlms.py), ours (VisionEngine, as the
pool runs it) beside mlx-vlm's own `stream_generate` on the same folder and image, in one run: cold, and a
repeat of the same request (ours from the prompt cache keyed by the image's digest; mlx-vlm's from its
own PromptCacheState). Seconds to the first token and to the last, best of --rounds. Then the same two
requests server to server: omlx-site (`manage.py serve`) beside mlx_vlm.server, each streaming the OpenAI
chat API with the PNG as an `image_url` data: URL; a server of theirs that does not start or answer is one
line saying why, and its columns are blank.

    .venv/bin/python benchmarks/vision.py [--archs qwen2_vl,gemma3_vision] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import io
import time

from _models import CACHE, demo_model
from _servers import Running, start_mlx_vlm, start_omlx

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


def url_messages(image) -> list[dict]:
    url = "data:image/png;base64," + base64.b64encode(image.data).decode()
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": QUESTION}]}]


def over_http(server: Running, rounds: int) -> dict:
    """ours() and theirs() through a server's streamed chat API. One request on another image first, on
    both servers: the first after a start pays one-off costs (kernels, buffers) that are not the image's."""
    server.wait_warm()
    server.stream_chat(url_messages(picture(99)), TOKENS)
    out: dict = {}
    for r in range(rounds):
        chat = url_messages(picture(r))
        for label in ("cold", "cached"):
            reply = server.stream_chat(chat, TOKENS)
            usage = reply["usage"]
            last = reply["times"][-1] - reply["started"] if reply["times"] else float("nan")
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", "-")
            row = (reply["ttft"], last, usage.get("completion_tokens"), cached)
            best = out.get(label)
            out[label] = row if best is None or row[1] < best[1] else best
    return out


def served(start, path, rounds: int) -> dict:
    server = start(path)
    try:
        return over_http(server, rounds)
    finally:
        server.stop()


def theirs_served(arch: str, path, rounds: int) -> dict | None:
    """mlx_vlm.server's rows, or None after one line saying why there are none."""
    try:
        return served(start_mlx_vlm, path, rounds)
    except Exception as e:   # noqa: BLE001 - any failure of theirs is a line in the table, not the end of it
        print(f"mlx_vlm.server on {arch}: no rows ({type(e).__name__}: {e})")
        return None


HEADER = (f"{'arch':<15}{'run':<8}{'ours ttft':>11}{'ours total':>12}{'mlx-vlm ttft':>14}{'mlx-vlm total':>15}"
          f"{'ratio':>7}  cached (ours / mlx-vlm)")


def main() -> None:
    from pool.catalog.fixture_vlms import VISION_ARCHS, make_vision_fixture

    parser = argparse.ArgumentParser()
    parser.add_argument("--archs", default=",".join(VISION_ARCHS))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    demo, archs = demo_model(), args.archs.split(",")
    print(f"one {224}x{168} PNG + {TOKENS} tokens, best of {args.rounds}; seconds to the first token / to the last")
    print("in process: VisionEngine / mlx_vlm.stream_generate")
    print(HEADER)
    for arch in archs:
        path = CACHE / f"vision-{arch}"
        make_vision_fixture(path, arch, tokenizer_from=demo)
        a, b = asyncio.run(ours(path, args.rounds)), theirs(path, args.rounds)
        for label in ("cold", "cached"):
            (t1, s1, _, c1), (t2, s2, _, c2) = a[label], b[label]
            print(f"{arch:<15}{label:<8}{t1:>11.3f}{s1:>12.3f}{t2:>14.3f}{s2:>15.3f}{s2 / s1:>7.2f}  {c1} / {c2}")
    print("\nserver to server, streamed OpenAI chat: omlx-site (manage.py serve) / mlx_vlm.server")
    print(HEADER + "  (completion tokens)")
    for arch in archs:
        path = CACHE / f"vision-{arch}"
        a, b = served(start_omlx, path, args.rounds), theirs_served(arch, path, args.rounds)
        for label in ("cold", "cached"):
            t1, s1, n1, c1 = a[label]
            if b is None:
                print(f"{arch:<15}{label:<8}{t1:>11.3f}{s1:>12.3f}{'-':>14}{'-':>15}{'-':>7}  {c1} / -  ({n1} / -)")
                continue
            t2, s2, n2, c2 = b[label]
            print(f"{arch:<15}{label:<8}{t1:>11.3f}{s1:>12.3f}{t2:>14.3f}{s2:>15.3f}{s2 / s1:>7.2f}  {c1} / {c2}"
                  f"  ({n1} / {n2})")


if __name__ == "__main__":
    main()
