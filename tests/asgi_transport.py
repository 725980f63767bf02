"""An ASGI application served on an event loop in a background thread, and an httpx (or httpx2)
transport that reaches it: it streams response bodies and tells the application its client left
(`http.disconnect`) when a response is closed early or a read times out (httpx's own ASGITransport
buffers whole responses). tests/inprocess.py serves the site through it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import queue
import threading
import traceback
from concurrent import futures


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
