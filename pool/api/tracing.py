"""A route's trace (pool/traces): begun before the view runs, with the facts only the edge knows (the
path, the dialect, the key's name), and ended when the answer is: at once for a JSON answer, when
the last event has been sent (or the client went away) for a stream. The serving door and the
completion fill in the rest. With OMLX_TRACES=off the view runs as it did without any of this."""

from __future__ import annotations

import asyncio
import weakref
from contextlib import aclosing
from typing import AsyncIterator

from django.http import StreamingHttpResponse

from ..errors import PoolError
from ..runtime import get_runtime
from ..traces.trace import Trace, current
from .dialects import Dialect
from .errors import status_of

REQUEST_ID = "x-omlx-request-id"


def key_name(request) -> str | None:
    """The name of the key the request came with (pool.keys attaches it), or None."""
    return getattr(getattr(request, "omlx_key", None), "name", None)


async def run(view, request, args, kwargs, dialect: Dialect):
    traces = get_runtime().traces
    trace = traces.begin(route=request.path, dialect=dialect.name, key=key_name(request))
    if trace is None:
        return await view(request, *args, **kwargs)
    try:
        response = await view(request, *args, **kwargs)
    except PoolError as e:
        trace.note_error(e.code)
        traces.end(trace, status=status_of(e, dialect), request_body=_body(request, trace))
        raise
    except asyncio.CancelledError:
        trace.disconnected = True
        traces.end(trace, status=499, request_body=_body(request, trace))
        raise
    except BaseException:
        trace.note_error("internal_error")
        traces.end(trace, status=500, request_body=_body(request, trace))
        raise
    if trace.model is not None:
        response[REQUEST_ID] = trace.id
    if isinstance(response, StreamingHttpResponse) and response.is_async:
        trace.stream = True
        response.streaming_content = _until_sent(trace, response.streaming_content, request, response.status_code)
        # a response dropped before its stream began (the client left first) never runs _until_sent
        weakref.finalize(response, _dropped, traces, trace)
    else:
        traces.end(trace, status=response.status_code, request_body=_body(request, trace))
    return response


async def _until_sent(trace: Trace, events: AsyncIterator[bytes], request, status: int) -> AsyncIterator[bytes]:
    current.set(trace)      # the task that sends the stream: the error event's code lands on this trace
    traces = get_runtime().traces
    finished = False
    try:
        async with aclosing(events):
            async for event in events:
                yield event
        finished = True
    finally:
        if not finished:
            trace.disconnected = True
        traces.end(trace, status=status, request_body=_body(request, trace))


def _dropped(traces, trace: Trace) -> None:
    if trace.id in traces.in_flight:
        trace.disconnected = True
        traces.end(trace, status=499)


def _body(request, trace: Trace) -> bytes | None:
    """The request's body when its model keeps bodies (trace_body_bytes), else None."""
    if not trace.body_cap:
        return None
    try:
        return request.body
    except Exception:  # noqa: BLE001 - a body already read as a stream, or too large to keep
        return None
