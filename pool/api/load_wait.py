"""A streamed request that waits for its model to load: once the wait passes the keep-alive interval
(OMLX_SSE_KEEPALIVE) while the model is loading, the stream begins with a progress comment
(`: loading tiny 45% (1.2 GB of 2.7 GB), ~3 s left`) and sends another every interval until the
model is opened. Every SSE reader skips comments. A wait that is not on a load (a slot, the gate)
sends nothing: its status is still to be decided. A refusal that ends a wait on a loading model
says how far the load got; after the stream has begun it is the dialect's error event.

Ollama's NDJSON streams get no progress lines: the `ollama` client builds a ChatResponse from every
line, and one without `message` fails its validation."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Awaitable, Callable

from ..errors import PoolError
from ..policy.load_progress import describe
from ..runtime import get_runtime


def load_note(name: str) -> str | None:
    """How far the model `name` is loaded on this host, when it is loading; None otherwise."""
    try:
        model = get_runtime().router.resolve(name).model
    except PoolError:
        return None
    progress = getattr(model, "load_progress", None)
    return describe(model.id, progress) if progress else None


def noted(error: PoolError, note: str | None) -> PoolError:
    """The error, its message saying how far the load it ended a wait for had got."""
    if note and note not in error.message:
        error.message = f"{error.message} ({note} when the wait ended)"
        error.args = (error.message,)
    return error


async def opening(opener: Awaitable[Any], name: str) -> Any:
    """Await the opener (the router's generate); a refusal names how far the model's load got."""
    try:
        return await opener
    except PoolError as e:
        raise noted(e, load_note(name)) from None


async def stream_after_load(opener: Awaitable[Any], frame: Callable[[Any], AsyncIterator[bytes]], *,
                            name: str, interval: float | None,
                            comment: Callable[[str], bytes]) -> AsyncIterator[bytes]:
    """The stream of the completion `opener` gives, framed by `frame` (which holds it in its
    `async with`), with a progress comment each `interval` the model spends loading first. Closing
    the stream while it waits cancels the wait (the lease's waiters unwind as on any disconnect)."""
    task = asyncio.ensure_future(opener)
    note = None
    try:
        while interval:
            done, _ = await asyncio.wait({task}, timeout=interval)
            if done:
                break
            if (current := load_note(name)) is not None:
                note = current
                yield comment(current)
    except BaseException:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if task.done() and not task.cancelled() and task.exception() is None:
            await task.result().aclose()     # it opened as the client left
        raise
    try:
        completion = await task
    except PoolError as e:
        raise noted(e, note or load_note(name)) from None
    events = frame(completion)
    try:
        async for event in events:
            yield event
    finally:
        await events.aclose()
        await completion.aclose()       # when `frame` never started, its `async with` never ran


def sse_comment(note: str) -> bytes:
    return f": {note}\n\n".encode()
