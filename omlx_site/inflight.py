"""ASGI middleware around the HTTP application: the requests in flight, so that a shutdown can
refuse new ones, wait for the running ones, and end those left with the API's error.

Ending a request tells Django its client has gone (`http.disconnect`: the view's generators close
and the engine drops the request, the same path as a real disconnect), then answers the client
itself: the error envelope when nothing was sent yet, an SSE error event (and `[DONE]` on OpenAI's
streams) inside a stream, or an NDJSON `{"error": ...}` line inside one of Ollama's.

When the last request in flight ends, freed heap memory goes back to the system (heap.py)."""

from __future__ import annotations

import asyncio
import time

from pool.api.dialects import for_path
from pool.api.errors import error_response, stream_error
from pool.errors import Busy

from .heap import HeapTrim

SHUTTING_DOWN = "server_shutting_down"
RETRY_AFTER = 5


def shutdown_error() -> Busy:
    return Busy("The server is shutting down; retry in a moment.", code=SHUTTING_DOWN, retry_after=RETRY_AFTER)


def closing_messages(*, started: bool, sse: bool, path: str) -> list[dict]:
    """The ASGI messages that end a request the server will not finish."""
    dialect = for_path(path)
    error = shutdown_error()
    if not started:
        response = error_response(error, dialect)
        headers = [(k.lower().encode(), v.encode()) for k, v in response.items()] + [(b"connection", b"close")]
        return [{"type": "http.response.start", "status": response.status_code, "headers": headers},
                {"type": "http.response.body", "body": response.content}]
    if sse:
        body = stream_error(error, dialect)
        return [{"type": "http.response.body", "body": body}]
    return [{"type": "http.response.body", "body": b""}]


class _Request:
    def __init__(self, path: str):
        self.path = path
        self.started = self.sse = self.finished = False
        self.ending = asyncio.Event()

    def wrap_receive(self, receive):
        async def wrapped():
            if self.ending.is_set():
                return {"type": "http.disconnect"}
            message = asyncio.ensure_future(receive())
            ending = asyncio.ensure_future(self.ending.wait())
            try:
                await asyncio.wait({message, ending}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                ending.cancel()
                if not message.done():
                    message.cancel()
            if message.done() and not message.cancelled():
                return message.result()
            return {"type": "http.disconnect"}
        return wrapped

    def wrap_send(self, send):
        async def wrapped(message):
            if self.ending.is_set():
                return   # the view was told its client left; closing_messages answers instead
            if message["type"] == "http.response.start":
                self.started = True
                content_type = dict(message.get("headers") or []).get(b"content-type", b"")
                # a stream: SSE, or NDJSON (Ollama's); its dialect's error line ends it
                self.sse = content_type.lower().startswith((b"text/event-stream", b"application/x-ndjson"))
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                self.finished = True
            await send(message)
        return wrapped


class InFlight:
    def __init__(self, app, *, heap: HeapTrim | None = None):
        self.app = app
        self.draining = False
        self._requests: set[_Request] = set()
        self.heap = heap or HeapTrim()    # freed memory goes back to the system when requests drain

    @property
    def count(self) -> int:
        return len(self._requests)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.draining:
            for message in closing_messages(started=False, sse=False, path=scope["path"]):
                await send(message)
            return
        request = _Request(scope["path"])
        self._requests.add(request)
        self.heap.busy()
        try:
            await self.app(scope, request.wrap_receive(receive), request.wrap_send(send))
        finally:
            self._requests.discard(request)
            if not self._requests:
                self.heap.idle()
        if request.ending.is_set() and not request.finished:
            for message in closing_messages(started=request.started, sse=request.sse, path=request.path):
                await send(message)

    def end_all(self, *, unanswered_only: bool = False) -> int:
        """End the requests in flight (see the module's docstring), or only those that have sent
        nothing yet (queued, reading their prompt, or generating a whole answer); returns how many."""
        ending = [r for r in self._requests if not (unanswered_only and r.started)]
        for request in ending:
            request.ending.set()
        return len(ending)

    async def wait_idle(self, timeout: float, hurry: asyncio.Event | None = None) -> bool:
        """True once no request is in flight; False after `timeout` seconds, or when `hurry` is set."""
        deadline = time.monotonic() + timeout
        while self._requests and time.monotonic() < deadline and not (hurry and hurry.is_set()):
            await asyncio.sleep(0.05)
        return not self._requests
