"""Hosts of a fleet for the end-to-end tests: real `manage.py serve` processes (tests/conftest.py's
Server) that meet in one Redis (and, when given, share one PostgreSQL), each with its own OMLX_HOME,
host id and model folders; started together, waited for until every one sees all the others in
/api/fleet, killed, restarted and stopped. Every wait here is bounded and fails with what it saw."""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import httpx

from tests.conftest import TEST_SERVER_DEFAULTS, Server, free_port

FLEET_KEY = "the-fleet-key-of-the-tests"
# the small chat models of the fleet tests, one random-weight folder each (name -> seed), built once
SMALL_SEEDS = {"x": 40, "y": 41, "m": 42, "n": 43, "only-b": 44, "pinned": 45}
SMALL_MB = 12
JOIN_SECONDS = 30          # every host sees every other one in /api/fleet
ASK_SECONDS = 10           # one call to a host in a wait


def wait_until(predicate: Callable[[], Any], timeout: float, what: str | Callable[[], str],
               interval: float = 0.05) -> Any:
    """predicate()'s first truthy value; an AssertionError naming `what` after `timeout` seconds. A
    host that does not answer meanwhile (starting, stopping, killed) counts as "not yet"."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = predicate()
        except httpx.TransportError as e:
            value, last_error = None, e
        if value:
            return value
        if time.monotonic() >= deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:g} s waiting for {said}"
                                 + (f" (last error: {last_error!r})" if last_error else ""))
        time.sleep(interval)


def small_models(make_model, *names: str) -> dict[str, Path]:
    """name -> folder of the named small models (distinct seeds; the same folder in every module)."""
    return {name: make_model(f"fleet-{name}", SMALL_MB, seed=SMALL_SEEDS[name]) for name in names}


def holds(predicate: Callable[[], Any], seconds: float, what: str | Callable[[], str], interval: float = 0.1) -> None:
    """predicate() stays truthy for `seconds` (what must not happen, watched over a few publishes)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not predicate():
            raise AssertionError(what() if callable(what) else what)
        time.sleep(interval)


# ---- what a host says ---------------------------------------------------------------------------

def ask(server: Server, path: str, **kw) -> httpx.Response:
    """GET with the host's key, and a short timeout (a wait must not hang on one call)."""
    return httpx.get(server.url + path, headers=server.headers, timeout=ASK_SECONDS, **kw)


def fleet_state(server: Server) -> dict:
    r = ask(server, "/api/fleet")
    assert r.status_code == 200, r.text
    return r.json()


def hosts_seen(server: Server) -> set[str]:
    return {h["host"] for h in fleet_state(server)["hosts"]}


def states(server: Server) -> dict[str, str]:
    """model id -> state, on this host only."""
    return {m["id"]: m["state"] for m in ask(server, "/api/pool").json()["models"]}


def model_row(server: Server, model: str) -> dict:
    return next(m for m in ask(server, "/api/pool").json()["models"] if m["id"] == model)


