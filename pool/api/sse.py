"""A streamed answer as Django's response, the same for every dialect: its first event is taken
before the response starts (so a request refused by then gets its error envelope and status), and
any failure after that ends the stream with the dialect's error event, never a torn stream."""

from __future__ import annotations

from contextlib import aclosing
from typing import AsyncIterator

from django.http import StreamingHttpResponse

from .dialects import Dialect
from .errors import stream_error


async def event_stream(completion, events: AsyncIterator[bytes], dialect: Dialect, *,
                       content_type: str = "text/event-stream") -> StreamingHttpResponse:
    """The response for `events`, an async generator that holds `completion` in its `async with`.
    Its first event is taken here, inside that block, so a response dropped before it is sent
    still releases the lease."""
    try:
        first = await anext(events)
    except BaseException:
        await completion.aclose()
        raise
    return StreamingHttpResponse(_guarded(first, events, dialect), content_type=content_type,
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _guarded(first: bytes, events: AsyncIterator[bytes], dialect: Dialect) -> AsyncIterator[bytes]:
    async with aclosing(events):
        yield first
        try:
            async for event in events:
                yield event
        except Exception as e:  # noqa: BLE001 - the stream has begun: the client reads an error event
            yield stream_error(e, dialect)
