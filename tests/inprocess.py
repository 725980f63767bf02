"""The site in this process: `InProcessServer` answers like conftest's `Server` (a Daphne subprocess)
but runs `omlx_site.asgi.application` on an event loop in a background thread, over the real models.

httpx (and the official clients, through `http_client=`, with httpx2, their fork of httpx) reach it
through tests/asgi_transport.py, which streams response bodies and sends `http.disconnect` when a
response is closed early.

Django's settings, the OMLX_* settings and the runtime are process-wide, so one in-process server
is active at a time: starting another suspends the active one (its runtime stops; its data folder
stays), and a suspended server starts again the next time a test uses it."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import threading
from pathlib import Path

import httpx
import httpx2

from tests.asgi_transport import Application, LoopThread, transport_class
from tests.conftest import TEST_SERVER_DEFAULTS, ServerCalls, free_port

ACTIVE: InProcessServer | None = None     # the server whose runtime and settings are the process's now
SWITCH = threading.RLock()               # held while a server becomes active or stops being it
STOP_SECONDS = 60


def _close_database_connections() -> None:
    from django.db import connections

    connections.close_all()


class InProcessServer(ServerCalls):
    """conftest.Server's interface, served by this process (see the module's docstring)."""

    def __init__(self, home: Path, migrated_db: Path, models: dict, env: dict):
        (home / "models").mkdir(parents=True)
        shutil.copy(migrated_db, home / "omlx.sqlite3")
        for name, folder in models.items():
            (home / "models" / name).symlink_to(folder, target_is_directory=True)
        self.home, self.port = home, free_port()     # no socket: the port only names the server
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {"OMLX_HOME": str(home), "OMLX_MODEL_DIRS": str(home / "models"), **TEST_SERVER_DEFAULTS,
                    **{k: str(v) for k, v in env.items()}}
        self.log_path = home / "server.log"
        self.loop_thread: LoopThread | None = None
        self.application: Application | None = None
        self._saved: dict | None = None
        self._log_handler: logging.Handler | None = None

    # ---- lifecycle ------------------------------------------------------------------------------

    def start(self) -> InProcessServer:
        """Make this the active server, suspending the one that was."""
        with SWITCH:
            if ACTIVE is not None and ACTIVE is not self:
                ACTIVE._deactivate()
            if ACTIVE is not self:
                self._activate()
        return self

    def stop(self, timeout: float = STOP_SECONDS) -> int:
        """Stop the runtime (its engines, enforcer and database writes) and the loop; 0 when all ended
        cleanly, as Daphne's exit status (anything else raises)."""
        with SWITCH:
            if ACTIVE is self:
                self._deactivate(timeout)
            if self.loop_thread is not None:
                self.loop_thread.close()
                self.loop_thread = None
        return 0

    def _ensure_active(self) -> None:
        """A suspended server starts again when a test uses it, unless another one is active."""
        if ACTIVE is self:
            return
        with SWITCH:
            if ACTIVE is None:
                self._activate()
            elif ACTIVE is not self:
                raise RuntimeError(f"another in-process server ({ACTIVE.url}) is active: stop it before "
                                   f"using {self.url}")

    def _activate(self) -> None:
        global ACTIVE
        from asgiref.sync import sync_to_async
        from channels.layers import get_channel_layer
        from django.conf import settings
        from django.db import connections

        from omlx_site.asgi import application
        from pool import conf, runtime
        from pool.management.commands.serve import Command

        if self.loop_thread is None:
            self.loop_thread = LoopThread()
            self.application = Application(application, self.loop_thread, server=("127.0.0.1", self.port))
        self._saved = {"env": {k: v for k, v in os.environ.items() if k.startswith("OMLX_")},
                       "allowed_hosts": list(settings.ALLOWED_HOSTS),
                       "database": connections.settings["default"]["NAME"],
                       "switch_interval": sys.getswitchinterval()}
        ACTIVE = self
        for key in self._saved["env"]:
            del os.environ[key]
        os.environ.update(self.env)
        conf.reload_settings()
        # as `serve` does: this host's names, no `testserver`
        Command._adopt_host(conf.get_settings().host, conf.get_settings().port)
        sys.setswitchinterval(conf.get_settings().switch_interval)     # and its GIL hand-over
        self._log_handler = logging.FileHandler(self.log_path)
        self._log_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger().addHandler(self._log_handler)

        async def start():
            await sync_to_async(_close_database_connections)()   # the thread background writes use
            connections.settings["default"]["NAME"] = str(self.home / "omlx.sqlite3")
            await runtime.reset_runtime()
            await get_channel_layer().flush()
            started = runtime.get_runtime()
            await started.start()
            return started.failure
        _close_database_connections()
        try:
            failure = self.loop_thread.run(start())
            if failure:
                raise RuntimeError(f"the runtime did not start: {failure}\n{self.log_text()[-3000:]}")
        except BaseException:
            self._deactivate()
            raise

    def _deactivate(self, timeout: float = STOP_SECONDS) -> None:
        global ACTIVE
        from asgiref.sync import sync_to_async
        from channels.layers import get_channel_layer
        from django.conf import settings
        from django.db import connections

        from pool import conf, runtime

        async def stop():
            await runtime.reset_runtime()
            await get_channel_layer().flush()
            await sync_to_async(_close_database_connections)()
        try:
            try:
                self.application.finish(timeout)
            finally:   # the runtime stops whatever happened: the next server must not find it
                self.loop_thread.run(stop(), timeout)
        finally:
            _close_database_connections()
            connections.settings["default"]["NAME"] = self._saved["database"]
            settings.ALLOWED_HOSTS = self._saved["allowed_hosts"]
            sys.setswitchinterval(self._saved["switch_interval"])
            for key in [k for k in os.environ if k.startswith("OMLX_")]:
                del os.environ[key]
            os.environ.update(self._saved["env"])
            conf.reload_settings()
            logging.getLogger().removeHandler(self._log_handler)
            self._log_handler.close()
            ACTIVE = None

    # ---- what tests call (conftest.Server's interface) ------------------------------------------

    def alive(self) -> bool:
        return self.loop_thread is not None and self.loop_thread.thread.is_alive()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def http(self, **kw) -> httpx.Client:
        """A new client for this server (the caller closes it); base_url is the server's."""
        return self._client(httpx, **kw)

    def _client(self, http, **kw):
        self._ensure_active()
        return http.Client(transport=transport_class(http)(self.application, before=self._ensure_active),
                           base_url=self.url, **kw)

    def fetch(self, method: str, path: str, **kw) -> httpx.Response:
        """One request, without the server's key (httpx.request's arguments)."""
        with self.http() as client:
            return client.request(method, path, **kw)

    @contextlib.contextmanager
    def stream_request(self, method: str, path: str, **kw):
        """httpx.stream against this server, without its key."""
        with self.http() as client, client.stream(method, path, **kw) as response:
            yield response

    def get(self, path: str, **kw) -> httpx.Response:
        return self.fetch("GET", path, headers={**self.headers, **kw.pop("headers", {})}, timeout=120, **kw)

    def post(self, path: str, body=None, **kw) -> httpx.Response:
        if body is not None:
            kw["json"] = body
        return self.fetch("POST", path, headers={**self.headers, **kw.pop("headers", {})}, timeout=120, **kw)

    def websocket_status(self, *, origin: str | None, headers: dict | None = None, path: str = "/ws/pool/") -> int:
        """A websocket handshake through the application: 101 when it accepts, 403 when it closes
        first (what Daphne answers then)."""
        from channels.testing import WebsocketCommunicator

        self._ensure_active()
        raw = [(b"host", f"127.0.0.1:{self.port}".encode())]
        raw += [(b"origin", origin.encode())] if origin else []
        raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]

        async def handshake() -> int:
            communicator = WebsocketCommunicator(self.application.app, path, headers=raw)
            communicator.scope["client"] = ["127.0.0.1", next(self.application.ports)]   # Daphne sets the peer
            communicator.scope["server"] = ["127.0.0.1", self.port]
            accepted, _ = await communicator.connect(timeout=10)
            await communicator.disconnect()
            return 101 if accepted else 403
        return self.loop_thread.run(handshake())

    def openai(self, **kw):
        from openai import OpenAI
        kw.setdefault("api_key", self.env.get("OMLX_API_KEY") or "none")
        kw.setdefault("max_retries", 0)
        return OpenAI(base_url=self.url + "/v1", timeout=120, http_client=self._client(httpx2, timeout=120), **kw)

    def anthropic(self, **kw):
        from anthropic import Anthropic
        kw.setdefault("api_key", self.env.get("OMLX_API_KEY") or "none")
        kw.setdefault("max_retries", 0)
        return Anthropic(base_url=self.url, timeout=120, http_client=self._client(httpx2, timeout=120), **kw)

