"""Does an unload give the memory back, and how cold is a model's first request after its load?
In this process, through the pool itself (pool.host.local.LocalHost, the real probe and engines).

    python benchmarks/unload.py unload --model PATH [--copies 4] [--budget 50GB] [--old-order]
    python benchmarks/unload.py first  --model PATH [--streams 8] [--warmup on|off] [--no-wait]

`unload`: COPIES model ids over one folder's weights (hard links, so a 20 GB model takes 20 GB of
disk once) under OMLX_MAX_MODEL_MEMORY=BUDGET; chats to A, B, C, D, A, B (each load evicts the least
recently used), then the remaining models are unloaded by hand, then one enforcer tick at ok. For
every unload: MLX active + cache and the device's used memory (NVML, what nvidia-smi shows) before
and right after, and how long until the device got the model's bytes back (polled every 20 ms, 5 s
at most); then the history rows. `--old-order` puts back the release order before issue 22 (the
cache cleared while _drop_model's loop variable still held the last lane, and with it the model).

`first`: load the model (warm-up on or off), wait for the warm-up unless --no-wait, then two rounds
of STREAMS concurrent chats; the first round against the second is what a cold start costs. Run it
in fresh processes: compiled kernels stay in the process (and in MLX_PTX_CACHE_DIR across them).
Prints one JSON line per measurement (prefixed `RESULT `) and a table; stops at --deadline seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from omlx_site.process import setup_process

setup_process()

GB = 10**9
STARTED = time.monotonic()


def result(**fields) -> dict:
    print("RESULT " + json.dumps(fields), flush=True)
    return fields


def smi_used() -> int | None:
    """nvidia-smi's used memory of GPU 0, in bytes."""
    if shutil.which("nvidia-smi") is None:
        return None
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                         capture_output=True, text=True).stdout.strip()
    return int(out) * 2**20 if out.isdigit() else None


def memory(probe) -> dict:
    r = probe.read()
    return {"active": r.active, "cache": r.cache, "rss": r.rss, "device_used": r.device_used,
            "device_process": r.device_process, "device_floor": r.device_floor}


def model_copies(src: Path, root: Path, count: int) -> list[str]:
    """`count` folders named a, b, c, ... with src's files, the weights hard-linked."""
    names = [chr(ord("a") + i) for i in range(count)]
    for name in names:
        out = root / name
        if out.exists():
            continue
        out.mkdir(parents=True)
        for f in src.iterdir():
            (os.link if f.suffix == ".safetensors" else shutil.copy)(f, out / f.name)
    return names


def put_back_old_order() -> None:
    """The release before issue 22: the cache cleared inside TextEngine._drop_model, its loop
    variable still bound to the last lane (and the lane to the model)."""
    import mlx.core as mx

    import pool.engines.generator as generator
    import pool.engines.worker as worker
    from pool.engines.memory_release import trim_native_heap

    def old_drop(self):
        for lane in self._lanes.values():
            lane.close()
        self._lanes, self._prefills, self._token_text = {}, [], None
        self._model = self._tokenizer = None
        self._requests.clear()
        self._idle_jobs = []
        gc.collect()
        mx.clear_cache()
        trim_native_heap()
    generator.TextEngine._drop_model = old_drop
    worker.release_memory = lambda: None


async def chat(host, model_id: str, tokens: int = 16, text: str = "Tell me about memory.") -> float:
    started = time.perf_counter()
    async with host.pool.lease(model_id) as engine:
        prompt = await asyncio.to_thread(engine.encode_chat, [{"role": "user", "content": text}])
        from pool.engines.protocol import SamplingParams
        async for _ in engine.generate(prompt, SamplingParams(max_tokens=tokens, temperature=0.7)):
            pass
    return time.perf_counter() - started


async def measured_unload(host, model_id: str, how, expect: int, deadline: float) -> dict:
    """Run `how` (an unload), then poll until the device's used memory fell by 90% of `expect`."""
    import mlx.core as mx

    before, smi_before = memory(host.probe), smi_used()
    started = time.perf_counter()
    await how()
    returned = time.perf_counter() - started
    after = memory(host.probe)
    back = None
    while time.perf_counter() - started < 5 and time.monotonic() < deadline:
        now = memory(host.probe)
        fell = (before["device_used"] or 0) - (now["device_used"] or 0)
        if now["device_used"] is None or fell >= 0.9 * expect:
            back = time.perf_counter() - started
            break
        await asyncio.sleep(0.02)
    settled = memory(host.probe)
    return result(kind="unload", model=model_id, seconds_to_return=round(returned, 3),
                  seconds_until_back=None if back is None else round(back, 3),
                  before=before, right_after=after, after_5s_or_back=settled,
                  smi_before=smi_before, smi_after=smi_used(), mlx_cache_now=mx.get_cache_memory())


