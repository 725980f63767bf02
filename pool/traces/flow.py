"""The trace's hooks on the serving path (pool/serving): the chunks a request's trace reads, and an
operator's cancel turned into the request's error. Plain asyncio, no Django."""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from typing import AsyncIterator, TypeVar

from ..errors import Busy
from ..policy.kv import kv_estimate
from .trace import CANCELLED, Trace

T = TypeVar("T")


def cancelled_error() -> Busy:
    return Busy("The request was cancelled by an operator.", code=CANCELLED, retry_after=1)


def was_cancelled(trace: Trace | None, error: BaseException) -> bool:
    """Whether `error` is an operator's cancel of this request (not the client going away): then
    the task is uncancelled, so the request can end with its error."""
    if trace is None or not trace.cancelled or not isinstance(error, asyncio.CancelledError):
        return False
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()
    return True


async def traced(trace: Trace, chunks: AsyncIterator[T]) -> AsyncIterator[T]:
    """`chunks`, each read into the trace. While it waits for the engine its task is the trace's,
    so a cancel interrupts the wait: the engine's generator ends as for a client that went away
    (its request leaves the batch before the next step) and this raises `request_cancelled`."""
    async with aclosing(chunks) as it:
        while True:
            if trace.cancelled:
                trace.note_error(CANCELLED)
                raise cancelled_error()
            trace.task = asyncio.current_task()
            try:
                chunk = await anext(it)
            except StopAsyncIteration:
                return
            except asyncio.CancelledError as e:
                if was_cancelled(trace, e):
                    trace.note_error(CANCELLED)
                    raise cancelled_error() from None
                raise
            except Exception as e:
                trace.note_error(getattr(e, "code", None) or "engine_error")
                raise
            finally:
                trace.task = None
            trace.chunk(chunk)
            yield chunk


def settled(trace: Trace, engine, params) -> None:
    """At the request's end: its KV at its largest (the prompt and what it generated, every choice,
    as the prefill guard estimates it) and the prompt-cache entry it left (the engine stores a
    finished request's first choice when its model keeps a cache)."""
    layout = (getattr(engine, "model_info", None) or {}).get("kv_layout")
    tokens = trace.prompt_tokens + trace.completion_tokens
    if tokens and layout is not None:
        per_choice = kv_estimate(layout, tokens=trace.prompt_tokens + trace.completion_tokens // max(1, params.n),
                                 config=params.kv)
        trace.peak_kv_bytes = per_choice * max(1, params.n)
    stats = getattr(engine, "cache_stats", None)
    keeps = stats is not None and stats.prompt_cache_cap_bytes > 0
    if keeps and params.cache_prompt and params.kv.default and trace.finish_reason in ("stop", "length"):
        trace.stored_tokens = tokens if params.n == 1 else None   # choice 0's own count is not known here
