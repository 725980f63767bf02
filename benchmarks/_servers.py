"""The servers a benchmark compares, started on free ports over one model folder: omlx-site
(`manage.py serve` on a fresh OMLX_HOME, as a user runs it), mlx_lm.server and mlx_vlm.server; the streamed chat
clients (blocking, and asyncio for many at once) and the statistics the benchmarks print."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from _models import ROOT

# `timeout` (the GPU scripts' deadlines) ends a benchmark with SIGTERM: exit through the `finally`
# blocks that stop the servers it started, or they outlive it and hold the card for the next one
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Running:
    def __init__(self, name: str, proc: subprocess.Popen, url: str, model: str, home: Path | None = None):
        self.name, self.proc, self.url, self.model, self.home = name, proc, url, model, home
        # one client for every blocking request: a new httpx client builds an SSL context (15-200 ms
        # here), which a request's time must not include
        self.client = httpx.Client(timeout=900)

    def stop(self) -> None:
        self.client.close()
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        if self.home is not None:
            shutil.rmtree(self.home, ignore_errors=True)

    def wait_warm(self, timeout: float = 900) -> None:
        """Until omlx-site's loaded models have run their warm-up's shapes (the snapshot's `warming`):
        a request meanwhile waits for the shape in progress, seconds each on a fresh kernel cache.
        Returns at once for mlx_lm.server, which has none."""
        deadline = time.monotonic() + timeout
        while self.home is not None and time.monotonic() < deadline:
            if not any(m.get("warming") for m in self.client.get(self.url + "/api/pool").json()["models"]):
                return
            time.sleep(0.2)

    def recent_traces(self, limit: int) -> list[dict]:
        """omlx-site's last `limit` request traces, newest first (written off the token path: a
        moment after the requests end)."""
        time.sleep(1.0)
        return self.client.get(self.url + "/api/requests", params={"limit": limit}).json()["data"]

    def chat_body(self, messages: list[dict], max_tokens: int, model: str | None = None, **extra) -> dict:
        return {"model": model or self.model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True}, **extra}

    def stream_chat(self, messages: list[dict], max_tokens: int, *, reply: StreamReply | None = None, **extra) -> dict:
        """One streamed chat: time to first content token, the text, usage when given, and the
        arrival time of each content chunk (`times`, perf_counter seconds). Another thread may
        watch `reply.times` grow while it runs."""
        body = self.chat_body(messages, max_tokens, **extra)
        reply = reply or StreamReply()
        reply.started = time.perf_counter()
        with self.client.stream("POST", self.url + "/v1/chat/completions", json=body) as r:
            r.raise_for_status()
            reply.request_id = r.headers.get("x-omlx-request-id")
            for line in r.iter_lines():
                reply.read(line)
        return reply.done()

    async def astream_chat(self, client: httpx.AsyncClient, messages: list[dict], max_tokens: int, **extra) -> dict:
        """stream_chat for asyncio clients; a failed request (refused, dropped, an error status) comes
        back as {"error": ...} instead of raising, so a wave counts its failures."""
        reply = StreamReply()
        try:
            async with client.stream("POST", self.url + "/v1/chat/completions",
                                     json=self.chat_body(messages, max_tokens, **extra), timeout=900) as r:
                r.raise_for_status()
                async for line in r.aiter_lines():
                    reply.read(line)
        except (httpx.HTTPError, json.JSONDecodeError) as e:
            return {"error": f"{type(e).__name__}: {e}"}
        if reply.error or not reply.times or not reply.usage:
            return {"error": reply.error or "the stream ended without tokens or usage"}
        return reply.done()

    def post(self, path: str, **body) -> dict:
        r = self.client.post(self.url + path, json=body)
        r.raise_for_status()
        return r.json()


class StreamReply:
    """The SSE lines of one streamed chat, read as they arrive."""

    def __init__(self):
        self.started, self.times, self.parts, self.usage = time.perf_counter(), [], [], {}
        self.request_id: str | None = None     # omlx-site's trace of it (x-omlx-request-id)
        self.error: str | None = None          # the message of an error event that ended the stream

    def read(self, line: str) -> None:
        if not line.startswith("data: {"):
            return
        chunk = json.loads(line[6:])
        if isinstance(chunk.get("error"), dict):
            self.error = f"{chunk['error'].get('type')}: {chunk['error'].get('message')}"
        if chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
            self.times.append(time.perf_counter())
            self.parts.append(chunk["choices"][0]["delta"]["content"])
        self.usage = chunk.get("usage") or self.usage

    def done(self) -> dict:
        first = self.times[0] if self.times else time.perf_counter()
        return {"ttft": first - self.started, "text": "".join(self.parts), "usage": self.usage,
                "started": self.started, "times": self.times, "request_id": self.request_id}


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation; nan for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def gaps(times: list[float], start: float = -math.inf, end: float = math.inf) -> list[float]:
    """Seconds between consecutive arrivals, for the gaps that overlap [start, end] (a stall that
    ends after `end` counts)."""
    return [b - a for a, b in zip(times, times[1:]) if b >= start and a <= end]


def numbered_prompt(i: int, text: str) -> list[dict]:
    """A chat that differs from every other within its first words (a prefix cache can serve only the
    chat template's opening) and whose length in tokens does not depend on i (digits are single
    tokens in the tokenizers used here)."""
    return [{"role": "user", "content": f"Request {i % 10**6:06d}. {text}"}]


STORY = "The old lighthouse keeper counted the steps and wrote the ships' names in a blue ledger. "


def long_text(model: Path, tokens: int) -> str:
    """A question on a story of at least `tokens` tokens (by `model`'s tokenizer)."""
    from mlx_lm.utils import load_tokenizer

    tokenizer, text = load_tokenizer(model), STORY
    while len(tokenizer.encode(text)) < tokens:
        text += STORY
    return text + " What did he write down?"


def _wait(url: str, proc: subprocess.Popen, path: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited ({proc.returncode})")
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url}: the server did not start")


def _log_target():
    """Where a server's output goes: OMLX_BENCH_LOG (a file, appended) when set, else nowhere."""
    path = os.environ.get("OMLX_BENCH_LOG")
    return open(path, "ab") if path else subprocess.DEVNULL


def start_omlx(model: Path, *more_models: Path, **env_overrides) -> Running:
    """omlx-site serving `model` (the one its requests name by default) and any `more_models`."""
    home = Path(tempfile.mkdtemp(prefix="omlx-bench-"))
    (home / "models").mkdir()
    for folder in (model, *more_models):
        (home / "models" / folder.name).symlink_to(folder)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMLX_")}
    env.update(OMLX_HOME=str(home), OMLX_MODEL_DIRS=str(home / "models"), **env_overrides)
    # OMLX_BENCH_ENV="OMLX_A=1 OMLX_B=2": settings for the server under test (A/B runs of one setting)
    env.update(pair.split("=", 1) for pair in os.environ.get("OMLX_BENCH_ENV", "").split())
    port = free_port()
    log = _log_target()
    proc = subprocess.Popen([sys.executable, "manage.py", "serve", "--port", str(port)], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    _wait(url, proc, "/health")
    return Running("omlx-site", proc, url, model.name, home)


def start_mlx_lm(model: Path, *extra_args: str) -> Running:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "mlx_lm", "server", "--model", str(model), "--port", str(port),
                             "--log-level", "WARNING", *extra_args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    _wait(url, proc, "/v1/models")
    return Running("mlx_lm.server", proc, url, str(model))


def start_mlx_vlm(model: Path) -> Running:
    """mlx_vlm.server with `model` loaded at startup, offline; its requests name the model by this path.
    One that exits before it answers raises with the last line it printed (a module it lacks, say)."""
    port = free_port()
    out = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "mlx_vlm.server", "--model", str(model), "--host", "127.0.0.1",
                             "--port", str(port), "--log-level", "WARNING"],
                            env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(url, proc, "/v1/models")
    except RuntimeError as e:
        proc.kill()
        proc.wait()
        out.seek(0)
        lines = out.read().decode(errors="replace").strip().splitlines()
        raise RuntimeError(f"{e}: {lines[-1] if lines else 'it printed nothing'}") from None
    return Running("mlx_vlm.server", proc, url, str(model))
