"""LoRA adapters as models of the pool (issue 36): N adapters over one base in one omlx-site, each served
as `<base id>:<folder name>` over the base's own arrays (pool/engines/adapter.py), against N fused copies
(mlx-lm's own `mlx_lm fuse`) and against the base alone. Three tables, issue 36's targets in brackets:

1. Memory: the base and N adapters loaded (one short chat each); the process's MLX active memory from
   /api/pool against the base's measured_bytes + the adapters' own bytes [measured / sum <= 1.05], the
   KV and prompt caches the snapshot lists shown apart; beside it, the N fused copies: their files as
   mlx-lm saves them, and their MLX active memory loaded one after another, as the pool loads them
   (float32 on the CPU backend), in a fresh process.
2. Switching: TTFT of adapter B's first request right after two requests to adapter A (every adapter
   and the base loaded already) against the next request on B, warm [switch / warm <= 1.2]; adapters
   taken in turn, each twice.
3. Throughput: 4 concurrent streams, one per adapter (4 adapters), against 4 on the base alone, waves
   taking turns; aggregate decode tok/s [adapters / base >= 0.8]; beside it one stream on one adapter,
   omlx-site against mlx_lm.server --adapter-path, and on the base through omlx-site, taking turns.

Adapters are random-weight fixtures (pool/catalog/fixture_adapters.py) with mlx_lm.lora's defaults:
rank 8 on the last 16 layers; they and the fused copies are built once in the benchmark cache.
Prompts start with a unique number, so no prefix cache serves them; greedy, no ignore_eos (the
tables show the tokens generated). Decode tok/s = a stream's (tokens - 1) / (last - first token
time), summed over a wave's streams.

    .venv/bin/python benchmarks/adapters.py [--model PATH] [--adapters 16] [--tokens 64] [--rounds 3] [--switches 10]
        [--no-mlx-lm] [--fused N] [--throughput-only]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from _models import CACHE, as_the_pool_loads, demo_model
from _servers import numbered_prompt, start_mlx_lm, start_omlx

from omlx_site.process import setup_process

setup_process()   # the BLAS and malloc settings, before anything imports MLX

SHORT = "Say hello."
ASK = "Write a long, detailed story about a lighthouse keeper and every ship he watched, chapter by chapter."
RANK, LAYERS = 8, 16          # mlx_lm.lora's defaults
STREAMS = 4
MB = 2**20
PROMPTS = itertools.count()   # every request's prompt differs from the first words


def say(text: str = "") -> None:
    print(text, flush=True)


def load_average() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


# ---- folders ---------------------------------------------------------------------------------------

def adapter_folders(base: Path, n: int) -> list[Path]:
    from pool.catalog.fixture_adapters import make_fixture_adapter

    folders = []
    for i in range(n):
        out = CACHE / "adapters" / base.name / f"lora-{i:02d}"
        if not (out / "adapters.safetensors").exists():
            make_fixture_adapter(out, base, rank=RANK, layers=LAYERS, seed=i)
        folders.append(out)
    return folders


def fused_folders(base: Path, adapters: list[Path]) -> list[Path]:
    """Each adapter fused into a copy of the base by mlx-lm's own fuse (quantized stays quantized)."""
    folders = []
    for adapter in adapters:
        out = CACHE / "fused" / base.name / adapter.name
        if not (out / "config.json").exists():
            partial = out.with_name(out.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "mlx_lm", "fuse", "--model", str(base), "--adapter-path",
                            str(adapter), "--save-path", str(partial)], check=True, stdout=subprocess.DEVNULL)
            partial.rename(out)
        folders.append(out)
    return folders


def file_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.glob("*.safetensors"))


def hold_fused(folders: list[Path], dequantize: bool) -> dict:
    """(in a fresh process) every folder loaded one after another and kept: MLX active memory."""
    import mlx.core as mx

    from pool.engines.loading import load_weights

    before, held, each = mx.get_active_memory(), [], []
    for folder in folders:
        held.append(load_weights(folder, dequantize=dequantize)[0])
        each.append(mx.get_active_memory() - before - sum(each))
    return {"active": mx.get_active_memory() - before, "each": each}


