"""Daphne as `serve` runs it: connection limits, and a graceful stop on SIGTERM or SIGINT.

Limits: Twisted closes a connection that stays silent for OMLX_IDLE_TIMEOUT while its request is
read or between requests (never while the answer is generated, so long streams are safe); the rest
(the header deadline, 414/431, an answer left unread, connections per client) is omlx_site/channel.py.

Stop: stop listening, refuse new requests on open connections (503 `server_shutting_down`), let
the running ones finish for OMLX_SHUTDOWN_GRACE seconds, then end the rest with an error (a 503
envelope for those that sent nothing yet, omlx_site/inflight.py; an error chunk for streams, as
the engines abort their requests; whatever still runs a moment later is ended by inflight.py too),
then stop the reactor, whose shutdown stops the runtime. A second signal skips the wait, a third
exits at once."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal

from daphne.server import Server
from twisted.internet import defer, reactor

from .channel import Clients, Limits, channel
from .inflight import SHUTTING_DOWN

log = logging.getLogger("pool")

# after the grace: how long the engines' aborts may take to reach the clients, then the fallback's
SETTLE_SECONDS = 2.0


class OmlxServer(Server):
    """Daphne's server, keeping its listening ports (to stop listening first on shutdown) and
    building its HTTP connections with the limits of omlx_site/channel.py."""

    def __init__(self, *args, limits: Limits, **kwargs):
        super().__init__(*args, **kwargs)
        self.limits, self.clients = limits, Clients()
        self.ports = []

    def listen_success(self, port):
        # run() has built the HTTP factory by now, and no connection has been accepted yet
        self.http_factory.timeOut = self.limits.idle_timeout or None
        self.http_factory.protocol = functools.partial(channel, self.limits, self.clients)
        self.ports.append(port)
        super().listen_success(port)

    async def stop_listening(self) -> None:
        ports, self.ports = self.ports, []
        await asyncio.gather(*(defer.maybeDeferred(port.stopListening).asFuture(asyncio.get_running_loop())
                               for port in ports), return_exceptions=True)


class GracefulStop:
    """The signal handlers: the first SIGTERM or SIGINT starts the stop, a second skips the grace,
    a third exits at once (SQLite keeps every committed write through that)."""

    def __init__(self, *, server: OmlxServer, in_flight, runtime, grace: float):
        self.server, self.in_flight, self.runtime, self.grace = server, in_flight, runtime, grace
        self.hurry = asyncio.Event()
        self.task: asyncio.Task | None = None

    def install(self) -> None:
        loop = asyncio.get_event_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.signal)

    def signal(self) -> None:
        if self.task is None:
            self.task = asyncio.ensure_future(self.run())
        elif not self.hurry.is_set():
            log.warning("stopping now: running requests are ended without their grace")
            self.hurry.set()
        else:
            log.warning("stopping at once")
            os._exit(1)

    async def run(self) -> None:
        try:
            await self.drain()
        except Exception:
            log.exception("the graceful stop failed; stopping now")
        finally:
            if reactor.running:
                reactor.stop()

    async def drain(self) -> None:
        self.in_flight.draining = True
        await self.server.stop_listening()
        if self.in_flight.count:
            log.info("stopping: %d request(s) in flight; they have %gs to finish (OMLX_SHUTDOWN_GRACE)",
                     self.in_flight.count, self.grace)
        else:
            log.info("stopping: no request in flight")
        if await self.in_flight.wait_idle(self.grace, self.hurry):
            return
        log.warning("stopping: ending %d request(s) still running", self.in_flight.count)
        # those that sent nothing get the 503 envelope at once (a queued one must not take the slot
        # a stream frees); streams get their error chunk from their own view as the engines abort
        self.in_flight.end_all(unanswered_only=True)
        self.runtime.end_requests("the server is shutting down", SHUTTING_DOWN)
        if await self.in_flight.wait_idle(SETTLE_SECONDS):
            return
        self.in_flight.end_all()
        await self.in_flight.wait_idle(SETTLE_SECONDS)