def requests_served(server: Server, model: str) -> float:
    """The host's requests_total for the model (/metrics): the requests its own pool took."""
    text = ask(server, "/metrics").text
    found = re.search(rf'^requests_total{{model="{re.escape(model)}"}} ([0-9.e+]+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def error_of(response: httpx.Response) -> dict:
    """The OpenAI envelope's error object (an AssertionError with the body when it is not one)."""
    try:
        return response.json()["error"]
    except (ValueError, KeyError, TypeError):
        raise AssertionError(f"not an error envelope ({response.status_code}): {response.text[:500]}") from None


def sse_data(lines: list[str]) -> list[str]:
    """The `data:` payloads of an SSE stream's lines."""
    return [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]


# ---- the fleet ----------------------------------------------------------------------------------

class Fleet:
    """Hosts that share `redis_url` (and `database_url`, a PostgreSQL, when given). `env` applies to
    every host (OMLX_FLEET_TTL, OMLX_MAX_LOADED_MODELS, ...); `start` adds each host's own."""

    def __init__(self, base: Path, migrated_db: Path, redis_url: str, *, database_url: str | None = None,
                 key: str = FLEET_KEY, **env):
        self.base, self.migrated_db = Path(base), migrated_db
        self.env = {"OMLX_REDIS_URL": redis_url, "OMLX_FLEET_KEY": key, **{k: str(v) for k, v in env.items()}}
        if database_url:
            self.env["OMLX_DATABASE_URL"] = database_url
        self.hosts: dict[str, Server] = {}
        self.killed: set[str] = set()

    def __getitem__(self, host_id: str) -> Server:
        return self.hosts[host_id]

    def live(self) -> dict[str, Server]:
        return {h: s for h, s in self.hosts.items() if s.alive()}

    def start(self, models: dict[str, dict[str, Path]], env: dict[str, dict] | None = None) -> Fleet:
        """models: host id -> {model name: folder}; env: host id -> that host's own OMLX_* values. The
        hosts start at once; returns when each of them lists all of them in /api/fleet."""
        env = env or {}
        servers = [self._prepare(host, folders, env.get(host, {})) for host, folders in models.items()]
        with ThreadPoolExecutor(len(servers)) as starting:
            failures = [f for f in starting.map(_start, servers) if f]
        if failures:
            raise RuntimeError("a host did not start:\n" + "\n\n".join(failures))
        self.wait_joined()
        return self

    def _prepare(self, host_id: str, models: dict[str, Path], env: dict) -> Server:
        """As tests/conftest.py's serve() does, without starting: a Server this fleet always stops."""
        home = self.base / host_id
        (home / "models").mkdir(parents=True)
        shutil.copy(self.migrated_db, home / "omlx.sqlite3")
        for name, folder in models.items():
            (home / "models" / name).symlink_to(folder, target_is_directory=True)
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("OMLX_")}
        full_env = {**inherited, "OMLX_HOME": str(home), "OMLX_MODEL_DIRS": str(home / "models"),
                    "PYTHONUNBUFFERED": "1", "OMLX_SHUTDOWN_GRACE": "2", "OMLX_HOST_ID": host_id,
                    **TEST_SERVER_DEFAULTS, **self.env, **{k: str(v) for k, v in env.items()}}
        server = Server(home, free_port(), full_env)
        self.hosts[host_id] = server
        return server

    def wait_joined(self, timeout: float = JOIN_SECONDS) -> None:
        """Every live host lists exactly the live hosts in /api/fleet."""
        live = self.live()
        seen: dict[str, set[str]] = {}

        def joined() -> bool:
            for host, server in live.items():
                seen[host] = hosts_seen(server)
            return all(s == set(live) for s in seen.values())
        wait_until(joined, timeout, lambda: f"the hosts {sorted(live)} to see each other; they see {seen}")

    def wait_published(self, timeout: float = 10) -> None:
        """Every live host's view of every other one (/api/fleet) shows that host's models as its own
        /api/pool does (states and last uses): what a routing decision reads is current."""
        live = self.live()
        diff: list[str] = []

        def current() -> bool:
            own = {h: {m["id"]: (m["state"], m["last_access"]) for m in ask(s, "/api/pool").json()["models"]}
                   for h, s in live.items()}
            diff.clear()
            for viewer, server in live.items():
                for record in fleet_state(server)["hosts"]:
                    shown = {m["id"]: (m["state"], m["last_access"]) for m in record["snapshot"]["models"]}
                    if record["host"] in own and shown != own[record["host"]]:
                        diff.append(f"{viewer} sees {record['host']} as {shown}, it is {own[record['host']]}")
            return not diff
        wait_until(current, timeout, lambda: f"the fleet's records to be current: {diff}")

    def unload_all(self) -> None:
        """Every model on every live host unloaded (?host= names the host), and the fleet told."""
        for host, server in self.live().items():
            for model, state in states(server).items():
                if state == "loaded":
                    r = server.post(f"/api/models/{model}/unload?host={host}", {})
                    assert r.status_code == 200, (host, model, r.text)
        for host, server in self.live().items():
            wait_until(lambda s=server: all(v in ("unloaded", "failed") for v in states(s).values()), 20,
                       lambda s=server, h=host: f"{h} to unload everything: {states(s)}")
        self.wait_published()

    def kill(self, host_id: str) -> None:
        """kill -9: no goodbye to the fleet, its Redis record stays until the TTL."""
        server = self.hosts[host_id]
        os.killpg(server.proc.pid, signal.SIGKILL)
        server.proc.wait(10)
        server.stop()               # closes its log
        self.killed.add(host_id)

    def restart(self, host_id: str) -> Server:
        self.hosts[host_id].start()
        self.killed.discard(host_id)
        return self.hosts[host_id]

    def close(self) -> None:
        """SIGTERM to every live host at once; each must exit 0 (the ones this test killed are not asked)."""
        def stop(item: tuple[str, Server]) -> str | None:
            host, server = item
            try:
                code = server.stop()
            except AssertionError as e:      # it did not stop: Server.stop killed it
                return f"{host}: {e}"
            if code != 0 and host not in self.killed:
                return f"{host} exited {code}:\n{server.log_text()[-3000:]}"
            return None
        with ThreadPoolExecutor(max(1, len(self.hosts))) as stopping:
            problems = [p for p in stopping.map(stop, self.hosts.items()) if p]
        assert not problems, "\n\n".join(problems)

    def logs(self) -> str:
        return "\n".join(f"==== {h}\n{s.log_text()[-4000:]}" for h, s in self.hosts.items())


def _start(server: Server) -> str | None:
    """None when the server came up; else what went wrong (and the process is gone)."""
    try:
        server.start()
        return None
    except Exception as e:  # noqa: BLE001 - reported with the others, after each start finished
        if server.alive():
            os.killpg(server.proc.pid, signal.SIGKILL)
            server.proc.wait(10)
        server.stop()
        return f"{server.env['OMLX_HOST_ID']}: {e}"[-4000:]
