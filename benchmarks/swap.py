"""Swapping models: a one-token request to model B while model A holds the only slot
(OMLX_MAX_LOADED_MODELS=1), so omlx-site evicts A and loads B before it answers, vs raw
mlx_lm.load of B plus the same one-token generation in this process. Time from sending the request
(or calling load) to the first token; the two take turns, --rounds times, after one untimed turn each.

    .venv/bin/python benchmarks/swap.py [--model-a PATH] [--model-b PATH] [--rounds 3]

Without --model-a/--model-b, two 500 MB float32 random-weight fixtures are built once in the
benchmark cache. Target: omlx/raw <= 1.1.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from pathlib import Path

from _models import fixture
from _servers import numbered_prompt, start_omlx

from omlx_site.process import setup_process

setup_process()   # the BLAS and malloc settings, before anything imports MLX

ASK = "Say hello."


def omlx_swap(server, a: str, b: str, i: int) -> float:
    server.stream_chat(numbered_prompt(i, ASK), 1, model=a)            # A holds the slot
    return server.stream_chat(numbered_prompt(i + 1, ASK), 1, model=b)["ttft"]


def raw_swap(b: Path, i: int) -> float:
    import mlx.core as mx
    from mlx_lm import load, stream_generate

    started = time.perf_counter()
    model, tokenizer = load(str(b))
    prompt = tokenizer.apply_chat_template(numbered_prompt(i, ASK), add_generation_prompt=True)
    next(iter(stream_generate(model, tokenizer, prompt, max_tokens=1)))
    elapsed = time.perf_counter() - started
    del model, tokenizer
    gc.collect()
    mx.clear_cache()                         # the next round loads from the files again
    return elapsed


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-a", type=Path, default=None, help="the model evicted (default: a 500 MB fixture)")
    p.add_argument("--model-b", type=Path, default=None, help="the model loaded (default: another 500 MB fixture)")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    a = args.model_a or fixture("swap-a-500mb", 500, seed=1)
    b = args.model_b or fixture("swap-b-500mb", 500, seed=2)
    server = start_omlx(a, b, OMLX_MAX_LOADED_MODELS="1")
    ours, raw = [], []
    try:
        omlx_swap(server, a.name, b.name, 0)     # untimed: imports, files in the page cache, shapes compiled
        raw_swap(b, 2)
        for r in range(args.rounds):
            ours.append(omlx_swap(server, a.name, b.name, 10 + 4 * r))
            raw.append(raw_swap(b, 12 + 4 * r))
    finally:
        server.stop()
    o, w = statistics.median(ours), statistics.median(raw)
    print(f"model A {a.name} -> model B {b.name}; {args.rounds} round(s), alternating; seconds to the first token")
    print(f"omlx-site (evict A, load B, 1 token):  {o:7.2f}   runs {', '.join(f'{x:.2f}' for x in ours)}")
    print(f"raw mlx_lm.load(B) + 1 token:          {w:7.2f}   runs {', '.join(f'{x:.2f}' for x in raw)}")
    print(f"ratio omlx/raw: {o / w:.2f} (target <= 1.1)")


if __name__ == "__main__":
    main()