async def run_unload(args) -> None:
    from pool.conf import get_settings
    from pool.host.local import LocalHost
    from pool.memory import RealProbe

    if args.old_order:
        put_back_old_order()
    root = Path(args.work) / "copies"
    names = model_copies(args.model, root, args.copies)
    conf = get_settings().with_values(model_dirs=(root,), max_model_memory=args.budget, max_loaded_models=0,
                                      memory_ceiling="off", idle_ttl=None, warmup="off")
    host = LocalHost(conf, RealProbe())
    host.pool.rediscover()
    expect = host.pool.entries[names[0]].size_bytes
    deadline = STARTED + args.deadline
    result(kind="start", old_order=args.old_order, models=names, model_bytes=expect, budget=args.budget,
           memory=memory(host.probe), smi=smi_used())
    order = [names[i % len(names)] for i in range(len(names))] + names[:2]
    for model_id in order:
        if time.monotonic() > deadline:
            result(kind="deadline", at="chats")
            break
        loaded_before = {e.id for e in host.pool.loaded()}
        seconds = await chat(host, model_id)
        evicted = sorted(loaded_before - {e.id for e in host.pool.loaded()})
        result(kind="chat", model=model_id, seconds=round(seconds, 2), evicted=evicted,
               loaded=sorted(e.id for e in host.pool.loaded()), memory=memory(host.probe), smi=smi_used())
    for entry in list(host.pool.loaded()):
        if time.monotonic() > deadline:
            result(kind="deadline", at="unloads")
            break
        await measured_unload(host, entry.id, lambda e=entry: host.pool.unload(e.id), expect, deadline)
    decision = await host.enforcer.tick(on_demand=True)
    actions = [str(a.kind) for a in (decision.actions if decision else ())]
    result(kind="tick", level=str(host.enforcer.level), actions=actions, memory=memory(host.probe), smi=smi_used())
    for e in host.pool.events.recent:
        result(kind="history", action=str(e["action"]), reason=str(e["reason"]), model=e.get("model"),
               freed_bytes=e.get("freed_bytes"), bytes_before=e.get("bytes_before"), bytes_after=e.get("bytes_after"),
               warning=e.get("warning"), detail=e.get("detail"))


async def run_first(args) -> None:
    from pool.conf import get_settings
    from pool.host.local import LocalHost
    from pool.memory import RealProbe

    root = Path(args.work) / "first"
    model_copies(args.model, root, 1)
    conf = get_settings().with_values(model_dirs=(root,), max_model_memory="off", memory_ceiling="off",
                                      idle_ttl=None, warmup=args.warmup, max_concurrent=args.streams)
    host = LocalHost(conf, RealProbe())
    host.pool.rediscover()
    started = time.perf_counter()
    engine = (await host.pool.load("a")).engine
    loaded = time.perf_counter() - started
    warm_seconds = None
    if not args.no_wait:
        while engine._idle_jobs and time.monotonic() < STARTED + args.deadline:
            await asyncio.sleep(0.05)
        warm_seconds = time.perf_counter() - started - loaded
    result(kind="loaded", warmup=args.warmup, load_seconds=round(loaded, 2), jobs_left=len(engine._idle_jobs),
           warm_seconds=None if warm_seconds is None else round(warm_seconds, 2))
    rounds = []
    for r in range(2):
        t = time.perf_counter()
        await asyncio.gather(*(chat(host, "a", tokens=args.tokens, text=f"Question {r}-{i}: what is a cache?")
                               for i in range(args.streams)))
        rounds.append(time.perf_counter() - t)
        result(kind="round", number=r + 1, seconds=round(rounds[-1], 3))
    result(kind="first", warmup=args.warmup, waited=not args.no_wait, streams=args.streams,
           load_seconds=round(loaded, 2),
           warm_seconds=None if warm_seconds is None else round(warm_seconds, 2), first_round=round(rounds[0], 3),
           warm_round=round(rounds[1], 3), ratio=round(rounds[0] / rounds[1], 2),
           ptx_cache=os.environ.get("MLX_PTX_CACHE_DIR"))
    await host.pool.shutdown()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("unload", "first"))
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--work", default="/tmp/unload-bench")
    p.add_argument("--copies", type=int, default=4)
    p.add_argument("--budget", default="50GB")
    p.add_argument("--old-order", action="store_true")
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--warmup", default="on", choices=("on", "off"))
    p.add_argument("--no-wait", action="store_true")
    p.add_argument("--deadline", type=float, default=240)
    args = p.parse_args()
    from pool.setting_parsers import parse_size
    if args.what == "unload":
        args.budget = parse_size(args.budget)
    asyncio.run(run_unload(args) if args.what == "unload" else run_first(args))


if __name__ == "__main__":
    main()
