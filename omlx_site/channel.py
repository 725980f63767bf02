"""The HTTP/1.1 channel `serve` builds for each connection (omlx_site/server.py): Twisted's
HTTPChannel with the limits a server of long answers needs on top.

- The request line and headers must arrive within OMLX_HEADER_TIMEOUT of the request's first byte
  (Twisted's idle timeout restarts at every byte, so one byte a minute would hold a connection).
- A request line over Twisted's 16 KiB is answered 414, headers over it 431 (Twisted drops the first
  without a word and answers the second 400).
- A finished answer the client does not read is not kept: while any of it is unsent (in Twisted's
  buffer or the kernel's send queue), the connection is dropped (a reset, which frees both) once
  OMLX_IDLE_TIMEOUT passes without the client reading any of it. Without this, a client that never
  reads keeps its connection and up to megabytes of output per connection for as long as it likes.
  A connection that is not kept alive (`Connection: close`, HTTP/1.0) closes as soon as its client
  has taken the whole answer.
- One client address holds at most OMLX_MAX_CONNECTIONS_PER_CLIENT connections; a request on one
  more is answered 503 `too_many_connections` and the connection closed. The fleet's hosts
  (requests that carry the fleet key) are never refused."""

from __future__ import annotations

import fcntl
import hmac
import logging
import socket
import struct
import sys
import time
from collections import Counter
from dataclasses import dataclass

from twisted.web.http import HTTPChannel, _GenericHTTPChannelProtocol

from pool.api.auth import FLEET_KEY
from pool.api.dialects import for_path
from pool.api.errors import error_response
from pool.errors import Busy

log = logging.getLogger("pool")


def _bare(status: str) -> bytes:
    return f"HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode()


TIMED_OUT = _bare("408 Request Timeout")
URI_TOO_LONG = _bare("414 URI Too Long")
HEADERS_TOO_LARGE = _bare("431 Request Header Fields Too Large")
TOO_MANY_CONNECTIONS = "too_many_connections"
SO_NWRITE = 0x1024        # macOS: the bytes a socket has not sent yet
# how often a close that waits for its unread answer looks again (Connection: close, HTTP/1.0)
DRAIN_POLL_SECONDS = 0.05


@dataclass(frozen=True)
class Limits:
    header_timeout: float = 0       # seconds for a request line and headers; 0 = none
    idle_timeout: float = 0         # seconds of silence; for an unread answer, seconds without reading
    per_client: int = 0             # connections one address may hold; 0 = no cap
    fleet_key: str = ""


class Clients:
    """The open connections of each client address, for one listening server."""

    def __init__(self):
        self.open: Counter[str] = Counter()

    def add(self, address: str) -> int:
        self.open[address] += 1
        return self.open[address]

    def remove(self, address: str) -> None:
        self.open[address] -= 1
        if self.open[address] <= 0:
            del self.open[address]


def _later(seconds: float, call, *args):
    from twisted.internet import reactor  # here: serve installs Twisted's asyncio reactor first

    return reactor.callLater(seconds, call, *args)


def unsent(transport) -> int:
    """Bytes written to `transport` that its client has not taken yet: Twisted's buffer, and the
    kernel's send queue (sent but not acknowledged, or waiting for the client's window)."""
    held = (len(getattr(transport, "dataBuffer", b"")) - getattr(transport, "offset", 0)
            + getattr(transport, "_tempDataLen", 0))
    try:
        sock = transport.getHandle()
        if sys.platform.startswith("linux"):
            import termios

            held += struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
        elif sys.platform == "darwin":
            held += sock.getsockopt(socket.SOL_SOCKET, SO_NWRITE)
    except (AttributeError, OSError, ValueError):
        pass   # not a socket, or closed: Twisted's buffer is all there is to count
    return held