def measure_fused(folders: list[Path], dequantize: bool) -> dict:
    out = subprocess.run([sys.executable, __file__, "--hold-fused", json.dumps([str(f) for f in folders]),
                          *(["--dequantize"] if dequantize else [])], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---- requests --------------------------------------------------------------------------------------

def chat(server, model: str, text: str, tokens: int) -> dict:
    return server.stream_chat(numbered_prompt(next(PROMPTS), text), tokens, model=model)


def decode_rate(reply: dict) -> float:
    n, times = reply["usage"]["completion_tokens"], reply["times"]
    return (n - 1) / (times[-1] - times[0]) if n > 1 and len(times) > 1 and times[-1] > times[0] else float("nan")


async def _wave(server, models: list[str], tokens: int) -> dict:
    limits = httpx.Limits(max_connections=len(models) + 4, max_keepalive_connections=len(models) + 4)
    async with httpx.AsyncClient(limits=limits, timeout=900) as client:
        started = time.perf_counter()
        replies = await asyncio.gather(*(server.astream_chat(client, numbered_prompt(next(PROMPTS), ASK), tokens,
                                                             model=m) for m in models))
        wall = time.perf_counter() - started
    failed = [r["error"] for r in replies if "error" in r]
    if failed:
        raise RuntimeError(f"{len(failed)} stream(s) failed: {failed[0]}")
    counts = [r["usage"]["completion_tokens"] for r in replies]
    return {"decode": sum(decode_rate(r) for r in replies), "agg": sum(counts) / wall,
            "tokens": statistics.mean(counts)}


def wave(server, models: list[str], tokens: int) -> dict:
    return asyncio.run(_wave(server, models, tokens))


def snapshot(server) -> dict:
    return server.client.get(server.url + "/api/pool").json()


# ---- the three phases ------------------------------------------------------------------------------

def memory_phase(server, base_id: str, ids: list[str]) -> dict:
    idle = snapshot(server)["memory"]["active_bytes"]
    say(f"  before any load: MLX active {idle / MB:.1f} MB")
    started = time.perf_counter()
    chat(server, base_id, SHORT, 8)
    say(f"  base {base_id} loaded by a short chat in {time.perf_counter() - started:.2f} s")
    firsts = []
    for model_id in ids:
        firsts.append(chat(server, model_id, SHORT, 8)["ttft"])
        say(f"  {model_id}: first chat (its load over the loaded base) TTFT {firsts[-1]:.3f} s")
    server.wait_warm()
    snap = snapshot(server)
    rows = {m["id"]: m for m in snap["models"]}
    not_loaded = [i for i in (base_id, *ids) if rows[i]["state"] != "loaded"]
    if not_loaded:
        raise RuntimeError(f"not loaded after their chat: {not_loaded}")
    memory = snap["memory"]
    result = {"idle": idle, "base": rows[base_id]["measured_bytes"],
              "adapters": [rows[i]["measured_bytes"] for i in ids], "active": memory["active_bytes"],
              "caches": (memory["kv_bytes"] or 0) + (memory["prompt_cache_bytes"] or 0), "firsts": firsts}
    say(f"  /api/pool: MLX active {result['active'] / MB:.1f} MB; base {result['base'] / MB:.1f} MB; adapters "
        f"{sum(result['adapters']) / MB:.2f} MB; KV + prompt caches {result['caches'] / MB:.1f} MB")
    return result


def switching_phase(server, ids: list[str], switches: int) -> dict:
    """Two requests on each adapter in turn: the first comes right after the previous adapter's (a switch),
    the second is warm."""
    switch, warm = [], []
    for i in range(switches + 1):
        model_id = ids[i % len(ids)]
        first, second = (chat(server, model_id, SHORT, 4)["ttft"] for _ in range(2))
        if i:
            switch.append(first)
            warm.append(second)
            say(f"  {ids[(i - 1) % len(ids)]} then {model_id}: TTFT {first * 1000:.1f} ms; "
                f"again {second * 1000:.1f} ms")
    return {"switch": switch, "warm": warm}


def throughput_phase(server, base_id: str, ids: list[str], tokens: int, rounds: int) -> dict:
    sides = {"adapters": ids[:STREAMS], "base": [base_id] * STREAMS}
    for models in sides.values():     # untimed: the first wave of each shape
        wave(server, models, tokens)
    waves: dict[str, list[dict]] = {name: [] for name in sides}
    for r in range(rounds):
        for name, models in sides.items():
            waves[name].append(wave(server, models, tokens))
            w = waves[name][-1]
            say(f"  round {r + 1}: {STREAMS} streams on {name:8}: decode {w['decode']:6.1f} tok/s, "
                f"wall {w['agg']:6.1f} tok/s, {w['tokens']:.1f} tokens/stream")
    return waves


def single_phase(ours, theirs, base_id: str, adapter_id: str, tokens: int, rounds: int) -> dict:
    sides = {"omlx-site": lambda: chat(ours, adapter_id, ASK, tokens),
             "omlx-site base": lambda: chat(ours, base_id, ASK, tokens),
             "mlx_lm.server": lambda: chat(theirs, "default_model", ASK, tokens)}   # its --adapter-path
    for run in sides.values():
        run()
    rates: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(rounds):
        for name, run in sides.items():
            reply = run()
            rates[name].append(decode_rate(reply))
            on = base_id if name.endswith("base") else adapter_id
            say(f"  round {r + 1}: one stream on {on} through {name:14}: {rates[name][-1]:6.1f} decode tok/s "
                f"({reply['usage']['completion_tokens']} tokens)")
    return rates


# ---- the report ------------------------------------------------------------------------------------

def report(args, base: Path, mem: dict, fused: dict, switching: dict, waves: dict, single: dict | None) -> None:
    n = len(mem["adapters"])
    if len(fused["files"]) < n:        # --fused: the copies measured, scaled to n
        scale, measured_copies = n / len(fused["files"]), len(fused["files"])
        fused = {**fused, "files": [statistics.mean(fused["files"])] * n, "active": fused["active"] * scale}
        say(f"(fused copies: {measured_copies} built and loaded, scaled to {n})")
    own = mem["base"] + sum(mem["adapters"])
    weights_only = mem["active"] - mem["caches"]
    say()
    say(f"model {base.name}; {n} adapters, rank {RANK} on the last {LAYERS} layers; {args.rounds} wave(s) a side; "
        f"{args.tokens} max tokens a stream; the pool loads it {'as float32' if fused['dequantize'] else 'as it is'}")
    say()
    say(f"1. Memory: {n} adapters over one base in one omlx-site vs {n} fused copies")
    say(f"   base (measured_bytes)                         {mem['base'] / MB:10.1f} MB")
    say(f"   {n} adapters' own bytes                         {sum(mem['adapters']) / MB:10.2f} MB "
        f"({statistics.mean(mem['adapters']) / MB:.3f} MB each)")
    say(f"   base + adapters                               {own / MB:10.1f} MB")
    say(f"   measured: MLX active (/api/pool)              {mem['active'] / MB:10.1f} MB "
        f"(of which KV + prompt caches {mem['caches'] / MB:.1f} MB; {mem['idle'] / MB:.1f} MB before any load)")
    say(f"   measured / (base + adapters)                  {ratio(mem['active'], own):10.3f}   [target <= 1.05]; "
        f"without the KV and prompt caches {ratio(weights_only, own):.3f}")
    say(f"   {n} fused copies, mlx-lm's files (mlx_lm fuse)  {sum(fused['files']) / MB:10.1f} MB "
        f"({statistics.mean(fused['files']) / MB:.1f} MB each)")
    say(f"   {n} fused copies loaded as the pool loads them  {fused['active'] / MB:10.1f} MB MLX active, one process "
        f"({statistics.mean(fused['each']) / MB:.1f} MB each)")
    say(f"   fused copies / measured                       {ratio(fused['active'], mem['active']):10.2f}x")
    say()
    sw, wm = statistics.median(switching["switch"]), statistics.median(switching["warm"])
    say(f"2. Switching: TTFT, median of {len(switching['switch'])} switches (ms)")
    say(f"   B right after A (switch) {sw * 1000:8.1f}   B warm {wm * 1000:8.1f}   switch / warm {ratio(sw, wm):.2f}"
        f"   [target <= 1.2]")
    say(f"   switch runs {', '.join(f'{x * 1000:.1f}' for x in switching['switch'])}; "
        f"warm runs {', '.join(f'{x * 1000:.1f}' for x in switching['warm'])}")
    say(f"   an adapter's first chat (its load over the loaded base): median {statistics.median(mem['firsts']):.3f} s")
    say()
    report_throughput(args, waves, single)


def report_throughput(args, waves: dict, single: dict | None) -> None:
    med = {name: {k: statistics.median(w[k] for w in ws) for k in ("decode", "agg", "tokens")}
           for name, ws in waves.items()}
    a, b = med["adapters"], med["base"]
    say(f"3. Throughput: {STREAMS} concurrent streams, medians of {args.rounds} waves")
    say(f"   {'':28} {'decode tok/s':>12} {'wall tok/s':>10} {'tokens/stream':>13}")
    for name, label in (("adapters", f"{STREAMS} adapters, one stream each"), ("base", "the base alone")):
        say(f"   {label:28} {med[name]['decode']:12.1f} {med[name]['agg']:10.1f} {med[name]['tokens']:13.1f}")
    say(f"   adapters / base: decode {ratio(a['decode'], b['decode']):.2f} [target >= 0.8], wall "
        f"{ratio(a['agg'], b['agg']):.2f}")
    if single:
        o, ob, m = (statistics.median(single[k]) for k in ("omlx-site", "omlx-site base", "mlx_lm.server"))
        say(f"   one stream on one adapter: omlx-site {o:.1f}, mlx_lm.server --adapter-path {m:.1f} decode tok/s "
            f"({ratio(o, m):.2f}x); on the base alone through omlx-site {ob:.1f} (adapter / base {ratio(o, ob):.2f})")
    say(f"load average (1/5/15 min) at the start {args.loads[0]}, at the end {load_average()}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=None, help="an mlx-lm model folder (default: the demo model)")
    p.add_argument("--adapters", type=int, default=16)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3, help="waves of each side (table 3)")
    p.add_argument("--switches", type=int, default=10, help="A -> B switches (table 2)")
    p.add_argument("--no-mlx-lm", action="store_true", help="skip mlx_lm.server --adapter-path")
    p.add_argument("--fused", type=int, default=None,
                   help="fuse and load only this many copies, the table scaling them to --adapters (a GPU run's "
                        "2 GB copies take minutes each to write)")
    p.add_argument("--throughput-only", action="store_true",
                   help="table 3 alone: no fused copies, no switching (a GPU lease's minutes)")
    p.add_argument("--hold-fused", help=argparse.SUPPRESS)
    p.add_argument("--dequantize", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.hold_fused:
        print(json.dumps(hold_fused([Path(f) for f in json.loads(args.hold_fused)], args.dequantize)))
        return
    if args.adapters < STREAMS:
        p.error(f"--adapters must be at least {STREAMS}")
    args.loads = [load_average()]
    base = (args.model or demo_model()).resolve()
    copies = "" if args.throughput_only else " and their fused copies"
    say(f"building {args.adapters} adapters{copies} in {CACHE} (once)")
    adapters = adapter_folders(base, args.adapters)
    fused = [] if args.throughput_only else fused_folders(base, adapters[:args.fused or len(adapters)])
    base_id = base.name
    ids = [f"{base_id}:{a.name}" for a in adapters]
    single = None
    say("1. memory: the base and every adapter loaded by one short chat")
    server = start_omlx(base, *adapters)
    try:
        mem = memory_phase(server, base_id, ids)
        switching = {}
        if not args.throughput_only:
            say("2. switching")
            switching = switching_phase(server, ids, args.switches)
        say(f"3. throughput: {STREAMS} streams on {STREAMS} adapters vs {STREAMS} on the base")
        waves = throughput_phase(server, base_id, ids, args.tokens, args.rounds)
        if not args.no_mlx_lm:
            theirs = start_mlx_lm(base, "--adapter-path", str(adapters[0]))
            try:
                single = single_phase(server, theirs, base_id, ids[0], args.tokens, args.rounds)
            finally:
                theirs.stop()
    finally:
        server.stop()
    if args.throughput_only:
        say()
        report_throughput(args, waves, single)
        return
    dequantize = as_the_pool_loads(base)
    say(f"1. memory: {len(fused)} fused copies loaded one after another in a fresh process"
        f"{' (float32, as the pool loads them here)' if dequantize else ''}")
    held = measure_fused(fused, dequantize)
    report(args, base, mem, {**held, "files": [file_bytes(f) for f in fused], "dequantize": dequantize},
           switching, waves, single)


if __name__ == "__main__":
    main()
