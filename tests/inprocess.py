"""The site in this process: `InProcessServer` answers like conftest's `Server` (a Daphne subprocess)
but runs `omlx_site.asgi.application` on an event loop in a background thread, over the real models.

httpx (and the official clients, through `http_client=`, with httpx2, their fork of httpx) reach it
through `transport_class` below, which streams response bodies and tells the application its client
left (`http.disconnect`) when a response is closed early or a read times out: httpx's own
ASGITransport buffers whole responses.

Django's settings, the OMLX_* settings and the runtime are process-wide, so one in-process server
is active at a time: starting another suspends the active one (its runtime stops; its data folder
stays), and a suspended server starts again the next time a test uses it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import queue
import shutil
import sys
import threading
import traceback
from concurrent import futures
from pathlib import Path

import httpx
import httpx2

from tests.conftest import ServerCalls, free_port

ACTIVE: InProcessServer | None = None     # the server whose runtime and settings are the process's now
SWITCH = threading.RLock()               # held while a server becomes active or stops being it
STOP_SECONDS = 60


class LoopThread:
    """An asyncio event loop running in a daemon thread; `run()` waits for a coroutine on it."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="asgi-loop", daemon=True)
        self.thread.start()

    def run(self, coroutine, timeout: float = 120):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        async def finish():
            leftover = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in leftover:
                task.cancel()
            await asyncio.gather(*leftover, return_exceptions=True)
            await self.loop.shutdown_asyncgens()
            await self.loop.shutdown_default_executor()
        self.run(finish())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class _Exchange:
    """One request through the application on the loop; its messages come back through a queue."""

    def __init__(self, app, loop: asyncio.AbstractEventLoop, scope: dict, body: bytes):
        self.loop = loop
        self.messages: queue.Queue = queue.Queue()
        self._left = False                      # the client has gone (set on the loop)
        self._left_event: asyncio.Event | None = None
        self.future = asyncio.run_coroutine_threadsafe(self._run(app, scope, body), loop)

    async def _run(self, app, scope: dict, body: bytes) -> None:
        self._left_event = asyncio.Event()
        if self._left:
            self._left_event.set()
        body_sent = False

        async def receive():
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await self._left_event.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            self.messages.put(message)

        try:
            await app(scope, receive, send)
        except Exception as e:  # noqa: BLE001 - answered as Daphne does (a 500, or a cut connection)
            self.messages.put(e)
        finally:
            self.messages.put(None)

    def leave(self) -> None:
        """The client is gone: what Daphne sends when a connection closes."""
        def left():
            self._left = True
            if self._left_event is not None:
                self._left_event.set()
        with contextlib.suppress(RuntimeError):    # the loop has closed: nothing is left to tell
            self.loop.call_soon_threadsafe(left)

    def next(self, timeout: float | None):
        """The application's next message (None once it returned, or the exception it raised); a
        client that stops waiting closes its connection (then queue.Empty)."""
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            self.leave()
            raise


class Application:
    """The ASGI application served on a loop thread, and the requests it is answering."""

    def __init__(self, app, loop_thread: LoopThread, *, server: tuple[str, int]):
        self.app, self.loop_thread, self.server = app, loop_thread, server
        self.ports = itertools.count(40000)   # the clients' (loopback)
        self._lock = threading.Lock()
        self._exchanges: set[_Exchange] = set()

    def open(self, request) -> _Exchange:
        """Start answering an httpx (or httpx2) request, its body sent whole."""
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                 "method": request.method, "scheme": request.url.scheme, "path": request.url.path,
                 "raw_path": request.url.raw_path.split(b"?")[0], "query_string": request.url.query,
                 "root_path": "", "headers": [(k.lower(), v) for k, v in request.headers.raw],
                 "client": ("127.0.0.1", next(self.ports)), "server": self.server}
        exchange = _Exchange(self.app, self.loop_thread.loop, scope, request.read())
        with self._lock:
            self._exchanges.add(exchange)
        exchange.future.add_done_callback(lambda _: self._forget(exchange))
        return exchange

    def _forget(self, exchange: _Exchange) -> None:
        with self._lock:
            self._exchanges.discard(exchange)

    def finish(self, timeout: float) -> None:
        """Wait for every request to end; those still running after `timeout` are told their client
        left, and must then end too (a request that ignores it is a bug)."""
        with self._lock:
            running = {e.future: e for e in self._exchanges}
        _, pending = futures.wait(running, timeout)
        for future in pending:
            running[future].leave()
        _, pending = futures.wait(pending, 10)
        assert not pending, f"{len(pending)} request(s) never ended, their client gone or not"


@functools.cache
def transport_class(http):
    """The transport into an Application for `http`: httpx, or httpx2 (the fork the official openai
    and anthropic clients take). Response bodies stream; closing one before its end, or a read that
    times out, tells the application its client left (Daphne's http.disconnect). An application error
    before the response starts is a 500 with the traceback, after it a cut connection, as with Daphne."""

    class Body(http.SyncByteStream):
        def __init__(self, exchange: _Exchange, timeout: float | None, request):
            self.exchange, self.timeout, self.request = exchange, timeout, request

        def __iter__(self):
            while True:
                message = _next(self.exchange, self.timeout, self.request)
                if message is None or isinstance(message, Exception):
                    raise http.RemoteProtocolError("the application ended without finishing its response",
                                                   request=self.request) from message
                if message["type"] == "http.response.body":
                    if message.get("body") and self.request.method != "HEAD":
                        yield message["body"]
                    if not message.get("more_body", False):
                        return

        def close(self) -> None:
            self.exchange.leave()   # harmless after the end; before it, the view's generators close

    def _next(exchange: _Exchange, timeout: float | None, request):
        try:
            return exchange.next(timeout)
        except queue.Empty:
            raise http.ReadTimeout(f"no answer within {timeout} s", request=request) from None

    class Transport(http.BaseTransport):
        def __init__(self, application: Application, before=None):
            self.application, self.before = application, before

        def handle_request(self, request):
            if self.before is not None:
                self.before()
            timeout = (request.extensions.get("timeout") or {}).get("read")
            exchange = self.application.open(request)
            message = _next(exchange, timeout, request)
            if message is None or isinstance(message, Exception):
                text = "".join(traceback.format_exception(message)) if message else "no response"
                return http.Response(500, text=text, request=request)
            assert message["type"] == "http.response.start", message
            return http.Response(message["status"], headers=message.get("headers") or [],
                                 stream=Body(exchange, timeout, request), request=request)

    return Transport


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
        self.env = {"OMLX_HOME": str(home), "OMLX_MODEL_DIRS": str(home / "models"),
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
        Command._adopt_host(conf.get_settings().host)   # as `serve` does: this host's names, no `testserver`
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
        kw.setdefault("max_retries", 0)
        return OpenAI(base_url=self.url + "/v1", api_key=self.env.get("OMLX_API_KEY") or "none", timeout=120,
                      http_client=self._client(httpx2, timeout=120), **kw)

    def anthropic(self, **kw):
        from anthropic import Anthropic
        kw.setdefault("api_key", self.env.get("OMLX_API_KEY") or "none")
        kw.setdefault("max_retries", 0)
        return Anthropic(base_url=self.url, timeout=120, http_client=self._client(httpx2, timeout=120), **kw)

