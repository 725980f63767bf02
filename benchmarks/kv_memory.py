"""Measured KV bytes of one long request under each KV limit: none, kv_bits 8, kv_bits 4 and
max_kv_size 1024, through the server (the snapshot's `kv_bytes`, the nbytes of the request's live
KV arrays, sampled while it runs), at several prompt lengths, in one run.

    .venv/bin/python benchmarks/kv_memory.py [--model PATH] [--tokens 1024,2048,4000]
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

import httpx
from _models import fixture
from _servers import start_omlx

CONFIGS = {"none": {}, "kv_bits 8": {"kv_bits": 8}, "kv_bits 4": {"kv_bits": 4},
           "max_kv_size 1024": {"max_kv_size": 1024}}


def peak_kv(server, prompt_tokens: int, fields: dict) -> int:
    """The largest kv_bytes the snapshot shows while one request of `prompt_tokens` runs."""
    prompt = " ".join(["tok"] * prompt_tokens)       # one token a word for this tokenizer, near enough
    peak, done = 0, threading.Event()

    def sample():
        nonlocal peak
        while not done.is_set():
            try:
                row = next(m for m in httpx.get(server.url + "/api/pool", timeout=60).json()["models"]
                           if m["id"] == server.model)
            except httpx.HTTPError:
                continue
            peak = max(peak, row["kv_bytes"] or 0)
            time.sleep(0.02)
    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        r = httpx.post(server.url + "/v1/completions", json={"model": server.model, "prompt": prompt, "max_tokens": 48,
                                                             "temperature": 0, "cache_prompt": False, **fields},
                       timeout=900)
    finally:
        done.set()
        sampler.join()
    if r.status_code != 200:   # e.g. a backend without a kernel for quantized KV: say so in the table
        print(f"  {fields or 'no limit'} at {prompt_tokens} tokens: {r.status_code} {r.json()['error']['message']}")
        return None
    return peak


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=None,
                   help="default: an 80 MB float32 fixture (24 layers, 3 KV heads of 64, like the demo model)")
    p.add_argument("--tokens", default="1024,2048,4000")
    args = p.parse_args()
    model = args.model or fixture("kv-bench-80", 80)
    lengths = [int(t) for t in args.tokens.split(",")]
    server = start_omlx(model)
    try:
        peak_kv(server, 16, {})                                   # load and warm up
        table = {name: [peak_kv(server, n, fields) for n in lengths] for name, fields in CONFIGS.items()}
    finally:
        server.stop()
    print(f"model {model.name}: peak live KV of one request (MB), by prompt tokens")
    print(f"{'':20}" + "".join(f"{n:>12}" for n in lengths) + f"{'ratio':>10}")
    base = table["none"][-1]

    def mb(b):
        return f"{b / 1e6:12.2f}" if b is not None else f"{'failed':>12}"

    def ratio(b):
        return f"{b / base:.2f}x" if b is not None and base else "n/a"
    for name, row in table.items():
        print(f"{name:20}" + "".join(mb(b) for b in row) + f"{ratio(row[-1]):>10}")
    rotating = table["max_kv_size 1024"]
    print(f"at {lengths[-1]} tokens: 8-bit {ratio(table['kv_bits 8'][-1])} (target <= 0.55), 4-bit "
          f"{ratio(table['kv_bits 4'][-1])} (target <= 0.3); rotating{mb(rotating[0])} ->{mb(rotating[-1])} MB "
          f"from {lengths[0]} to {lengths[-1]} tokens (target: flat)")


if __name__ == "__main__":
    main()
