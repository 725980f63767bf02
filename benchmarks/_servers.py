"""The servers a benchmark compares, started on free ports over one model folder: omlx-site
(`manage.py serve` on a fresh OMLX_HOME, as a user runs it) and mlx_lm.server."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from _models import ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Running:
    def __init__(self, name: str, proc: subprocess.Popen, url: str, model: str, home: Path | None = None):
        self.name, self.proc, self.url, self.model, self.home = name, proc, url, model, home

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        if self.home is not None:
            shutil.rmtree(self.home, ignore_errors=True)

    def stream_chat(self, messages: list[dict], max_tokens: int, **extra) -> dict:
        """One streamed chat: time to first content token, the text, and usage when given."""
        body = {"model": self.model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True}, **extra}
        started, first, parts, usage = time.perf_counter(), None, [], {}
        with httpx.stream("POST", self.url + "/v1/chat/completions", json=body, timeout=900) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
                    first = first or time.perf_counter()
                    parts.append(chunk["choices"][0]["delta"]["content"])
                usage = chunk.get("usage") or usage
        return {"ttft": (first or time.perf_counter()) - started, "text": "".join(parts), "usage": usage}


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


def start_omlx(model: Path, **env_overrides) -> Running:
    home = Path(tempfile.mkdtemp(prefix="omlx-bench-"))
    (home / "models").mkdir()
    (home / "models" / model.name).symlink_to(model)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMLX_")}
    env.update(OMLX_HOME=str(home), OMLX_MODEL_DIRS=str(home / "models"), **env_overrides)
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
