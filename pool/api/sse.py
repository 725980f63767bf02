"""A streamed answer as Django's response: shared by the OpenAI and Anthropic routes."""

from __future__ import annotations

from django.http import StreamingHttpResponse


async def event_stream(completion, events) -> StreamingHttpResponse:
    """The response for `events`, an async generator that holds `completion` in its `async with`.
    Its first event is taken here, inside that block, so a response dropped before it is sent
    still releases the lease."""
    try:
        first = await events.__anext__()
    except BaseException:
        await completion.aclose()
        raise
    return StreamingHttpResponse(_prepend(first, events), content_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _prepend(first, rest):
    yield first
    async for item in rest:
        yield item
