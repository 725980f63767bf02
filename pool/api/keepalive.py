"""SSE keep-alives while a stream waits for its first token: a long prompt is read for seconds (or
minutes) before anything else can be sent, and a client with a read timeout would give up. The
route's generator waits for the engine's next chunk with a timeout (a timer on the event loop: the
engine thread is neither blocked nor polled) and, each time it runs out, sends a keep-alive event;
from the first chunk on, chunks pass straight through."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, TypeVar

T = TypeVar("T")

KEEPALIVE = object()          # what `until_first` yields in place of a chunk that is late


async def until_first(chunks: AsyncIterator[T], interval: float | None) -> AsyncIterator[T | object]:
    """`chunks`, with KEEPALIVE yielded every `interval` seconds until the first one arrives (no
    keep-alives when `interval` is None or 0). Closing or cancelling it cancels the wait, which
    ends the request in the engine as any other cancel does."""
    it = aiter(chunks)
    if interval:
        waiting = asyncio.ensure_future(anext(it))
        try:
            while True:
                done, _ = await asyncio.wait({waiting}, timeout=interval)
                if done:
                    break
                yield KEEPALIVE
        except BaseException:
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
            raise
        try:
            first = waiting.result()
        except StopAsyncIteration:
            return
        yield first
    async for chunk in it:
        yield chunk
