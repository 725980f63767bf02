"""Time to first token of the engine alone, in this process: omlx-site's TextEngine (its engine
thread, lanes and prompt cache, no HTTP, no route) against raw mlx_lm.stream_generate, on the same
model folder and weights, taking turns run by run, every run a new prompt. What a server's TTFT
adds over raw, less this, is its HTTP, SSE and route (single_stream.py splits those by the traces).

Both sides start the clock with the prompt's tokens in hand (the chat template is not timed), and
stop it at the first token; the engine runs with a memory prompt cache as the server's does (so each
request looks up, and copies, the prefix it shares with the runs before it), or without one.

    .venv/bin/python benchmarks/engine_ttft.py [--model PATH] [--runs 8] [--no-prompt-cache]

Default model: a 40 MB float32 random llama built with the demo model's tokenizer (both sides read
the same weights; the pool would serve a quantized model dequantized on the CPU, raw mlx-lm would not).
"""

import argparse
import asyncio
import statistics
import time
from pathlib import Path

from _models import fixture

from omlx_site.process import setup_process

setup_process()   # the BLAS and malloc settings, before anything imports MLX

ASK = "Write a short story about a lighthouse keeper."


def prompt(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Request {i:06d}. {ASK}"}]


async def engine_run(engine, i: int) -> float:
    from pool.engines.protocol import SamplingParams

    tokens = engine.encode_chat(prompt(i))
    started = time.perf_counter()
    chunks = engine.generate(tokens, SamplingParams(max_tokens=4))
    await anext(chunks)
    first = time.perf_counter() - started
    await chunks.aclose()
    return first


def raw_run(model, tokenizer, i: int) -> float:
    from mlx_lm import stream_generate

    tokens = tokenizer.apply_chat_template(prompt(i), add_generation_prompt=True)
    started = time.perf_counter()
    for _ in stream_generate(model, tokenizer, tokens, max_tokens=1):
        break
    return time.perf_counter() - started


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=None)
    p.add_argument("--runs", type=int, default=8)
    p.add_argument("--no-prompt-cache", action="store_true")
    args = p.parse_args()
    model_dir = args.model or fixture("engine-ttft-40mb", 40, seed=5)
    from mlx_lm import load

    from pool.engines.generator import TextEngine
    from pool.engines.protocol import PromptCacheOptions

    raw_model, tokenizer = load(str(model_dir))
    cache = PromptCacheOptions() if args.no_prompt_cache else PromptCacheOptions(max_bytes=2**30, max_entries=10)
    engine = TextEngine("engine", model_dir, prompt_cache=cache)
    await engine.load()
    ours, raw = [], []
    try:
        for run in range(args.runs + 2):          # the first two of each are warm-up
            ours.append(await engine_run(engine, 2 * run))
            raw.append(raw_run(raw_model, tokenizer, 2 * run + 1))
    finally:
        await engine.stop()
    ours, raw = ours[2:], raw[2:]
    print(f"model {model_dir.name}, {args.runs} runs each, alternating; prompt cache "
          f"{'off' if args.no_prompt_cache else 'on (memory)'}; TTFT in ms from the prompt's tokens")
    for name, each in (("omlx-site engine", ours), ("raw stream_generate", raw)):
        each_ms = ", ".join(f"{x * 1000:.1f}" for x in each)
        print(f"{name:20} {statistics.median(each) * 1000:7.1f} median   runs {each_ms}")
    print(f"engine - raw: {(statistics.median(ours) - statistics.median(raw)) * 1000:+.1f} ms")


if __name__ == "__main__":
    asyncio.run(main())
