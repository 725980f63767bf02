"""How fast does the enforcer bring usage back under the soft line after a real load crosses the
hard line? Real models, real memory (the CPU backend: usage = max(RSS, MLX active + cache)).

Two models are loaded, the ceiling is set so that the soft line sits just above what they use,
and a third is loaded. A sampler reads the probe every 2 ms: the reaction is the time from the
first sample at or over the hard line to the first sample back under soft. Side by side: our
enforcer (woken by the load's end) and the same enforcer polling once a second without wake-ups,
as oMLX does.

    .venv/bin/python benchmarks/enforcer_reaction.py [--runs 5] [--size-mb 150]
"""

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from _models import fixture

from omlx_site.process import setup_process

setup_process()   # the BLAS and malloc settings, before anything imports MLX

MB = 10**6


async def one_run(pool, enforcer, probe, lines, target: str) -> float | None:
    samples: list[tuple[float, int]] = []
    done = asyncio.Event()

    async def sample():
        while not done.is_set():
            samples.append((time.perf_counter(), probe.read().usage))
            await asyncio.sleep(0.002)

    sampler = asyncio.ensure_future(sample())
    await pool.load(target)
    deadline = time.perf_counter() + 5
    while time.perf_counter() < deadline:
        crossed = next((t for t, u in samples if u >= lines.hard), None)
        settled = crossed and next((t for t, u in samples if t > crossed and u < lines.soft), None)
        if settled:
            break
        await asyncio.sleep(0.01)
    done.set()
    await sampler
    if not crossed:
        return None
    return (settled - crossed) * 1000 if settled else float("inf")


async def measure(args, *, wake: bool) -> list[float]:
    from pool.conf import get_settings
    from pool.engines.memory_release import reclaim_cache
    from pool.host.local import LocalHost
    from pool.memory import RealProbe
    from pool.policy.pressure import pressure_lines

    folders = [fixture(f"bench-{n}", args.size_mb, seed=i) for i, n in enumerate("xyz")]
    with tempfile.TemporaryDirectory() as models_dir:
        for folder in folders:
            (Path(models_dir) / folder.name).symlink_to(folder)
        conf = get_settings().with_values(model_dirs=(Path(models_dir),), max_model_memory="off",
                                          memory_ceiling="off", idle_ttl=None)
        probe = RealProbe()
        host = LocalHost(conf, probe)
        pool, enforcer = host.pool, host.enforcer
        pool.rediscover()
        names = [f.name for f in folders]
        results, actions = [], []
        for _ in range(args.runs):
            for name in names[:2]:
                await pool.load(name)
                await asyncio.sleep(0.05)
            await asyncio.to_thread(reclaim_cache)  # the baseline must not hold trimmable heap
            two = probe.read().usage
            ceiling = int((two + args.margin_mb * MB) / 0.90)
            enforcer.conf = host.gate.conf = conf.with_values(memory_ceiling=ceiling)
            lines = pressure_lines(ceiling)
            if not wake:
                enforcer.wake = lambda: None
                enforcer._next_interval = lambda: 1.0
            enforcer.start()
            await asyncio.sleep(0.2)
            before = len(pool.events.recent)
            results.append(await one_run(pool, enforcer, probe, lines, names[2]))
            await asyncio.sleep(0.5)  # let the eviction's release finish and be recorded
            actions.extend(e["reason"] for e in list(pool.events.recent)[before:])
            await enforcer.stop()
            enforcer.conf = host.gate.conf = conf
            for name in ("wake", "_next_interval"):
                enforcer.__dict__.pop(name, None)
            for name in names:
                await pool.unload(name, force=True)
        await pool.shutdown()
        print(f"  events during the runs: {', '.join(sorted(set(actions))) or 'none'}")
        return results


def summary(label: str, values: list[float | None]) -> float:
    got = [v for v in values if v is not None]
    med = statistics.median(got) if got else float("nan")
    print(f"{label:<44} median {med:8.1f} ms   runs: {', '.join(f'{v:.0f}' for v in got)}")
    return med


async def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--size-mb", type=float, default=150)
    p.add_argument("--margin-mb", type=float, default=100, help="soft line above the two-model usage")
    args = p.parse_args()
    print(f"three {args.size_mb:g} MB fixture models; soft line = two-model usage + {args.margin_mb:g} MB")
    ours = summary("omlx-site (woken by the load, 1 s cadence)", await measure(args, wake=True))
    polled = summary("same ladder, polled once a second (oMLX)", await measure(args, wake=False))
    print(f"crossing -> under soft: {ours:.1f} ms vs {polled:.1f} ms polled; ratio {polled / ours:.1f}x faster "
          f"(target < 250 ms)")


if __name__ == "__main__":
    asyncio.run(main())
