"""Resident memory across rounds of concurrent streams: does the server give back what a round took?

Starts `manage.py serve` on the demo model (OMLX_MAX_CONCURRENT = --streams, so a round runs at
once), loads it and takes the loaded baseline. Then round 0 (it pays for one-time things: the
prompt cache's first entries, tokenizer tables) and --rounds more, each of --streams concurrent
streamed chats, each a different prompt with a shared opening (so the prompt cache is used); after
each, once the pool is idle and a second has passed, one row: the process's RSS (psutil), MLX's
active and cache bytes and the prompt caches' bytes (the snapshot), RSS and active also as the
change from the loaded baseline. The enforcer counts RSS as usage, so RSS that stays up after a round is
memory the pool cannot use.

    .venv/bin/python benchmarks/rss_rounds.py [--rounds 8] [--streams 32] [--tokens 48]

OMLX_BENCH_ENV="OMLX_A=1 ..." passes settings to the server (OMLX_PROMPT_CACHE_BYTES=off, say).
"""

from __future__ import annotations

import argparse
import asyncio
import time

import httpx
import psutil
from _models import demo_model
from _servers import start_omlx

MB = 2**20
OPENING = ("You are a careful assistant who answers in full sentences, names every assumption, and "
           "checks each step twice before giving the answer. ")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--tokens", type=int, default=48, help="max_tokens of each stream")
    return p.parse_args(argv)


async def one_round(url: str, model: str, streams: int, tokens: int, round_no: int) -> int:
    async def one(client: httpx.AsyncClient, i: int) -> bool:
        body = {"model": model, "max_tokens": tokens, "stream": True,
                "messages": [{"role": "system", "content": OPENING},
                             {"role": "user", "content": f"Question {round_no}-{i}: {i} times {round_no + 7}?"}]}
        async with client.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
            async for _ in r.aiter_lines():
                pass
            return r.status_code == 200

    limits = httpx.Limits(max_connections=streams)
    async with httpx.AsyncClient(limits=limits) as client:
        done = await asyncio.gather(*(one(client, i) for i in range(streams)))
    return sum(done)


def idle_snapshot(url: str) -> dict:
    while True:
        snap = httpx.get(url + "/api/pool", timeout=30).json()
        if all(m["active_requests"] == 0 for m in snap["models"]):
            time.sleep(2)     # the last streams' teardown and the heap's trim (omlx_site/heap.py), then a read
            return httpx.get(url + "/api/pool", timeout=30).json()
        time.sleep(0.2)


def reading(proc: psutil.Process, url: str) -> dict:
    memory = idle_snapshot(url)["memory"]
    return {"rss": proc.memory_info().rss, "active": memory["active_bytes"], "cache": memory["cache_bytes"],
            "prompt": memory["prompt_cache_bytes"]}


def row(label: str, now: dict, base: dict) -> str:
    return (f"{label:>7} {now['rss'] / MB:>7.0f} {(now['rss'] - base['rss']) / MB:>+8.1f} {now['active'] / MB:>7.0f} "
            f"{(now['active'] - base['active']) / MB:>+8.1f} {now['cache'] / MB:>6.0f} {now['prompt'] / MB:>7.1f}")


def main(argv=None) -> None:
    args = parse_args(argv)
    server = start_omlx(demo_model(), OMLX_MAX_CONCURRENT=str(args.streams))
    try:
        proc = psutil.Process(server.proc.pid)
        httpx.post(server.url + f"/api/models/{server.model}/load", json={}, timeout=300).raise_for_status()
        base = reading(proc, server.url)
        print(f"{args.streams} streams a round, max_tokens {args.tokens}; MB, changes from the loaded baseline")
        print(f"{'round':>7} {'RSS':>7} {'RSS +':>8} {'active':>7} {'active +':>8} {'cache':>6} {'prompt':>7}")
        print(row("loaded", base, base))
        for n in range(args.rounds + 1):
            ok = asyncio.run(one_round(server.url, server.model, args.streams, args.tokens, n))
            print(row(str(n) if ok == args.streams else f"{n} ({args.streams - ok} failed)",
                      reading(proc, server.url), base), flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
