"""A fleet of three real hosts on this machine, routing on, against the same three hosts chosen at random.

Both arms run three `manage.py serve` processes, each with its own data folder, every model folder,
and OMLX_MAX_LOADED_MODELS=2 (six slots in all). The same seeded trace goes through both:

- routing: one fleet (a PostgreSQL and a Redis started here, on free ports, stopped at the end);
  every request is sent to host-1, and the fleet decides where it is served (docs/fleet.md);
- random: three hosts that know nothing of each other (no OMLX_REDIS_URL), each request sent to one
  of them at random, as a client that knows several servers does (Open WebUI, for one).

The trace: chats of 2-5 turns, each on one model drawn with Zipf popularity over the six, every turn
sending the whole history (scripted assistant replies, so both arms send identical requests), run by
a few concurrent clients that take the next chat when they finish one. Before the timed trace each
arm starts fresh and gets the same warm-up: one short request per model (on the routing arm through
host-1; on the random arm to host i % 3, which is where the fleet puts six models too), so both
begin with every model loaded once, two per host, and the weights in the page cache.

Measured per arm: cold loads (the sum over hosts of /metrics `model_loads_total` over the trace)
and the seconds they took (`model_load_seconds_total`), the share of prompt tokens served from the
prefix cache (usage's `cached_tokens`), time to first content token p50/p95 of the streamed chats,
and the trace's wall time; one table with the ratios routing / random.

    .venv/bin/python benchmarks/fleet.py [--requests 100] [--clients 3] [--seed 0] [--size-mb 250] [--quick]

The random-weight fixture models are built once in the benchmark cache. OMLX_BENCH_LOG=FILE keeps
the hosts' output.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import statistics
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass

import httpx
from _fleet_hosts import Stack, counters, loaded_models, read_files
from _models import fixture
from _servers import StreamReply, percentile

WORDS = ("the river town market morning light old bridge garden letter winter road music small house "
         "window story coffee friend train station north summer city paper clock blue quiet evening "
         "mountain school bread field dinner green harbour lamp journey").split()
HOSTS = 3
MAX_LOADED = 2


@dataclass(frozen=True)
class Turn:
    chat: int
    turn: int
    model: str
    messages: tuple[dict, ...]     # the whole history and this turn's question


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def make_trace(models: list[str], requests: int, seed: int, zipf: float) -> list[list[Turn]]:
    """Chats until `requests` turns: each on one model (Zipf: the k-th most popular has weight 1/k^s),
    2-5 turns, the questions and the replies drawn from a small vocabulary."""
    rng = random.Random(seed)
    weights = [1 / (k + 1) ** zipf for k in range(len(models))]
    chats: list[list[Turn]] = []
    total = 0
    while total < requests:
        c, model = len(chats), rng.choices(models, weights)[0]
        history: list[dict] = []
        chat = []
        for t in range(min(rng.randint(2, 5), requests - total)):
            ask = {"role": "user", "content": f"Chat {c:04d}, question {t + 1}: {sentence(rng, 30)}?"}
            chat.append(Turn(c, t, model, (*history, ask)))
            history += [ask, {"role": "assistant", "content": sentence(rng, 40) + "."}]
        chats.append(chat)
        total += len(chat)
    return chats


async def send(client: httpx.AsyncClient, url: str, model: str, messages, max_tokens: int) -> dict:
    """One streamed chat: time to first content token, usage, and the fleet's headers; a failure comes
    back as {"error": ...}."""
    body = {"model": model, "messages": list(messages), "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    reply = StreamReply()
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            r.raise_for_status()
            headers = {"host": r.headers.get("x-omlx-host"), "placement": r.headers.get("x-omlx-placement")}
            async for line in r.aiter_lines():
                reply.read(line)
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        return {"error": f"{type(e).__name__}: {e}"}
    if not reply.times or not reply.usage:
        return {"error": "the stream ended without content or usage"}
    return {**reply.done(), **headers}


async def run_trace(chats: list[list[Turn]], pick_url, clients: int, max_tokens: int) -> tuple[list[dict], float]:
    """`clients` concurrent clients, each taking the next chat and sending its turns one after another."""
    waiting, results = deque(chats), []

    async def client_loop(client: httpx.AsyncClient) -> None:
        while waiting:
            for turn in waiting.popleft():
                url = pick_url(turn)
                result = await send(client, url, turn.model, turn.messages, max_tokens)
                results.append({**result, "url": url})

    async with httpx.AsyncClient(timeout=900, limits=httpx.Limits(max_connections=clients + 4)) as client:
        started = time.perf_counter()
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
        return results, time.perf_counter() - started


async def warm_up(models: list[str], urls: list[str]) -> None:
    """One short request per model, one after another, model i to urls[i % len(urls)]."""
    async with httpx.AsyncClient(timeout=900) as client:
        for i, model in enumerate(models):
            ask = ({"role": "user", "content": f"Warm-up {i}: {sentence(random.Random(i), 10)}."},)
            result = await send(client, urls[i % len(urls)], model, ask, 1)
            if "error" in result:
                raise SystemExit(f"the warm-up request for {model} failed: {result['error']}")


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run_arm(stack: Stack, routing: bool, folders, chats, args) -> dict:
    name, names, started = "routing" if routing else "random", [f.name for f in folders], time.perf_counter()
    read_files(folders)
    hosts = stack.start_hosts(folders, fleet=routing, count=HOSTS, max_loaded=MAX_LOADED)
    progress(f"{name}: {HOSTS} hosts up in {time.perf_counter() - started:.1f} s; warming up")
    urls = [h.url for h in hosts]
    by_url = {h.url: h.name for h in hosts}
    asyncio.run(warm_up(names, urls[:1] if routing else urls))
    time.sleep(1.5)           # the fleet's records of the warm-up's loads reach every host
    progress(f"{name}: the trace ({sum(map(len, chats))} requests)")
    placed = {h.name: loaded_models(h) for h in hosts}
    before = [counters(h) for h in hosts]

    if routing:
        def pick_url(turn: Turn) -> str:
            return urls[0]
    else:
        def pick_url(turn: Turn) -> str:
            return urls[random.Random(f"{args.seed}:{turn.chat}:{turn.turn}").randrange(len(urls))]

    results, wall = asyncio.run(run_trace(chats, pick_url, args.clients, args.max_tokens))
    progress(f"{name}: the trace took {wall:.1f} s")
    after = [counters(h) for h in hosts]
    stack.stop_hosts()
    done = [r for r in results if "error" not in r]
    ttfts = [r["ttft"] for r in done]
    served = [r.get("host") or by_url[r["url"]] for r in done]     # x-omlx-host, else the host it was sent to
    prompt = sum(r["usage"].get("prompt_tokens", 0) for r in done)
    cached = sum((r["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0) for r in done)
    return {
        "warm": placed,
        "requests": len(results), "failed": len(results) - len(done),
        "errors": Counter(r["error"][:160] for r in results if "error" in r),
        "loads": sum(a["loads"] - b["loads"] for a, b in zip(after, before)),
        "load_seconds": sum(a["load_seconds"] - b["load_seconds"] for a, b in zip(after, before)),
        "warm_load_seconds": sum(b["load_seconds"] for b in before) / max(1, sum(b["loads"] for b in before)),
        "cached_share": cached / prompt if prompt else float("nan"),
        "p50": percentile(ttfts, 50), "p95": percentile(ttfts, 95),
        "mean": statistics.fmean(ttfts) if ttfts else float("nan"),
        "wall": wall,
        "served_by": Counter(served),
        "host_ttfts": {h: [r["ttft"] for r, s in zip(done, served) if s == h] for h in by_url.values()},
        "placement": Counter(r.get("placement") or "entry host" for r in done),
    }


def ratio(a: float, b: float) -> str:
    if b == 0:
        return "-" if a == 0 else "inf"
    return f"{a / b:.2f}"


def table(fleet: dict, rand: dict) -> str:
    rows = [
        ("cold loads (sum over the 3 hosts)", "loads", "{:.0f}"),
        ("seconds spent loading", "load_seconds", "{:.1f}"),
        ("prompt tokens from the prefix cache", "cached_share", "{:.0%}"),
        ("TTFT p50 (s)", "p50", "{:.2f}"),
        ("TTFT p95 (s)", "p95", "{:.2f}"),
        ("TTFT mean (s)", "mean", "{:.2f}"),
        ("wall time of the trace (s)", "wall", "{:.1f}"),
        ("requests failed", "failed", "{:d}"),
    ]
    lines = ["| | routing (fleet, all sent to host-1) | random host, no routing | routing / random |",
             "|---|---|---|---|"]
    for label, key, fmt in rows:
        a, b = fleet[key], rand[key]
        lines.append(f"| {label} | {fmt.format(a)} | {fmt.format(b)} | {ratio(a, b)} |")
    return "\n".join(lines)


def describe(name: str, arm: dict) -> None:
    total = sum(arm["served_by"].values()) or 1
    share = ", ".join(f"{h} {n / total:.0%} (TTFT p50 {percentile(arm['host_ttfts'][h], 50):.2f} s)"
                      for h, n in sorted(arm["served_by"].items()))
    warm = "; ".join(f"{h}: {' '.join(ms) or '-'}" for h, ms in arm["warm"].items())
    print(f"{name}: after the warm-up {warm}")
    print(f"{name}: served by {share}; mean load {arm['warm_load_seconds']:.2f} s at the warm-up")
    if any(p != "entry host" for p in arm["placement"]):
        print(f"{name}: x-omlx-placement " + ", ".join(f"{p} {n}" for p, n in arm["placement"].most_common()))
    for error, n in arm["errors"].most_common(5):
        print(f"{name}: {n} x {error}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=100, help="requests (chat turns) in the timed trace")
    p.add_argument("--clients", type=int, default=3, help="concurrent clients")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--models", type=int, default=6, help="fixture models (the fleet holds 6 at once)")
    p.add_argument("--size-mb", type=float, default=250, help="each fixture model's float32 weights")
    p.add_argument("--max-tokens", type=int, default=16, help="tokens generated per request")
    p.add_argument("--zipf", type=float, default=1.0, help="popularity exponent: weight 1/k^s for the k-th model")
    p.add_argument("--quick", action="store_true", help="a smoke run of about a minute: 12 requests, 8 tokens")
    args = p.parse_args()
    if args.quick:
        args.requests, args.max_tokens = min(args.requests, 12), min(args.max_tokens, 8)
    size = f"{args.size_mb:g}mb"
    folders = [fixture(f"fleet-{i}-{size}", args.size_mb, seed=100 + i) for i in range(args.models)]
    chats = make_trace([f.name for f in folders], args.requests, args.seed, args.zipf)
    popularity = Counter(t.model for chat in chats for t in chat)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))      # stopped like Ctrl-C: the finally runs
    stack = Stack()
    try:
        stack.services()
        fleet = run_arm(stack, True, folders, chats, args)
        rand = run_arm(stack, False, folders, chats, args)
    except KeyboardInterrupt:
        raise SystemExit("interrupted") from None
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)     # a second Ctrl-C must not cut the clean-up short
        stack.close()                  # the hosts, PostgreSQL and Redis, whatever happened

    print(f"{HOSTS} hosts x OMLX_MAX_LOADED_MODELS={MAX_LOADED}, {args.models} random-weight models of "
          f"{args.size_mb:g} MB (float32); {args.requests} requests in {len(chats)} chats of 2-5 turns, "
          f"{args.clients} clients, {args.max_tokens} tokens each, Zipf s={args.zipf:g}, seed {args.seed}")
    print("requests per model: " + ", ".join(f"{m.split('-')[1]}: {popularity[m]}"
                                            for m in sorted(popularity, key=lambda m: -popularity[m])))
    describe("routing", fleet)
    describe("random", rand)
    print()
    print(table(fleet, rand))


if __name__ == "__main__":
    main()
