"""Tick-to-browser latency of the dashboard's websocket, with 1 and with 50 dashboards connected.

A real server (`manage.py serve`, its own OMLX_HOME, the demo model) is kept busy: the demo model
generates without pause (so the enforcer ticks every second and each request's start and end is a
pool change) and a model setting changes five times a second. The snapshot is full size: ten models
listed and 50 events in the timeline. N websocket clients, a few
lines of asyncio each, record `receive time - snapshot["sent_at"]` for every broadcast (the same
machine clock: sent_at is stamped by the broadcaster just before group_send). Target: p95 < 100 ms.

    make bench-dashboard
    .venv/bin/python benchmarks/dashboard_latency.py [--clients 1 50] [--seconds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from _models import ROOT, demo_model

DEMO = "smollm2-135m-instruct"
# A lived-in pool, as a dashboard sees it: ten models listed and a full timeline of 50 events.
EXTRA_MODELS = 9
EVENTS = 50
SEED_EVENTS = f"""
from pool.models import EvictionEvent
EvictionEvent.objects.bulk_create([EvictionEvent(model_id="{DEMO}", reason="lru", estimated_bytes=115_231_651,
    freed_bytes=115_000_000, rss_freed_bytes=90_000_000, bytes_before=900_000_000, bytes_after=780_000_000,
    requested_by="copy-1", duration_ms=40.0, detail="to load 'copy-1'") for _ in range({EVENTS})])
"""


# ---- a minimal websocket client (RFC 6455: client frames masked, server frames not) ------------

class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.latencies: list[float] = []

    @classmethod
    async def connect(cls, port: int, path: str = "/ws/pool/") -> "Client":
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=2**24)
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write((f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                      f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                      f"Origin: http://127.0.0.1:{port}\r\n\r\n").encode())
        head = await reader.readuntil(b"\r\n\r\n")
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError(f"handshake refused: {head.splitlines()[0]!r}")
        return cls(reader, writer)

    def _send(self, opcode: int, payload: bytes = b"") -> None:
        mask = os.urandom(4)
        n = len(payload)
        head = bytes([0x80 | opcode]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack("!H", n))
        self.writer.write(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    async def receive(self) -> bytes | None:
        parts = []
        while True:
            b1, b2 = await self.reader.readexactly(2)
            n = b2 & 0x7F
            if n == 126:
                n = struct.unpack("!H", await self.reader.readexactly(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", await self.reader.readexactly(8))[0]
            payload = await self.reader.readexactly(n)
            opcode = b1 & 0x0F
            if opcode == 8:
                return None
            if opcode == 9:
                self._send(10, payload)
                continue
            parts.append(payload)
            if b1 & 0x80:
                return b"".join(parts)

    async def listen(self, recording: asyncio.Event) -> None:
        while (frame := await self.receive()) is not None:
            received = time.time()
            if recording.is_set():
                sent_at = self.sent_at(frame)
                if sent_at is not None:
                    self.latencies.append((received - sent_at) * 1000)

    @staticmethod
    def sent_at(frame: bytes) -> float | None:
        """The broadcaster stamps sent_at last: read it from the tail, so that 50 clients sharing one
        process do not queue behind each other's JSON parsing."""
        at = frame.rfind(b'"sent_at": ')
        if at < 0:
            return None
        tail = frame[at + 11:].rstrip(b"}").split(b",")[0]
        try:
            return float(tail)
        except ValueError:
            return json.loads(frame).get("sent_at")

    async def close(self) -> None:
        self._send(8, struct.pack("!H", 1000))
        try:
            await self.writer.drain()
        except ConnectionError:
            pass
        self.writer.close()


# ---- the server and the load -------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(home: Path) -> tuple[subprocess.Popen, int]:
    (home / "models").mkdir(parents=True)
    for name in [DEMO] + [f"copy-{i}" for i in range(1, EXTRA_MODELS + 1)]:
        (home / "models" / name).symlink_to(demo_model(), target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMLX_")}
    env.update(OMLX_HOME=str(home), OMLX_MODEL_DIRS=str(home / "models"), PYTHONUNBUFFERED="1")
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True)
    subprocess.run([sys.executable, "manage.py", "shell", "-c", SEED_EVENTS], cwd=ROOT, env=env, check=True)
    port = free_port()
    log = open(home / "server.log", "wb")
    proc = subprocess.Popen([sys.executable, "manage.py", "serve", "--port", str(port)], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc, port
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError((home / "server.log").read_text()[-3000:])


async def keep_busy(url: str, stop: asyncio.Event) -> int:
    """Generation without pause, and a setting changed five times a second."""
    changes = 0

    async def generate(client: httpx.AsyncClient):
        while not stop.is_set():
            await client.post(f"{url}/v1/chat/completions", json={
                "model": DEMO, "max_tokens": 48, "messages": [{"role": "user", "content": "Tell me about Paris."}]})

    async def settings(client: httpx.AsyncClient):
        nonlocal changes
        while not stop.is_set():
            await client.post(f"{url}/admin/model/{DEMO}/settings", json={"ttl_seconds": 600 + changes % 2})
            changes += 1
            await asyncio.sleep(0.2)

    async with httpx.AsyncClient(timeout=120) as client:
        await asyncio.gather(generate(client), settings(client))
    return changes


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


async def measure(port: int, clients: int, seconds: float) -> list[float]:
    url = f"http://127.0.0.1:{port}"
    conns = await asyncio.gather(*(Client.connect(port) for _ in range(clients)))
    recording = asyncio.Event()
    listeners = [asyncio.ensure_future(c.listen(recording)) for c in conns]
    stop = asyncio.Event()
    busy = asyncio.ensure_future(keep_busy(url, stop))
    await asyncio.sleep(2)   # warm: the model loads, every client has its first snapshot
    recording.set()
    await asyncio.sleep(seconds)
    recording.clear()
    stop.set()
    await busy
    for conn in conns:
        await conn.close()
    await asyncio.gather(*listeners, return_exceptions=True)
    return [v for conn in conns for v in conn.latencies]


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, nargs="+", default=[1, 50])
    p.add_argument("--seconds", type=float, default=15)
    args = p.parse_args()
    home = Path(tempfile.mkdtemp(prefix="omlx-bench-dashboard-"))
    proc, port = start_server(home)
    try:
        print(f"server on :{port}; {EXTRA_MODELS + 1} models listed, {EVENTS} events in the timeline; the demo model "
              f"generating, a setting changing 5/s; {args.seconds:g} s per run")
        print(f"{'dashboards':>10} {'snapshots':>10} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}")
        for n in args.clients:
            values = await measure(port, n, args.seconds)
            if not values:
                print(f"{n:>10} {0:>10}  (no broadcasts received)")
                continue
            print(f"{n:>10} {len(values):>10} {statistics.median(values):>8.1f} {percentile(values, 95):>8.1f} "
                  f"{max(values):>8.1f}")
        print("target: p95 < 100 ms")
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
