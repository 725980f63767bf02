"""Many streams at once: aggregate decode speed and time to first token at 1, 4, 8, 16 streaming
clients, omlx-site vs mlx_lm.server on the same model folder vs raw mlx-lm BatchGenerator in this
process (the floor: no HTTP, no detokenizing).

Every client sends a prompt of the same length (a unique number first, so no prefix cache serves
it) asking for a long answer, greedy, max_tokens fixed; neither server has ignore_eos, so the tables
show the completion tokens actually generated. The sides take turns wave by wave (omlx, mlx_lm,
raw at level 1, then at level 4, ...), repeated --rounds times, after one untimed wave per side and
level (MLX's CUDA backend compiles each new batch shape for seconds). The clients are asyncio +
httpx in this one process; their CPU share of the wave is printed (it must stay well below 100%).
omlx-site runs with OMLX_MAX_CONCURRENT = the top level, so every stream of a wave runs at once, as
in mlx_lm.server (which decodes up to 32 at once).

    .venv/bin/python benchmarks/concurrency.py [--model PATH] [--levels 1,4,8,16] [--tokens 64] [--rounds 2]
        [--like-for-like] [--variant NAME:OMLX_X=V,...] [--no-mlx-lm]

--variant adds an omlx-site with other settings (repeatable), in the waves' turns beside the others,
printed against the default one and raw (an A/B of one setting in one run); --no-mlx-lm leaves
mlx_lm.server out (its columns print nan).

--like-for-like (issue 22): every side on a float32 copy of the model folder, every process with
Debian's OpenBLAS in LD_PRELOAD (_like_for_like.py), so the table compares the serving and not the
CPU path; its defaults are --levels 1,4,8 --tokens 32.

Columns: tok/s = completion tokens of the wave / its wall time (TTFT included); decode = the sum of
each stream's (tokens - 1) / (last - first token time) (TTFT excluded); bound = decode / streams as
a share of the bandwidth bound (_bandwidth.py: device copy rate / weight bytes); TTFT p50/p95 over
every request of the level's timed waves, in seconds; failed = requests refused or dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from _bandwidth import Bound
from _like_for_like import float32_copy, preloaded, reexec_with_openblas
from _models import demo_model
from _servers import numbered_prompt, percentile, start_mlx_lm, start_omlx
from single_stream import variant

from omlx_site.process import setup_process

setup_process()   # the BLAS and malloc settings, before anything imports MLX

ASK = "Write a long, detailed story about a lighthouse keeper and every ship he watched, chapter by chapter."
SIDES = ("omlx", "mlx_lm", "raw")


@dataclass
class Wave:
    wall: float
    ttfts: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    decode_rates: list[float] = field(default_factory=list)
    failed: int = 0
    client_cpu: float = 0.0

    def add(self, ttft: float, tokens: int, first: float, last: float) -> None:
        self.ttfts.append(ttft)
        self.tokens.append(tokens)
        if tokens > 1 and last > first:
            self.decode_rates.append((tokens - 1) / (last - first))

    @property
    def aggregate(self) -> float:
        return sum(self.tokens) / self.wall

    @property
    def decode(self) -> float:
        return sum(self.decode_rates)


async def _server_wave(server, ids: list[int], tokens: int) -> Wave:
    limits = httpx.Limits(max_connections=len(ids) + 4, max_keepalive_connections=len(ids) + 4)
    async with httpx.AsyncClient(limits=limits, timeout=900) as client:
        cpu, started = time.process_time(), time.perf_counter()
        replies = await asyncio.gather(*(server.astream_chat(client, numbered_prompt(i, ASK), tokens) for i in ids))
        wave = Wave(time.perf_counter() - started)
        wave.client_cpu = (time.process_time() - cpu) / wave.wall
    for reply in replies:
        if "error" in reply:
            wave.failed += 1
        else:
            wave.add(reply["ttft"], reply["usage"]["completion_tokens"], reply["times"][0], reply["times"][-1])
    return wave


def server_wave(server, ids: list[int], tokens: int) -> Wave:
    return asyncio.run(_server_wave(server, ids, tokens))


def raw_wave(model, tokenizer, ids: list[int], tokens: int) -> Wave:
    """The same prompts through one mlx-lm BatchGenerator, inserted together, greedy, stopping at EOS."""
    from mlx_lm.generate import BatchGenerator

    prompts = [tokenizer.apply_chat_template(numbered_prompt(i, ASK), add_generation_prompt=True) for i in ids]
    generator = BatchGenerator(model, stop_tokens=[[t] for t in tokenizer.eos_token_ids])
    started = time.perf_counter()
    uids = generator.insert(prompts, max_tokens=[tokens] * len(prompts))
    first, last, count, live = {}, {}, dict.fromkeys(uids, 0), set(uids)
    while live:
        _, responses = generator.next()
        now = time.perf_counter()
        for r in responses:
            first.setdefault(r.uid, now)
            last[r.uid], count[r.uid] = now, count[r.uid] + 1
            if r.finish_reason is not None:
                live.discard(r.uid)
    wave = Wave(time.perf_counter() - started)
    generator.close()
    for uid in uids:
        wave.add(first[uid] - started, count[uid], first[uid], last[uid])
    return wave


def where_ttft_went(server, streams: int) -> str:
    """Medians over the server's last `streams` traces (the last wave at the top level): time from the
    view's start to the engine (admission + slot + the prompt's encoding), the engine's prefill (handed
    over to the first chunk), and the server's own TTFT, against the client's."""
    rows = server.recent_traces(streams)
    if not rows:
        return "none"

    def median(key: str) -> float:
        values = [r[key] for r in rows if r.get(key) is not None]
        return statistics.median(values) if values else float("nan")
    before = [r["ttft_ms"] - r["prefill_ms"] for r in rows if r.get("ttft_ms") is not None
              and r.get("prefill_ms") is not None]
    return (f"{len(rows)} traces, medians: TTFT {median('ttft_ms'):.0f} ms = before the engine "
            f"{statistics.median(before) if before else float('nan'):.0f} ms (admission "
            f"{median('admission_ms'):.0f}, slot {median('slot_ms'):.0f}) + prefill {median('prefill_ms'):.0f} ms; "
            f"decode {median('decode_tps'):.1f} tok/s a stream")


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def summary(waves: list[Wave]) -> dict:
    ttfts = [t for w in waves for t in w.ttfts]
    return {"agg": statistics.median(w.aggregate for w in waves), "decode": statistics.median(w.decode for w in waves),
            "p50": percentile(ttfts, 50), "p95": percentile(ttfts, 95), "failed": sum(w.failed for w in waves),
            "tokens": statistics.mean(t for w in waves for t in w.tokens) if ttfts else float("nan"),
            "cpu": statistics.median(w.client_cpu for w in waves)}


def load_average() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def summaries(waves: list[Wave]) -> dict:
    if not waves:          # a side left out
        nan = float("nan")
        return {"agg": nan, "decode": nan, "p50": nan, "p95": nan, "failed": 0, "tokens": nan, "cpu": 0.0}
    return summary(waves)


def report(model: Path, args, results: dict, bound: Bound, loads: tuple[str, str]) -> None:
    s = {side: {level: summaries(waves) for level, waves in by_level.items()} for side, by_level in results.items()}
    print(f"model {model.name}; {args.tokens} max tokens per request, greedy; {args.rounds} timed round(s) of "
          f"alternating waves; omlx-site with OMLX_MAX_CONCURRENT={max(args.levels)}; {bound.describe()}")
    print(f"load average (1/5/15 min) at the start {loads[0]}, at the end {loads[1]}"
          + (f"; like for like: float32 on every side, LD_PRELOAD={os.environ['LD_PRELOAD']}" if preloaded() else ""))
    print(f"{'streams':>7} | {'omlx tok/s':>10} {'mlx_lm tok/s':>12} {'raw tok/s':>9} | {'omlx/mlx_lm':>11} "
          f"{'omlx/raw':>8} | TTFT p50/p95 s: {'omlx':>11} {'mlx_lm':>11} {'raw':>11}")
    for level in args.levels:
        o, m, r = (s[side][level] for side in SIDES)
        print(f"{level:7d} | {o['agg']:10.1f} {m['agg']:12.1f} {r['agg']:9.1f} | {ratio(o['agg'], m['agg']):11.2f} "
              f"{ratio(o['agg'], r['agg']):8.2f} |                 "
              + " ".join(f"{x['p50']:5.2f}/{x['p95']:5.2f}" for x in (o, m, r)))
    print()
    print(f"{'streams':>7} | decode tok/s: {'omlx':>7} {'mlx_lm':>7} {'raw':>7} | bound share: {'omlx':>5} "
          f"{'mlx_lm':>6} {'raw':>5} | tokens/request: {'omlx':>5} {'mlx_lm':>6} {'raw':>5} | failed: {'omlx':>4} "
          f"{'mlx_lm':>6} | client CPU")
    for level in args.levels:
        o, m, r = (s[side][level] for side in SIDES)
        print(f"{level:7d} |               {o['decode']:7.1f} {m['decode']:7.1f} {r['decode']:7.1f} |              "
              + " ".join(f"{bound.share(x['decode'], level):{w}.0%}" for x, w in ((o, 5), (m, 6), (r, 5)))
              + f" |                 {o['tokens']:5.1f} {m['tokens']:6.1f} {r['tokens']:5.1f} |         "
              f"{o['failed']:4d} {m['failed']:6d} | {max(o['cpu'], m['cpu']):.0%}")
    print()
    print("every timed wave, in the order run: tok/s (TTFT p50 s)")
    for level in args.levels:
        print(f"{level:7d} | " + " | ".join(
            f"{side}: " + ", ".join(f"{w.aggregate:.1f} ({percentile(w.ttfts, 50):.2f})" for w in results[side][level])
            for side in SIDES))
    for side in results:
        if side in SIDES:
            continue
        for level in args.levels:
            v, o, r = s[side][level], s["omlx"][level], s["raw"][level]
            print(f"{side} at {level}: {v['agg']:.1f} tok/s, decode {v['decode']:.1f}, TTFT p50 {v['p50']:.2f} s; "
                  f"/ omlx-site {ratio(v['agg'], o['agg']):.2f}, / raw {ratio(v['agg'], r['agg']):.2f}")
    print()
    one, many = min(args.levels), 8 if 8 in args.levels else max(args.levels)
    top = max(args.levels)
    o = s["omlx"]
    print(f"at {many} streams omlx vs omlx single stream ({one}): {o[many]['agg']:.1f} vs {o[one]['agg']:.1f} tok/s "
          f"= {ratio(o[many]['agg'], o[one]['agg']):.2f}x")
    print(f"at {top} streams: omlx/raw {ratio(o[top]['agg'], s['raw'][top]['agg']):.2f} (GPU target >= 0.9 at 32), "
          f"TTFT p50 omlx/raw {ratio(o[top]['p50'], s['raw'][top]['p50']):.2f} (GPU target <= 2)")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=None, help="an mlx-lm model folder (default: the demo model)")
    p.add_argument("--levels", type=lambda v: [int(x) for x in v.split(",")], default=None,
                   help="streams per wave (default 1,4,8,16; like for like 1,4,8)")
    p.add_argument("--tokens", type=int, default=None,
                   help="max_tokens of every request (default 64; like for like 32)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--like-for-like", action="store_true",
                   help="every side on a float32 copy of the model, every process with OpenBLAS preloaded")
    p.add_argument("--variant", action="append", default=[], metavar="NAME:OMLX_X=V,...",
                   help="one more omlx-site, with these settings (repeatable)")
    p.add_argument("--no-mlx-lm", action="store_true", help="leave mlx_lm.server out")
    args = p.parse_args()
    if args.like_for_like:
        reexec_with_openblas()              # returns in the process that has it
    args.levels = args.levels or ([1, 4, 8] if args.like_for_like else [1, 4, 8, 16])
    args.tokens = args.tokens or (32 if args.like_for_like else 64)
    model = args.model or demo_model()
    if args.like_for_like:
        model = float32_copy(model)
    loads = [load_average()]
    bound = Bound(model)                     # before anything else runs on the device
    from mlx_lm import load

    raw_model, tokenizer = load(str(model))
    ids = itertools.count()
    servers = []
    try:
        # every stream of the top level runs at once, as in mlx_lm.server (its decode concurrency is 32)
        concurrency = str(max(args.levels))
        waves = {}

        def side(name: str, server) -> None:
            servers.append(server)
            waves[name] = lambda n: server_wave(server, [next(ids) for _ in range(n)], args.tokens)
        side("omlx", start_omlx(model, OMLX_MAX_CONCURRENT=concurrency))
        for name, env in map(variant, args.variant):
            side(name, start_omlx(model, **{"OMLX_MAX_CONCURRENT": concurrency, **env}))
        if not args.no_mlx_lm:
            side("mlx_lm", start_mlx_lm(model))
        waves["raw"] = lambda n: raw_wave(raw_model, tokenizer, [next(ids) for _ in range(n)], args.tokens)
        for level in args.levels:            # warm every batch shape on every side
            for run in waves.values():
                run(level)
        for server in servers:
            server.wait_warm()
        results = {name: {level: [] for level in args.levels} for name in (*SIDES, *waves)}
        for _ in range(args.rounds):
            for level in args.levels:
                for name, run in waves.items():
                    results[name][level].append(run(level))
        inside = {name: where_ttft_went(server, max(args.levels)) for name, server in zip(waves, servers)
                  if server.name == "omlx-site"}
    finally:
        for server in servers:
            server.stop()
    report(model, args, results, bound, (loads[0], load_average()))
    for name, line in inside.items():
        print(f"{name}, the last wave's traces: {line}")


if __name__ == "__main__":
    main()
