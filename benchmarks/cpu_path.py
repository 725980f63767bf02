"""The CPU path: the demo model's prefill and decode tokens/s with MLX's bundled BLAS vs the one
omlx_site.blas preloads, quantized vs dequantized to float32, plus a float32 matmul's GFLOPS.

Each variant runs in a fresh subprocess (the BLAS is chosen before MLX is imported, once per
process) and loads the model the way the server does (pool.engines.loading.load_weights, with
OMLX_CPU_DEQUANTIZE off or on). Greedy, batch 1, after a short warm-up; prefill is one forward pass
over the prompt, decode counts the tokens after it.

    .venv/bin/python benchmarks/cpu_path.py [--prompt-tokens 256] [--tokens 32] [--blas auto,mkl]
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _models import as_the_pool_loads, demo_model

import omlx_site.blas
from omlx_site.process import setup_process

setup_process()   # the BLAS and malloc settings, before anything imports MLX

TEXT = ("The lighthouse keeper climbed the spiral stairs each evening, counting the steps, trimming the wick "
        "and writing the weather in a small book that nobody else would ever read. ")


def worker(model_dir: str, prompt_tokens: int, tokens: int) -> dict:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from pool.engines.loading import load_weights

    a = mx.random.normal((1024, 1024))
    mx.eval(a @ a)
    started, n = time.perf_counter(), 0
    while n < 3 or time.perf_counter() - started < 0.5:
        mx.eval(a @ a)
        n += 1
    gflops = 2 * 1024**3 * n / (time.perf_counter() - started) / 1e9
    del a
    mx.clear_cache()

    started = time.perf_counter()
    model, tokenizer, config = load_weights(Path(model_dir), dequantize=as_the_pool_loads(Path(model_dir)))
    load_s = time.perf_counter() - started
    active = mx.get_active_memory()
    ids = tokenizer.encode(TEXT * (prompt_tokens // 20 + 1))[:prompt_tokens]

    def run(prompt: list[int], steps: int) -> tuple[float, float]:
        cache = make_prompt_cache(model)
        t0 = time.perf_counter()
        logits = model(mx.array(prompt)[None], cache=cache)
        y = mx.argmax(logits[:, -1, :], axis=-1)
        mx.eval(y)
        t1 = time.perf_counter()
        for _ in range(steps):
            y = mx.argmax(model(y[:, None], cache=cache)[:, -1, :], axis=-1)
            mx.eval(y)
        t2 = time.perf_counter()
        return len(prompt) / (t1 - t0), steps / (t2 - t1) if steps else 0.0

    run(ids[:16], 2)   # warm-up
    prefill, decode = run(ids, tokens)
    return {"blas": omlx_site.blas.state["blas"], "dequantized": bool(config.get("dequantized")),
            "gflops": gflops, "load_s": load_s, "active_mb": active / 1e6, "prefill": prefill, "decode": decode}


def variant(model_dir, blas: str, dequantize: str, args) -> dict:
    env = {**os.environ, "OMLX_BLAS": blas, "OMLX_CPU_DEQUANTIZE": dequantize}
    out = subprocess.run([sys.executable, __file__, "--worker", str(model_dir), "--prompt-tokens",
                          str(args.prompt_tokens), "--tokens", str(args.tokens)],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--tokens", type=int, default=32, help="decode tokens")
    p.add_argument("--blas", default="auto", help="preloaded BLAS to compare with the bundled one: "
                   "comma-separated OMLX_BLAS values (auto, openblas, mkl)")
    p.add_argument("--model", help="an mlx-lm folder with a quantized model (default: the demo model)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.prompt_tokens, args.tokens)))
        return
    model = Path(args.model) if args.model else demo_model()
    rows = []
    for blas in ["off", *args.blas.split(",")]:
        for dequantize in ("off", "on"):
            row = variant(model, blas, dequantize, args)
            row["label"] = f"{'dequantized f32' if row['dequantized'] else 'quantized'}, {row['blas']}"
            rows.append(row)
            print(f"  {row['label']}: done", file=sys.stderr)
    base = rows[0]
    print(f"model {model.name}, {args.prompt_tokens}-token prompt, {args.tokens} greedy decode tokens, batch 1; "
          f"one run each, each in a fresh process")
    print(f"{'variant':<28} {'matmul GFLOPS':>13} {'load s':>7} {'active MB':>9} {'prefill tok/s':>13} "
          f"{'x':>6} {'decode tok/s':>12} {'x':>6}")
    for r in rows:
        print(f"{r['label']:<28} {r['gflops']:13.1f} {r['load_s']:7.2f} {r['active_mb']:9.1f} {r['prefill']:13.1f} "
              f"{r['prefill'] / base['prefill']:6.1f} {r['decode']:12.1f} {r['decode'] / base['decode']:6.1f}")
    best = max(rows, key=lambda r: r["prefill"])
    ratio = best["prefill"] / base["prefill"]
    print(f"best prefill: {best['label']}, {ratio:.1f}x the bundled quantized figure "
          f"(target >= 15x: {'met' if ratio >= 15 else 'NOT met'})")

if __name__ == "__main__":
    main()
