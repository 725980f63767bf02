"""The hop between hosts: the client's HTTP request, sent on to the host that serves it, and that host's
answer streamed back as it comes (SSE and NDJSON chunk by chunk). A client that goes away closes the
hop, and the serving host sees its own client go. The hop carries the fleet key and the name of the
host it came from; the client's own credentials stay here, where they were checked.

A host that goes silent for the read deadline (OMLX_HOP_READ_TIMEOUT) and does not answer /health
either is frozen (silence.py): before any of its answer reached the client the request is tried
elsewhere (HostGone); mid-stream the client gets the dialect's error event and the stream ends."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator, Awaitable, Callable

import httpx
from django.http import HttpResponse, StreamingHttpResponse

from ..errors import HostUnavailable
from .silence import Verdict, after_silence, health_seconds

log = logging.getLogger(__name__)

FORWARDED = "x-omlx-forwarded"     # the host the request entered the fleet at
FLEET_KEY = "x-omlx-fleet-key"
KEY_NAME = "x-omlx-key-name"       # the client's API key's name (pool/keys), believed only with the fleet key
HOST = "x-omlx-host"               # on every answer: the host that served it
# not passed on: hop-by-hop headers, what httpx sets itself, and the client's credentials
REQUEST_DROPPED = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "host",
                             "content-length", "proxy-authorization", "proxy-connection", "authorization",
                             "x-api-key", "cookie", FORWARDED, FLEET_KEY, KEY_NAME})
RESPONSE_DROPPED = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "date", "server",
                              "set-cookie"})
STREAM_TYPES = ("text/event-stream", "application/x-ndjson")
CONNECT_SECONDS = 3.0

_clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}


class HostGone(Exception):
    """The host did not answer, or its answer broke before any of it reached the client."""


class Frozen(Exception):
    """Silent past the read deadline, and no answer at /health either."""


class Hop:
    """One hop's reads, each bounded by the read deadline (None: unbounded) and a /health question."""

    def __init__(self, base_url: str, host_id: str, deadline: float | None):
        self.base_url, self.host_id, self.deadline = base_url, host_id, deadline

    async def read(self, step: Awaitable[Any], *, client_has_bytes: bool) -> Any:
        """`step`'s value; raises Frozen (the step cancelled) when the host goes silent and is frozen."""
        if not self.deadline:
            return await step
        waiting = asyncio.ensure_future(step)
        try:
            while True:
                done, _ = await asyncio.wait({waiting}, timeout=self.deadline)
                if done:
                    return waiting.result()
                verdict = after_silence(host_answers=await self.answers(), client_has_bytes=client_has_bytes)
                if verdict != Verdict.WAIT:
                    raise Frozen(f"{self.host_id} sent nothing for {self.deadline:g} s and did not answer /health "
                                 f"within {health_seconds(self.deadline):g} s")
        finally:
            if not waiting.done():
                waiting.cancel()
                await asyncio.gather(waiting, return_exceptions=True)

    async def answers(self) -> bool:
        """Any HTTP answer at all (a 503 too): its loop runs."""
        assert self.deadline is not None
        try:
            await client().get(self.base_url + "/health", timeout=health_seconds(self.deadline))
            return True
        except httpx.HTTPError:
            return False


def client() -> httpx.AsyncClient:
    """One pooled client per event loop (a test process runs several loops)."""
    loop = asyncio.get_running_loop()
    found = _clients.get(loop)
    if found is None or found.is_closed:
        found = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=CONNECT_SECONDS),
                                  limits=httpx.Limits(max_connections=None, max_keepalive_connections=32))
        _clients[loop] = found
    return found


def hop_headers(incoming, *, origin: str, fleet_key: str, key_name: str | None = None) -> dict[str, str]:
    headers = {k: v for k, v in incoming.items() if k.lower() not in REQUEST_DROPPED}
    headers[FORWARDED] = origin
    headers[FLEET_KEY] = fleet_key
    if key_name is not None:        # the serving host applies the key's limits and prompt cache scope
        headers[KEY_NAME] = key_name
    return headers


async def forward(request, base_url: str, host_id: str, *, origin: str, fleet_key: str,
                  stream_error, key_name: str | None = None, deadline: float | None = None) -> HttpResponse:
    """The serving host's answer. Raises HostGone while nothing has reached the client (the caller may
    try another host); after that, a broken or frozen hop ends the stream with `stream_error(error)`.
    `deadline`: the read deadline (OMLX_HOP_READ_TIMEOUT), None for none."""
    http = client()
    hop = Hop(base_url, host_id, deadline)
    outgoing = http.build_request(request.method, base_url + request.get_full_path(),
                                  headers=hop_headers(request.headers, origin=origin, fleet_key=fleet_key,
                                                      key_name=key_name),
                                  content=request.body)
    try:
        upstream = await hop.read(http.send(outgoing, stream=True), client_has_bytes=False)
    except httpx.TransportError as e:
        raise HostGone(f"{host_id}: {type(e).__name__}: {e}") from None
    except Frozen as e:
        raise HostGone(str(e)) from None
    chunks = upstream.aiter_raw()
    try:
        first = await hop.read(anext(chunks, b""), client_has_bytes=False)
    except (httpx.TransportError, Frozen) as e:
        await upstream.aclose()
        raise HostGone(f"{host_id} stopped before answering: {type(e).__name__}: {e}") from None
    headers = {k: v for k, v in upstream.headers.items() if k.lower() not in RESPONSE_DROPPED}
    content_type = upstream.headers.get("content-type", "")
    if not content_type.startswith(STREAM_TYPES):
        try:   # an answer sent whole reaches the client only once it is all here: until then, retry elsewhere
            body = [first]
            while chunk := await hop.read(anext(chunks, b""), client_has_bytes=False):
                body.append(chunk)
        except (httpx.TransportError, Frozen) as e:
            raise HostGone(f"{host_id} stopped while answering: {type(e).__name__}: {e}") from None
        finally:
            await upstream.aclose()
        response = HttpResponse(b"".join(body), status=upstream.status_code)
    else:
        response = StreamingHttpResponse(_relay(first, chunks, upstream, hop, stream_error),
                                         status=upstream.status_code)
    for name, value in headers.items():
        response[name] = value
    response[HOST] = upstream.headers.get(HOST, host_id)
    return response


async def _relay(first: bytes, chunks: AsyncIterator[bytes], upstream: httpx.Response, hop: Hop,
                 stream_error: Callable[[Exception], bytes]) -> AsyncIterator[bytes]:
    tail = first
    try:
        yield first
        while chunk := await hop.read(anext(chunks, b""), client_has_bytes=True):
            tail = chunk
            yield chunk
    except (httpx.TransportError, Frozen) as e:
        log.warning("the hop to %s broke mid-stream: %s", hop.host_id, e)
        separator = b"" if tail.endswith(b"\n\n") or tail.endswith(b"}\n") else b"\n\n"
        yield separator + stream_error(HostUnavailable(
            f"The host {hop.host_id} serving this request stopped answering.", retry_after=1))
    finally:
        await upstream.aclose()
