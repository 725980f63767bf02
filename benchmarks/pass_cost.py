"""What one forward pass over a few new tokens costs on a long cache, by the pass's length, in raw
mlx-lm: a length met before against one never met (MLX's CUDA backend compiles kernels per shape),
and a pass of many tokens against one of one token. A later chat turn, a prompt cut at a checkpoint
and a draft's verifying step are such passes. The cache grows by each pass, as a chat's does.

    .venv/bin/python benchmarks/pass_cost.py MODEL_FOLDER [--history 1500]"""
import argparse
import sys
import time

import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache


def timed(model, cache, n: int) -> float:
    tokens = mx.array([[100 + (i * 7) % 900 for i in range(n)]])
    mx.synchronize()
    t = time.perf_counter()
    mx.eval(model(tokens, cache=cache))
    return (time.perf_counter() - t) * 1000


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--history", type=int, default=1500)
    a = p.parse_args()
    model, _ = load(a.model)
    print(mx.default_device(), mx.device_info().get("device_name"), a.model, flush=True)
    cache = make_prompt_cache(model)
    for chunk in range(0, a.history, 512):
        timed(model, cache, min(512, a.history - chunk))
    print("types", sorted({type(c).__name__ for c in cache}))
    rows = []
    for n in [20, 13, 20, 13, 1, 1, 20, 27, 27, 31, 20, 13, 44, 1, 44, 20]:
        rows.append((n, timed(model, cache, n)))
    print("pass length -> ms (in order; the cache grows by each):")
    print("  " + ", ".join(f"{n}:{ms:.1f}" for n, ms in rows), flush=True)


if __name__ == "__main__":
    sys.exit(main())
