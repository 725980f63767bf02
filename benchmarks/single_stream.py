"""Decode speed and time to first token of one stream: omlx-site vs mlx_lm.server vs raw
mlx_lm.stream_generate, on the same model folder, prompt and greedy settings.

All three run in this one script, taking turns run by run. Decode tokens/s counts the tokens after
the first over the time after the first (prefill excluded), the same way on every side, and every
run's prompt is new (no prefix cache serves it); a server's tokens are its usage's
completion_tokens (an SSE chunk carries text, and a token that completes no character arrives with
the next one). The bound share is decode tok/s against the bandwidth bound
(_bandwidth.py: the device's copy rate / the model's weight bytes). TTFT runs from sending the
request (raw: from applying the chat template) to the first token; issue 22's target is omlx-site
at most raw + 10 ms.

    .venv/bin/python benchmarks/single_stream.py [--model PATH] [--tokens 64] [--runs 3]
"""

import argparse
import itertools
import statistics
import time
from pathlib import Path

from _bandwidth import Bound
from _models import demo_model
from _servers import numbered_prompt, start_mlx_lm, start_omlx

from omlx_site.process import setup_process

setup_process()   # the BLAS and malloc settings, before anything imports MLX

ASK = "Write a short story about a lighthouse keeper."
RUNS = itertools.count()    # every run's prompt differs from the first words: no prefix cache serves it


def server_run(server, tokens: int) -> tuple[float, float]:
    """(decode tok/s, TTFT s)"""
    reply = server.stream_chat(numbered_prompt(next(RUNS), ASK), tokens)
    times, completion = reply["times"], reply["usage"]["completion_tokens"]
    return ((completion - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")), reply["ttft"]


def raw_run(model, tokenizer, tokens: int) -> tuple[float, float]:
    from mlx_lm import stream_generate

    started = time.perf_counter()
    prompt = tokenizer.apply_chat_template(numbered_prompt(next(RUNS), ASK), add_generation_prompt=True)
    times = [time.perf_counter() for _ in stream_generate(model, tokenizer, prompt, max_tokens=tokens)]
    return (len(times) - 1) / (times[-1] - times[0]), times[0] - started


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=None, help="an mlx-lm model folder (default: the demo model)")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    model = args.model or demo_model()
    bound = Bound(model)
    from mlx_lm import load

    raw_model, tokenizer = load(str(model))
    servers = []
    try:
        for start in (start_omlx, start_mlx_lm):
            servers.append(start(model))
        sides = {server.name: (lambda s=server: server_run(s, args.tokens)) for server in servers}
        sides["raw mlx_lm.stream_generate"] = lambda: raw_run(raw_model, tokenizer, args.tokens)
        for run in sides.values():
            run()                            # load and warm up
        rates: dict[str, list[float]] = {name: [] for name in sides}
        ttfts: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(args.runs):
            for name, run in sides.items():
                rate, ttft = run()
                rates[name].append(rate)
                ttfts[name].append(ttft)
    finally:
        for server in servers:
            server.stop()
    median = {name: statistics.median(r) for name, r in rates.items()}
    first = {name: statistics.median(t) for name, t in ttfts.items()}
    print(f"model {model.name}, {args.tokens} greedy tokens, {args.runs} runs each, alternating; {bound.describe()}")
    for name, runs in rates.items():
        print(f"{name:28} {median[name]:7.2f} decode tok/s  ({bound.share(median[name]):4.0%} of the bound)   "
              f"runs {', '.join(f'{x:.2f}' for x in runs)}")
    for name, runs in ttfts.items():
        each = ", ".join(f"{x * 1000:.1f}" for x in runs)
        print(f"{name:28} {first[name] * 1000:7.1f} ms TTFT (median)   runs {each}")
    ours, raw = median["omlx-site"], "raw mlx_lm.stream_generate"
    print(f"ratio omlx/raw: {ours / median[raw]:.2f}   "
          f"ratio omlx/mlx_lm.server: {ours / median['mlx_lm.server']:.2f}   "
          f"TTFT omlx - raw: {(first['omlx-site'] - first[raw]) * 1000:+.1f} ms (target <= +10), "
          f"omlx / mlx_lm.server {first['omlx-site'] / first['mlx_lm.server']:.2f}")


if __name__ == "__main__":
    main()
