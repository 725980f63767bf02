"""Fleet placement, simulated: the real pool.fleet.placement.place against four other systems' routers,
on one seeded trace per fleet size, at 10, 100 and 1,000 hosts. A discrete-event simulation; no MLX.

    .venv/bin/python benchmarks/fleet_sim.py [--sizes 10,100,1000] [--requests N[,N,N]] [--seed 1] [--quick]

The workload (each figure a constant below or an option; GB = 2**30 bytes throughout):
- Hosts, by share of the fleet (largest remainder, shuffled): 48 GB Mac 30%, 96 GB Mac 25%, 192 GB Mac
  20%, 512 GB Mac 10%, 80 GB GPU box 10%, 141 GB GPU box 5%. Model budget: the pool's own
  auto_model_budget of that memory (36, 79, 166, 454, 65, 120 GB).
- 2,000 models; sizes drawn from the classes 1.5/4/8/20/40/70 GB (shares 15/30/25/15/10/5%, mean
  14 GB), each scaled by a uniform 0.85-1.15; popularity Zipf (s = 1.0) over a random order, so size
  and popularity are independent (the top model draws 12% of requests, the top 100 63%). Each model's
  folder is on a random 30-60% (at least 2) of the hosts whose budget holds it with its 25% KV
  headroom; only those hosts can take it.
- Chats: Poisson arrivals; 1 + geometric turns (mean 4, at most 16). Turn k+1 comes after turn k
  *arrived* by the time to read its reply at 20 tokens/s plus a log-normal think time (median 30 s),
  whatever happened to turn k, so every router gets the very same requests at the same instants. A
  turn's messages are the chat's earlier ones plus a new user message (prompt tokens: system 200-1,000,
  user median 120, replies median 250); `prefix_keys` (pool/fleet/prefix.py) of them is what ours sees.
- Rate: 0.1 requests a second per host (--rate): about four chats in progress per host, a small team
  on one Mac. 20k / 50k / 100k requests at 10 / 100 / 1,000 hosts: about 5.5 h, 1.5 h and 17 min of
  traffic. The fleet starts empty; the first 20% of requests warm it up and are not counted.
- A host loads one model at a time at 2.0 GB/s (--load-gbps), the top of what this project measured
  on an H200 (../shared/reference/fleet.md 'Swap cost', mlx-on-gpu.md: mlx_lm.load of 2 GB in 1.3-2.0 s,
  1.8 GB in 1.4 s, 2.5 GB bf16 in 1.28 s), so cold loads cost at least this much. A loading model
  counts against the budget and its requests queue behind it. A load that does not fit evicts idle
  models by plan_load (LRU, all or nothing, 25% KV headroom), the same host code under every router;
  when busy models block it, the request waits there until they go idle (counted in its wait). A
  model runs 16 requests at once (OMLX_MAX_CONCURRENT); more queue, at most 64 (OMLX_QUEUE_PER_MODEL):
  the next is refused, as is a request place() finds no room for. No idle TTL (OMLX_IDLE_TTL off).
- Decode: each stream at min(200, B / size) tokens/s, B = 0.6 x memory bandwidth on a Mac (273, 400,
  800, 819 GB/s), 0.12 x on a GPU box (3.35, 4.8 TB/s; MLX's CUDA backend reached 12-15% single-stream
  here, mlx-on-gpu.md); prefill 10x that rate (the H200's 2,267 against 262 tok/s). Models on one host
  do not slow each other: optimistic for a host that runs many at once, under every router alike.
- Prompt cache: per host and model, an LRU of the last 10 chats' prefixes (OMLX_PROMPT_CACHE_ENTRIES),
  lost when the model is evicted; a turn that finds its chat's prefix there prefills only the rest.
  Ours sees what each host publishes: per model, requests running + queued, those queued for a slot
  (place() spills a second copy when every holder queues), and the keys of its real PrefixLedger (256
  per model, of the last 5 minutes), which can name a prefix the cache has dropped, as in the real fleet.

Wait: from arrival to the start of its prefill (load wait + queueing + waiting for room); the
percentiles are over the requests served. Cold loads and evictions count those that counted requests
caused. Every router sees the fleet as it is at that instant (no publishing delay).
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import time
from bisect import bisect
from collections import Counter, OrderedDict, defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate

from _fleet_sim_policies import POLICIES, Host, Ours, Slot

from pool.fleet.prefix import prefix_keys
from pool.policy.load_plan import ModelView, auto_model_budget, plan_load
from pool.policy.vocabulary import ModelState

GiB = 2**30
HOST_KINDS = [  # name, memory GiB, bandwidth GB/s, decode efficiency, share of the fleet
    ("mac-48", 48, 273, 0.6, 0.30), ("mac-96", 96, 400, 0.6, 0.25), ("mac-192", 192, 800, 0.6, 0.20),
    ("mac-512", 512, 819, 0.6, 0.10), ("gpu-80", 80, 3350, 0.12, 0.10), ("gpu-141", 141, 4800, 0.12, 0.05)]
SIZE_CLASSES = [(1.5, 0.15), (4, 0.30), (8, 0.25), (20, 0.15), (40, 0.10), (70, 0.05)]
MODELS, ZIPF_S, FOLDER_SHARE = 2000, 1.0, (0.3, 0.6)
HEADROOM = 1.25
MAX_CONCURRENT, QUEUE_PER_MODEL, CACHE_ENTRIES = 16, 64, 10
TOKENS_CAP, PREFILL_X, READ_TOKENS_S = 200, 10, 20
WARMUP = 0.2
SIZES, DEFAULT_REQUESTS = "10,100,1000", {10: 20_000, 100: 50_000, 1000: 100_000}


@dataclass(frozen=True, slots=True)
class Request:
    idx: int
    t: float
    model: str
    turn: int
    keys: tuple[str, ...]       # prefix_keys of the prompt's messages, shortest first
    tokens: tuple[int, ...]     # tokens of the prompt up to each of those prefixes
    reply_key: str              # the key of the prompt plus this turn's reply: what the prompt cache keeps
    out_tokens: int


@dataclass(frozen=True)
class World:
    hosts: tuple[tuple[str, str, int, float], ...]    # id, kind, budget bytes, decode bytes/s
    folders: dict[str, tuple[str, ...]]               # host id -> model ids
    size: dict[str, int]                              # model id -> bytes
    trace: tuple[Request, ...]


@lru_cache(maxsize=4)
def build_world(n_hosts: int, n_requests: int, seed: int, rate: float) -> World:
    models = random.Random(f"{seed}:models")           # the same catalog and popularity at every fleet size
    size = {f"m{i:04d}": int(models.choices([c for c, _ in SIZE_CLASSES], [w for _, w in SIZE_CLASSES])[0]
                             * models.uniform(0.85, 1.15) * GiB) for i in range(MODELS)}
    by_rank = list(size)
    models.shuffle(by_rank)
    rng = random.Random(f"{seed}:{n_hosts}")
    shares = [k[4] * n_hosts for k in HOST_KINDS]
    counts = [int(s) for s in shares]
    for i in sorted(range(len(shares)), key=lambda i: counts[i] - shares[i])[:n_hosts - sum(counts)]:
        counts[i] += 1
    kinds = [k for k, c in zip(HOST_KINDS, counts) for _ in range(c)]
    rng.shuffle(kinds)
    width = len(str(n_hosts - 1))
    hosts = tuple((f"h{i:0{width}d}", name, auto_model_budget(mem * GiB), eff * bw * GiB)
                  for i, (name, mem, bw, eff, _) in enumerate(kinds))
    folders: dict[str, list[str]] = {h[0]: [] for h in hosts}
    for model, nbytes in size.items():
        able = [h[0] for h in hosts if nbytes * HEADROOM <= h[2]]
        share = rng.uniform(*FOLDER_SHARE)
        for host in rng.sample(able, min(len(able), max(2, round(share * len(able))))):
            folders[host].append(model)
    cum = list(accumulate(1 / (r + 1) ** ZIPF_S for r in range(MODELS)))
    return World(hosts, {h: tuple(f) for h, f in folders.items()}, size,
                 _trace(rng, n_requests, rate * n_hosts, by_rank, cum))


def _trace(rng: random.Random, n: int, rate: float, by_rank: list[str], cum: list[float]) -> tuple[Request, ...]:
    def lognormal(median: float, sigma: float, low: int, high: int) -> int:
        return int(min(high, max(low, rng.lognormvariate(math.log(median), sigma))))

    turns_of: list[tuple] = []
    start, chat = 0.0, 0
    while len(turns_of) < 1.3 * n:
        start += rng.expovariate(rate / 4)                  # chats of 4 turns on average
        model = by_rank[bisect(cum, rng.random() * cum[-1])]
        turns = min(16, 1 + int(math.log(1 - rng.random()) / math.log(0.75)))
        messages = [{"role": "system", "content": f"chat {chat}: you are a helpful assistant"}]
        sizes, replies, when, t = [lognormal(400, 0.5, 200, 1000)], [], [], start
        for turn in range(1, turns + 1):
            messages.append({"role": "user", "content": f"chat {chat} question {turn}"})
            sizes.append(lognormal(120, 0.9, 8, 4000))
            when.append((t, turn, len(messages)))
            replies.append(lognormal(250, 0.7, 16, 2048))
            messages.append({"role": "assistant", "content": f"chat {chat} answer {turn}"})
            sizes.append(replies[-1])
            t += replies[-1] / READ_TOKENS_S + lognormal(30, 0.8, 3, 900)   # read the reply, think, type
        # One call for the whole chat: a turn's keys are the first len(prompt) of them (keys are cumulative).
        keys, tokens = tuple(prefix_keys(messages)), tuple(accumulate(sizes))
        turns_of += [(t, model, turn, depth, keys, tokens, replies[turn - 1]) for t, turn, depth in when]
        chat += 1
    turns_of.sort(key=lambda x: x[0])
    return tuple(Request(i, t, m, k, keys[:depth], tokens[:depth], keys[depth], out)
                 for i, (t, m, k, depth, keys, tokens, out) in enumerate(turns_of[:n]))


class Sim:
    def __init__(self, world: World, policy: str, seed: int, load_rate: float, verify: int, whole: bool):
        self.now, self.load_rate, self.events, self.seq = 0.0, load_rate * GiB, [], 0
        self.size = world.size
        self.host = {h[0]: Host(*h, world.folders[h[0]], lambda: self.now) for h in world.hosts}
        self.hosts_with: dict[str, list[Host]] = defaultdict(list)
        for host in self.host.values():
            for model in host.folders:
                self.hosts_with[model].append(host)
        self.where: dict[str, set[Host]] = defaultdict(set)             # model -> hosts where it is resident
        self.inflight: dict[str, Counter] = defaultdict(Counter)        # model -> host -> requests in flight
        self.policy = POLICIES[policy](self, random.Random(f"{seed}:{policy}"), verify=verify, whole_catalog=whole)
        self.warm = int(WARMUP * len(world.trace))
        self.waits: list[float] = []
        self.loads = self.evictions = self.refused = self.hits = self.later_turns = 0
        self.loaded_bytes = 0

    def run(self, trace: tuple[Request, ...]) -> None:
        for request in trace:
            while self.events and self.events[0][0] <= request.t:
                self._next_event()
            self.now = request.t
            host = self.policy.choose(request)
            if host is None:
                self._refuse(request)
            else:
                self._dispatch(host, request)
        while self.events:
            self._next_event()

    def _next_event(self) -> None:
        self.now, _, done, host, model, request = heapq.heappop(self.events)
        slot = host.slots[model]
        if done:
            slot.running -= 1
            host.inflight -= 1
            self._left(host, model)
            cache = host.cache.setdefault(model, OrderedDict())
            cache[request.reply_key] = None
            while len(cache) > CACHE_ENTRIES:
                cache.popitem(last=False)
        else:
            slot.state = ModelState.LOADED
        host.changed()
        self._start(host, model, slot)
        if slot.running == 0 and not slot.queue and host.pending:
            self._retry(host)

    def _at(self, t: float, done: bool, host: Host, model: str, request: Request | None) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, done, host, model, request))

    def _counted(self, request: Request) -> bool:
        return request.idx >= self.warm

    def _refuse(self, request: Request) -> None:
        self.refused += self._counted(request)

    def _left(self, host: Host, model: str) -> None:
        counts = self.inflight[model]
        counts[host] -= 1
        if not counts[host]:
            del counts[host]

    def _dispatch(self, host: Host, request: Request) -> None:
        model, slot = request.model, host.slots.get(request.model)
        queued = len(slot.queue) if slot else sum(r.model == model for r in host.pending)
        if queued >= QUEUE_PER_MODEL:
            return self._refuse(request)
        host.ledger.served(model, list(request.keys))       # as routing.py does when it picks a host
        host.inflight += 1
        self.inflight[model][host] += 1
        host.changed()
        if slot is not None:
            slot.last_access = self.now
            slot.queue.append(request)
            self._start(host, model, slot)
        elif not self._load(host, request):
            host.pending.append(request)

    def _load(self, host: Host, request: Request) -> bool:
        model, nbytes = request.model, self.size[request.model]
        views = [*host.model_views(), ModelView(model, ModelState.UNLOADED, nbytes)]
        plan = plan_load(views, model, budget=host.budget)
        if not plan.fits:
            return False
        for victim in plan.victim_ids:
            gone = host.slots.pop(victim)
            host.used -= gone.size
            host.cache.pop(victim, None)
            host.ledger.forget(victim)
            self.where[victim].discard(host)
            self.evictions += self._counted(request)
        slot = host.slots[model] = Slot(nbytes, self.now)
        slot.queue.append(request)
        host.used += nbytes
        host.changed()
        self.where[model].add(host)
        host.loader_free = max(self.now, host.loader_free) + nbytes / self.load_rate
        self._at(host.loader_free, False, host, model, None)
        if self._counted(request):
            self.loads += 1
            self.loaded_bytes += nbytes
        return True

    def _retry(self, host: Host) -> None:
        waiting, host.pending = host.pending, []
        for request in waiting:
            slot = host.slots.get(request.model)
            if slot is not None:
                slot.last_access = self.now
                slot.queue.append(request)
                self._start(host, request.model, slot)
            elif not self._load(host, request):
                host.pending.append(request)
        host.changed()

    def _start(self, host: Host, model: str, slot: Slot) -> None:
        if slot.state != ModelState.LOADED:
            return
        while slot.queue and slot.running < MAX_CONCURRENT:
            request = slot.queue.popleft()
            slot.running += 1
            host.changed()
            reused = 0
            if request.turn > 1:
                self.later_turns += self._counted(request)
                cache = host.cache.get(model, {})
                depth = next((d for d in range(len(request.keys) - 1, -1, -1) if request.keys[d] in cache), None)
                if depth is not None:
                    reused = request.tokens[depth]
                    self.hits += self._counted(request)
            rate = min(TOKENS_CAP, host.decode / slot.size)
            if self._counted(request):
                self.waits.append(self.now - request.t)
            seconds = (request.tokens[-1] - reused) / (PREFILL_X * rate) + request.out_tokens / rate
            self._at(self.now + seconds, True, host, model, request)

    def summary(self) -> dict:
        waits, served = sorted(self.waits), len(self.waits) + self.refused
        pct = lambda q: waits[max(0, math.ceil(q * len(waits)) - 1)] if waits else 0.0
        return {"requests": served, "loads_per_k": 1000 * self.loads / max(1, served),
                "gb": self.loaded_bytes / GiB, "p50": pct(0.5), "p99": pct(0.99), "evictions": self.evictions,
                "hits": self.hits / max(1, self.later_turns), "refused": self.refused,
                "checked": getattr(self.policy, "checked", 0), "why": getattr(self.policy, "why", None)}


def simulate(job: tuple) -> tuple:
    n_hosts, n_requests, policy, args = job
    world = build_world(n_hosts, n_requests, args.seed, args.rate)
    started = time.process_time()
    sim = Sim(world, policy, args.seed, args.load_gbps, args.verify, args.quick)
    sim.run(world.trace)
    return n_hosts, policy, sim.summary() | {"cpu": time.process_time() - started}


def describe(n_hosts: int, n_requests: int, args) -> str:
    world = build_world(n_hosts, n_requests, args.seed, args.rate)
    kinds = Counter(h[1] for h in world.hosts)
    fleet = ", ".join(f"{kinds[k[0]]} x {k[0]}" for k in HOST_KINDS if kinds[k[0]])
    budget = sum(h[2] for h in world.hosts) / GiB
    span = world.trace[-1].t / 60
    return (f"{n_hosts} hosts ({fleet}; {budget:,.0f} GB of model budget), {MODELS:,} models, "
            f"{len(world.trace):,} requests over {span:.0f} min ({args.rate * n_hosts:g} req/s), seed {args.seed}")


def table(rows: dict) -> list[str]:
    lines = ["| policy | cold loads / 1k req | GB loaded | p50 wait s | p99 wait s | evictions | "
             "prefix hits, turns >= 2 | refusals |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, s in rows.items():
        lines.append(f"| {name} | {s['loads_per_k']:.1f} | {s['gb']:,.0f} | {s['p50']:.2f} | {s['p99']:.2f} | "
                     f"{s['evictions']:,} | {s['hits']:.1%} | {s['refused']:,} |")
    lines.append(verdict(rows))
    return lines


def verdict(rows: dict) -> str:
    ours = rows[Ours.name]
    others = {k: v for k, v in rows.items() if k != Ours.name}
    parts, losses = [], []
    metrics = (("loads_per_k", "cold loads", "fewer", " per 1k"), ("p99", "p99 wait", "lower", " s"))
    for key, what, word, unit in metrics:
        best = min(others, key=lambda k: others[k][key])
        mine, theirs, refused = ours[key], others[best][key], others[best]["refused"]
        figures = f"{mine:.2f} against {theirs:.2f}{unit}" + (f"; it refuses {refused:,}" if refused else "")
        if abs(mine - theirs) <= 0.005 * max(mine, theirs):
            parts.append(f"the same {what} as {best} ({figures})")
            continue
        if mine > theirs:
            losses.append(what)
            word, ratio = "MORE" if word == "fewer" else "HIGHER", f"{mine / theirs:.2f}x" if theirs else "inf"
        else:
            ratio = f"{theirs / mine:.2f}x" if mine else "inf"
        parts.append(f"{ratio} {word} {what} than {best} ({figures})")
    best = min(others, key=lambda k: others[k]["refused"])
    if ours["refused"] > others[best]["refused"]:
        losses.append(f"refusals ({ours['refused']:,} against {others[best]['refused']:,} for {best})")
    return "ours vs best other: " + "; ".join(parts) + (". Ours is NOT best on " + ", ".join(losses) if losses else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=SIZES, help="fleet sizes, comma-separated")
    parser.add_argument("--requests", default="", help="requests per size: one number, or one per size")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=float, default=0.1, help="requests per second per host")
    parser.add_argument("--load-gbps", type=float, default=2.0, help="load speed, GB/s")
    parser.add_argument("--verify", type=int, default=50,
                        help="check every Nth of our decisions against place() over every host with the folder")
    parser.add_argument("--jobs", type=int, default=2, help="processes")
    parser.add_argument("--quick", action="store_true", help="a small run (10 and 100 hosts, 2,000 requests)")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.verify = args.requests or "2000", 20
        args.sizes = "10,100" if args.sizes == SIZES else args.sizes
    sizes = [int(s) for s in args.sizes.split(",")]
    given = [int(n) for n in args.requests.split(",") if n]
    counts = {s: (given[i] if len(given) > 1 else given[0]) if given else DEFAULT_REQUESTS.get(s, 100 * s)
              for i, s in enumerate(sizes)}
    jobs = [(s, counts[s], p, args) for s in sorted(sizes, reverse=True) for p in POLICIES]
    started, results = time.perf_counter(), defaultdict(dict)
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for n_hosts, policy, summary in pool.map(simulate, jobs):
            results[n_hosts][policy] = summary
    print(f"fleet_sim: {len(POLICIES)} routers on one trace per size; load {args.load_gbps:g} GB/s; "
          f"first {WARMUP:.0%} of requests uncounted")
    for s in sizes:
        print()
        print(describe(s, counts[s], args))
        print("\n".join(table({p: results[s][p] for p in POLICIES})))
        ours = results[s][Ours.name]
        whys = ", ".join(f"{why} {n:,}" for why, n in ours["why"].most_common() if n)
        print(f"ours' placements (placement.Why): {whys}")
        checked = ours["checked"]
        if checked:
            print(f"({checked} of our decisions re-checked against place() over every host with the folder"
                  f"{', every folder listed' if args.quick else ''}: all the same)")
    cpu = sum(r["cpu"] for by_router in results.values() for r in by_router.values())
    print(f"\n{time.perf_counter() - started:.0f} s wall, {cpu:.0f} s of CPU simulating ({args.jobs} processes)")


if __name__ == "__main__":
    main()
