"""The machinery of benchmarks/fleet.py: a throwaway PostgreSQL and Redis on free loopback ports, and
three omlx-site hosts (`manage.py serve`, each with its own OMLX_HOME), either one fleet over those
services or three hosts that know nothing of each other. Everything started here is stopped by
`Stack.close()`, which fleet.py calls in a `finally` (Ctrl-C and SIGTERM included)."""

from __future__ import annotations

import glob
import os
import pwd
import re
import secrets
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from _servers import Running, free_port, start_omlx

# Debian's newest /usr/lib/postgresql/<version>/bin, else the folder of the pg_ctl on PATH
PG_BIN = Path(max(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[4]), default=None)
              or Path(shutil.which("pg_ctl") or "/usr/bin/pg_ctl").parent)
PG_USER = "postgres"           # PostgreSQL refuses to run as root: its programs run as this user
REDIS = shutil.which("redis-server") or "/usr/bin/redis-server"


def _wait(check, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:  # noqa: BLE001 - not up yet: try again
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not come up within {timeout:.0f} s")


class Postgres:
    """A cluster in a temp folder, trust authentication on 127.0.0.1 only, started with pg_ctl."""

    def __init__(self):
        self.folder = Path(tempfile.mkdtemp(prefix="omlx-bench-pg-"))
        self.data, self.log, self.port = self.folder / "data", self.folder / "postgres.log", free_port()
        self.started = False
        if os.geteuid() == 0:
            owner = pwd.getpwnam(PG_USER)
            os.chown(self.folder, owner.pw_uid, owner.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", PG_USER, "-A", "trust", "-E", "UTF8", "--no-locale",
                  "--no-sync")
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.folder} "
                   "-c fsync=off -c synchronous_commit=off -c full_page_writes=off")
        self._run("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data), "-l", str(self.log), "-o", options)
        self.started = True

    def _run(self, program: str, *args: str) -> None:
        cmd = [str(PG_BIN / program), *args]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", PG_USER, "--", *cmd]
        out = self.folder / "commands.log"
        with open(out, "ab") as log:     # a file, not a pipe: the postmaster must not hold our pipe open
            done = subprocess.run(cmd, cwd=self.folder, stdin=subprocess.DEVNULL, stdout=log,
                                  stderr=subprocess.STDOUT, timeout=120, check=False)
        if done.returncode != 0:
            logs = [p.read_text(errors="replace")[-2000:] for p in (out, self.log) if p.exists()]
            raise RuntimeError(f"{program} failed ({done.returncode}):\n" + "\n".join(logs))

    def new_database(self) -> str:
        """A fresh empty database; its URL."""
        import psycopg

        name = f"omlx_{secrets.token_hex(4)}"
        with psycopg.connect(host="127.0.0.1", port=self.port, user=PG_USER, dbname="postgres",
                             autocommit=True, connect_timeout=5) as db:
            db.execute(f'CREATE DATABASE "{name}"')
        return f"postgres://{PG_USER}@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        try:
            if self.started:
                self._run("pg_ctl", "stop", "-w", "-t", "30", "-m", "fast", "-D", str(self.data))
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


class Redis:
    """redis-server in the foreground as a child of this process, no persistence."""

    def __init__(self):
        self.folder, self.port = Path(tempfile.mkdtemp(prefix="omlx-bench-redis-")), free_port()
        self.proc = subprocess.Popen([REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", str(self.folder)],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait(self._pong, "Redis", 30)

    def _pong(self) -> bool:
        import redis

        if self.proc.poll() is not None:
            raise SystemExit(f"redis-server exited ({self.proc.returncode})")
        return bool(redis.Redis(port=self.port, socket_connect_timeout=1).ping())

    def url(self, db: int) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


class Stack:
    """Whatever the benchmark has started, stopped in reverse order by close()."""

    def __init__(self):
        self.pg: Postgres | None = None
        self.redis: Redis | None = None
        self.hosts: list[Running] = []
        self._fleets = 0

    def services(self) -> None:
        self.pg = Postgres()
        self.redis = Redis()

    def start_hosts(self, models: list[Path], *, fleet: bool, count: int = 3, max_loaded: int = 2) -> list[Running]:
        """`count` hosts, each serving every folder in `models` with OMLX_MAX_LOADED_MODELS=`max_loaded`;
        with `fleet`, joined over a fresh database and Redis db, and waited for until each sees all."""
        self.stop_hosts()
        shared: dict[str, str] = {}
        if fleet:
            assert self.pg is not None and self.redis is not None
            self._fleets += 1
            shared = {"OMLX_DATABASE_URL": self.pg.new_database(), "OMLX_REDIS_URL": self.redis.url(self._fleets),
                      "OMLX_FLEET_KEY": secrets.token_urlsafe(24)}

        def start(i: int) -> None:
            host = start_omlx(*models, OMLX_HOST_ID=f"host-{i + 1}", OMLX_MAX_LOADED_MODELS=str(max_loaded), **shared)
            host.name = f"host-{i + 1}"
            self.hosts.append(host)         # at once: close() stops it whatever happens to the others

        with ThreadPoolExecutor(count) as pool:          # together, as a fleet's hosts may start
            starting = [pool.submit(start, i) for i in range(count)]
        for f in starting:
            f.result()                                   # a host that did not start: its error
        self.hosts.sort(key=lambda h: h.name)
        if fleet:
            for host in self.hosts:
                _wait(lambda host=host: len(httpx.get(host.url + "/api/fleet", timeout=5).json()["hosts"]) == count,
                      f"{host.name} seeing the {count} hosts of the fleet")
        return self.hosts

    def stop_hosts(self) -> None:
        while self.hosts:
            self.hosts.pop().stop()

    def close(self) -> None:
        try:
            self.stop_hosts()
        finally:
            for service in (self.redis, self.pg):
                if service is not None:
                    service.stop()
            self.redis = self.pg = None


def counters(host: Running) -> dict[str, float]:
    """The host's model_loads_total and model_load_seconds_total (/metrics, counted since it started)."""
    text = httpx.get(host.url + "/metrics", timeout=30).text
    found = dict(re.findall(r"^(model_loads_total|model_load_seconds_total) (\S+)$", text, re.MULTILINE))
    return {"loads": float(found.get("model_loads_total", "nan")),
            "load_seconds": float(found.get("model_load_seconds_total", "nan"))}


def loaded_models(host: Running) -> list[str]:
    return sorted(m["id"] for m in httpx.get(host.url + "/api/pool", timeout=30).json()["models"]
                  if m["state"] == "loaded")


def read_files(models: list[Path]) -> None:
    """Every weight file read once, so each arm's loads find them in the page cache alike."""
    for folder in models:
        for path in folder.iterdir():
            with open(path.resolve(), "rb") as f:
                while f.read(1 << 24):
                    pass