class SiteChannel(HTTPChannel):
    def __init__(self, limits: Limits, clients: Clients):
        super().__init__()
        self.limits, self.clients = limits, clients
        self._address: str | None = None
        self._deadline = None        # the header timeout's call
        self._headers_done = False
        self._drain = None           # the unread answer's check
        self._close_pending = False  # closing waits for the unread answer's check
        self._refused = False

    # ---- the header deadline ---------------------------------------------------------------------

    def connectionMade(self):
        super().connectionMade()
        self._address = getattr(self.transport.getPeer(), "host", None)
        if self._address is not None:
            self.clients.add(self._address)
        self._arm()

    def dataReceived(self, data):
        if self._deadline is None and not self._headers_done:
            self._arm()
        super().dataReceived(data)

    def _arm(self):
        if self.limits.header_timeout:
            self._deadline = _later(self.limits.header_timeout, self._answer_and_close, TIMED_OUT)

    def _disarm(self):
        if self._deadline is not None and self._deadline.active():
            self._deadline.cancel()
        self._deadline = None

    def _answer_and_close(self, answer: bytes) -> None:
        self._disarm()
        if self.transport is not None:
            self.transport.write(answer)
            self.loseConnection()

    # ---- sizes: 414 and 431 instead of a dropped connection or a 400 -----------------------------

    def _on_request_line(self) -> bool:
        return bool(getattr(self, "_HTTPChannel__first_line", 0))

    def lineLengthExceeded(self, line):
        self._answer_and_close(URI_TOO_LONG if self._on_request_line() else HEADERS_TOO_LARGE)

    def lineReceived(self, line):
        if self._receivedHeaderSize + len(line) > self.totalHeadersSize:
            self._answer_and_close(URI_TOO_LONG if self._on_request_line() else HEADERS_TOO_LARGE)
            return
        super().lineReceived(line)

    # ---- the connection cap ----------------------------------------------------------------------

    def allHeadersReceived(self):
        self._headers_done = True
        self._disarm()
        super().allHeadersReceived()
        cap = self.limits.per_client
        if cap and self._address is not None and self.clients.open[self._address] > cap \
                and not self._from_the_fleet(self.requests[-1]):
            self._refuse(cap)

    def _from_the_fleet(self, request) -> bool:
        key = self.limits.fleet_key
        given = (request.requestHeaders.getRawHeaders(FLEET_KEY.encode()) or [b""])[0]
        return bool(key) and hmac.compare_digest(given, key.encode())

    def _refuse(self, cap: int) -> None:
        self._refused = True
        path = self._path.decode("latin-1").split("?", 1)[0]
        error = Busy(f"This client address holds {cap} connections to the server already "
                     "(OMLX_MAX_CONNECTIONS_PER_CLIENT); close one, or reuse it.",
                     code=TOO_MANY_CONNECTIONS, retry_after=1)
        response = error_response(error, for_path(path))
        head = [f"HTTP/1.1 {response.status_code} {response.reason_phrase}",
                *(f"{k}: {v}" for k, v in response.items()),
                f"Content-Length: {len(response.content)}", "Connection: close"]
        self._answer_and_close("\r\n".join(head).encode("latin-1") + b"\r\n\r\n" + response.content)

    def allContentReceived(self):
        if not self._refused:
            super().allContentReceived()

    # ---- an answer the client does not read ------------------------------------------------------

    def requestDone(self, request):
        self._headers_done = False
        # before Twisted closes a connection that is not kept alive: that close waits for the check
        if self.limits.idle_timeout and self._drain is None and (left := unsent(self.transport)):
            self._watch(left, time.monotonic())
        super().requestDone(request)

    def _watch(self, left: int, since: float) -> None:
        # a close waits for the client to take the whole answer (once the socket is closed, the
        # kernel keeps an unread answer as long as the client likes and nothing here can drop it)
        self._drain = _later(DRAIN_POLL_SECONDS, self._check, left, since)

    def _check(self, before: int, since: float) -> None:
        self._drain = None
        if self.transport is None:
            return
        left, now = unsent(self.transport), time.monotonic()
        if not left:
            if self._close_pending:
                super().loseConnection()
        elif left < before:
            self._watch(left, now)          # the client reads, however slowly
        elif now - since < self.limits.idle_timeout:
            self._watch(left, since)
        else:
            log.info("dropping a connection whose client read none of the %d bytes left of its answer for %gs "
                     "(OMLX_IDLE_TIMEOUT)", left, self.limits.idle_timeout)
            self.transport.abortConnection()

    def loseConnection(self):
        if self._drain is not None:
            self._close_pending = True
        else:
            super().loseConnection()

    def timeoutConnection(self):
        if self._drain is not None:
            self._close_pending = True   # silent and not reading: the check ends it
        else:
            super().timeoutConnection()

    def connectionLost(self, reason):
        self._disarm()
        if self._drain is not None and self._drain.active():
            self._drain.cancel()
        self._drain = None
        if self._address is not None:
            self.clients.remove(self._address)
            self._address = None
        super().connectionLost(reason)


def channel(limits: Limits, clients: Clients) -> _GenericHTTPChannelProtocol:
    return _GenericHTTPChannelProtocol(SiteChannel(limits, clients))
