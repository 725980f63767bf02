"""What request traces cost: 16 streams at once against two omlx-site servers on the same model
folder, one with traces on (the default) and one with OMLX_TRACES=off, taking turns wave by wave
(on, off, on, off, ...) after one untimed wave each, so both see the same machine load over time.

Every client sends a prompt of the same length (a unique number first, so no prefix cache serves
it) asking for a long answer, greedy, max_tokens fixed. A wave's throughput is its completion
tokens / its wall time; the table gives each side's median over the rounds and the ratio on/off
(1.0 = free; the issue asks for under 2% lost, a ratio over 0.98).

On a shared machine the waves' spread can be wider than 2%, so the script also measures what a
trace adds on the event loop, in this process and without HTTP: the same fake chunks read through
the trace's hooks (`traced`, the registry's begin and end with its metrics and a queue put) and
without, alternating, and prints that cost per request and per chunk and as a share of the event
loop at the throughput the servers reached.

    .venv/bin/python benchmarks/tracing.py [--model PATH] [--streams 16] [--tokens 64] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

import httpx
from _models import demo_model
from _servers import numbered_prompt, percentile, start_omlx

from omlx_site.process import setup_process

setup_process()

ASK = "Write a long, detailed story about a lighthouse keeper and every ship he watched, chapter by chapter."


async def wave(server, first_id: int, streams: int, tokens: int) -> dict:
    limits = httpx.Limits(max_connections=streams + 4, max_keepalive_connections=streams + 4)
    async with httpx.AsyncClient(limits=limits, timeout=900) as client:
        started = time.perf_counter()
        replies = await asyncio.gather(*(server.astream_chat(client, numbered_prompt(first_id + i, ASK), tokens)
                                         for i in range(streams)))
        wall = time.perf_counter() - started
    good = [r for r in replies if "error" not in r]
    return {"tok_s": sum(r["usage"]["completion_tokens"] for r in good) / wall, "failed": len(replies) - len(good),
            "ttfts": [r["ttft"] for r in good]}


def loop_cost(requests: int = 2000, chunks: int = 64) -> tuple[float, float]:
    """Seconds a trace adds on the event loop: (per request, per chunk), best of 3 alternations."""
    import queue
    from types import SimpleNamespace

    from pool.engines.protocol import Chunk
    from pool.observe.metrics import Metrics
    from pool.traces.flow import traced
    from pool.traces.registry import Traces

    async def source():
        for _ in range(chunks - 1):
            yield Chunk("x")
        yield Chunk("", "length", 10, chunks)

    traces = Traces(SimpleNamespace(traces=True, trace_rows=0, trace_days=0), metrics=Metrics(snapshot=dict))
    handed: queue.Queue = queue.Queue()
    traces.writer.submit = handed.put_nowait         # the writer thread's side is not the loop's

    async def plain() -> float:
        started = time.perf_counter()
        for _ in range(requests):
            async for _chunk in source():
                pass
        return time.perf_counter() - started

    async def with_traces() -> float:
        started = time.perf_counter()
        for _ in range(requests):
            trace = traces.begin(route="/v1/chat/completions", dialect="openai", key=None)
            trace.model = "m"
            trace.prefilling(10)
            async for _chunk in traced(trace, source()):
                pass
            traces.end(trace, status=200)
        return time.perf_counter() - started

    best_plain, best_traced = float("inf"), float("inf")
    for _ in range(3):
        best_plain = min(best_plain, asyncio.run(plain()))
        best_traced = min(best_traced, asyncio.run(with_traces()))
    extra = max(0.0, best_traced - best_plain)
    per_chunk = extra / (requests * chunks)
    return extra / requests, per_chunk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=str, default=None)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    model = Path(args.model) if args.model else demo_model()
    common = {"OMLX_MAX_CONCURRENT": str(args.streams), "OMLX_PROMPT_CACHE_BYTES": "off"}
    servers = {"on": start_omlx(model, OMLX_TRACES="on", **common),
               "off": start_omlx(model, OMLX_TRACES="off", **common)}
    results: dict[str, list[dict]] = {"on": [], "off": []}
    try:
        ids = iter(range(0, 10**6, args.streams))
        for server in servers.values():     # untimed: load the model, compile the batch's shapes
            asyncio.run(wave(server, next(ids), args.streams, args.tokens))
        for r in range(args.rounds):
            for side in (("on", "off") if r % 2 == 0 else ("off", "on")):
                result = asyncio.run(wave(servers[side], next(ids), args.streams, args.tokens))
                results[side].append(result)
                print(f"round {r + 1} {side:>3}: {result['tok_s']:7.1f} tok/s, failed {result['failed']}", flush=True)
        traced = httpx.get(servers["on"].url + "/api/requests/summary", timeout=30).json()["writer"]
    finally:
        for server in servers.values():
            server.stop()
    on, off = (statistics.median(w["tok_s"] for w in results[s]) for s in ("on", "off"))
    ttft = {s: percentile([t for w in results[s] for t in w["ttfts"]], 50) for s in ("on", "off")}
    print(f"\n{args.streams} streams x {args.tokens} tokens, {args.rounds} rounds, model {model.name}")
    print("| side | tok/s (median) | TTFT p50 s | failed |")
    print("|---|---|---|---|")
    for side, value in (("traces on", on), ("traces off", off)):
        key = side.split()[1]
        print(f"| {side} | {value:.1f} | {ttft[key]:.3f} | {sum(w['failed'] for w in results[key])} |")
    print(f"\nratio on/off: {on / off:.3f}  (cost {100 * (1 - on / off):+.1f}%; under 2% is a ratio over 0.980)")
    print(f"traces written by the 'on' server: {traced}")
    per_request, per_chunk = loop_cost(chunks=args.tokens)
    requests_per_s = off / args.tokens
    share = per_request * requests_per_s
    print(f"on the event loop: {per_request * 1e6:.0f} us a request of {args.tokens} chunks "
          f"({per_chunk * 1e6:.2f} us a chunk); at {off:.1f} tok/s that is {100 * share:.3f}% of the loop's time")


if __name__ == "__main__":
    main()
