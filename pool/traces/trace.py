"""A request's trace: plain facts gathered on its way (the route, the serving door, its chunks) into
one small mutable object, read by the in-flight registry (phases, cancel), the writer thread (the
database), the metrics and the websocket. No Django, no MLX: the serving door fills it in.

The current request's trace rides in a context variable the route sets (pool/api/tracing.py): the
door, the completion and a load the request starts (its tasks copy the context) find it there, so
nothing in between passes it along. Each call here is a few attribute writes: one per chunk on
the token path, nothing that waits."""

from __future__ import annotations

import asyncio
import secrets
from contextvars import ContextVar
from dataclasses import dataclass, field
from time import perf_counter
from time import time as epoch
from typing import Any

from ..policy.vocabulary import Phase

current: ContextVar["Trace | None"] = ContextVar("omlx_trace", default=None)

CANCELLED = "request_cancelled"


def new_id() -> str:
    return "req_" + secrets.token_hex(12)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


@dataclass(eq=False)
class Trace:
    route: str
    dialect: str
    key: str | None = None
    id: str = field(default_factory=new_id)
    time: float = field(default_factory=epoch)                 # arrival, epoch seconds
    started: float = field(default_factory=perf_counter)
    host: str | None = None
    model: str | None = None            # set at the serving door: a trace without one is not kept
    stream: bool = False
    status: int | None = None
    error: str | None = None
    finish_reason: str | None = None
    disconnected: bool = False
    cancelled: bool = False
    phase: Phase = Phase.QUEUED
    prefill_done: int = 0
    prefill_total: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    image_tokens: int = 0             # of prompt_tokens, those an image became (a vision model's)
    draft_proposed: int = 0           # tokens its model's draft proposed (speculative decoding) ...
    draft_accepted: int = 0           # ... and those the model kept
    completion_tokens: int = 0
    generated: int = 0                  # the first choice's tokens so far (the engine thread counts them)
    admission_s: float | None = None
    slot_s: float | None = None
    load_s: float | None = None
    load_model: str | None = None
    load_started: bool = False
    prefill_at: float | None = None     # perf_counter: the prompt was handed to the engine
    first_at: float | None = None       # ... its first chunk came
    last_at: float | None = None
    ended: float | None = None
    duration_s: float | None = None
    peak_kv_bytes: int | None = None
    stored_tokens: int | None = None
    evictions: list[int] = field(default_factory=list)
    body_cap: int = 0                   # the model's trace_body_bytes: 0 keeps no text
    request_body: str | None = None
    response_text: list[str] = field(default_factory=list)
    response_bytes: int = 0
    truncated: bool = False
    task: asyncio.Task | None = None    # what a cancel interrupts: the task awaiting the door or the engine

    # ---- on the request's way ----------------------------------------------------------------

    def prefilling(self, tokens: int) -> None:
        self.phase, self.prefill_total, self.prefill_at = Phase.PREFILLING, tokens, perf_counter()

    def chunk(self, chunk: Any) -> None:
        """One engine chunk (pool.engines.protocol.Chunk), as the client gets it."""
        now = self.last_at = perf_counter()
        if self.first_at is None:
            self.first_at, self.phase, self.prefill_done = now, Phase.DECODING, self.prefill_total
        if self.body_cap and chunk.text:
            self._capture(chunk.text)
        if chunk.finish_reason is not None:
            if chunk.index == 0:
                self.finish_reason = chunk.finish_reason
            self.completion_tokens += chunk.completion_tokens
            self.prompt_tokens, self.cached_tokens = chunk.prompt_tokens, chunk.cached_tokens
            self.draft_proposed += chunk.draft_proposed
            self.draft_accepted += chunk.draft_accepted

    def _capture(self, text: str) -> None:
        room = self.body_cap - self.response_bytes
        if room <= 0:
            self.truncated = True
            return
        data = text.encode()
        if len(data) > room:
            text, self.truncated = data[:room].decode(errors="ignore"), True
        self.response_text.append(text)
        self.response_bytes += min(len(data), room)

    def cancel(self) -> None:
        """An operator's cancel: the awaiting task is interrupted, and the serving code that catches
        it (completion.py) ends the request with a `request_cancelled` error."""
        self.cancelled = True
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def note_error(self, code: str | None) -> None:
        if self.error is None:
            self.error = code or "error"

    def finish(self) -> None:
        self.ended, self.duration_s, self.phase = epoch(), perf_counter() - self.started, Phase.DONE
        self.task = None

    # ---- what it says ------------------------------------------------------------------------

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_at is None else self.first_at - self.started

    @property
    def prefill_s(self) -> float | None:
        return None if self.first_at is None or self.prefill_at is None else self.first_at - self.prefill_at

    @property
    def decode_tps(self) -> float | None:
        """Tokens per second after the first one (every choice's together)."""
        if self.first_at is None or self.last_at is None or self.completion_tokens < 2 or self.last_at <= self.first_at:
            return None
        return round((self.completion_tokens - 1) / (self.last_at - self.first_at), 2)

    @property
    def queue_s(self) -> float:
        return (self.admission_s or 0.0) + (self.slot_s or 0.0)

    def as_dict(self, *, body: bool = False) -> dict:
        shown = {
            "id": self.id, "time": self.time, "ended": self.ended,
            "duration_ms": _ms(self.duration_s if self.duration_s is not None else perf_counter() - self.started),
            "host": self.host, "model": self.model, "dialect": self.dialect, "route": self.route, "key": self.key,
            "stream": self.stream, "status": self.status, "error": self.error, "finish_reason": self.finish_reason,
            "disconnected": self.disconnected, "cancelled": self.cancelled, "phase": str(self.phase),
            "prefill_done": self.prefill_done, "prefill_total": self.prefill_total,
            "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens, "image_tokens": self.image_tokens,
            "draft_proposed": self.draft_proposed, "draft_accepted": self.draft_accepted,
            "completion_tokens": self.completion_tokens or self.generated, "admission_ms": _ms(self.admission_s),
            "slot_ms": _ms(self.slot_s), "load_ms": _ms(self.load_s), "load_model": self.load_model,
            "load_started": self.load_started, "prefill_ms": _ms(self.prefill_s), "ttft_ms": _ms(self.ttft_s),
            "decode_tps": self.decode_tps, "peak_kv_bytes": self.peak_kv_bytes,
            "prompt_cache_hit_tokens": self.cached_tokens or None, "prompt_cache_stored_tokens": self.stored_tokens,
            "evictions": list(self.evictions),
        }
        if body and self.body_cap:
            shown["body"] = self.body()
        return shown

    def body(self) -> dict:
        return {"request": self.request_body, "response": "".join(self.response_text), "truncated": self.truncated}


def begun(trace: Trace | None) -> None:
    """Make `trace` the current request's (the route does, before the view runs)."""
    current.set(trace)


def note_error(code: str | None) -> None:
    """The current request failed with this error code (api/errors.py words every failure)."""
    trace = current.get()
    if trace is not None:
        trace.note_error(code)


def for_request() -> str:
    """' for req_...' when the current task runs for a traced request (a load it started copied its
    context), for the history rows its load writes; '' otherwise."""
    trace = current.get()
    return f" for {trace.id}" if trace is not None and trace.model is not None else ""
