"""A request as its engine thread sees it, and the way its text gets back to the event loop.

The engine thread detokenizes each token and applies the stop strings (`Request.advance`), collects
what a step produced for every request in an `Outbox`, and hands it over with one
`loop.call_soon_threadsafe` per step; the request's coroutine reads what arrived, joining the text
that piled up while it was busy (`coalesced`). A request for several choices (`n`) is one `Request`
per choice, all handing over into the same `arrived` list."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any, AsyncGenerator

from .protocol import Chunk, SamplingParams, TokenLogprob
from .stops import find_stop, holdback, stop_found


@dataclass(eq=False)     # a dict key by identity
class Request:
    tokens: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    ready: asyncio.Event = field(default_factory=asyncio.Event)   # set on the loop when `arrived` grows
    arrived: list = field(default_factory=list)    # chunks (or an error) handed over, not yet read
    uid: int | None = None
    detokenizer: Any = None
    text: str = ""          # decoded so far, not yet emitted
    generated: int = 0
    cached_tokens: int = 0  # prompt tokens taken from the prompt cache
    lane: Any = None        # the key of the lane it decodes in
    done: bool = False
    index: int = 0          # the choice it is, of the request's n
    logprobs: list[TokenLogprob] = field(default_factory=list)   # not yet sent
    draft: tuple[int, int] = (0, 0)   # draft tokens proposed and accepted (engines/drafting.py)

    def advance(self, token: int, finish_reason: str | None,
                logprob: TokenLogprob | None = None) -> tuple[Chunk | None, bool]:
        """Take one generated token (and its logprobs, when the request asked): (the chunk to send,
        if any, and whether a stop string ended the request here). The last chunk carries the
        finish reason and the counts."""
        detok = self.detokenizer
        if finish_reason != "stop":  # the stop (EOS) token itself is not text
            detok.add_token(token)
            self.generated += 1
            if self.params.progress is not None and not self.index:
                self.params.progress.generated = self.generated
            if logprob is not None:
                self.logprobs.append(logprob)
        if finish_reason is not None:
            detok.finalize()
        self.text += detok.last_segment
        stop_at = find_stop(self.text, self.params.stop)
        stopped_here = stop_at is not None and finish_reason is None
        matched = None
        if stop_at is not None:
            matched = stop_found(self.text, self.params.stop, stop_at)
            self.text, finish_reason = self.text[:stop_at], "stop"
        if finish_reason is None:
            emit = self.text[: len(self.text) - holdback(self.text, self.params.stop)]
            self.text = self.text[len(emit):]
            if self.logprobs or self.index:   # only requests that asked for logprobs or n > 1
                return (Chunk(emit, logprobs=self._take_logprobs(), index=self.index)
                        if emit or self.logprobs else None), False
            return (Chunk(emit) if emit else None), False
        chunk = Chunk(self.text, finish_reason, len(self.tokens), self.generated, self.cached_tokens,
                      self._take_logprobs(), self.index, matched, *self.draft)
        self.text = ""
        return chunk, stopped_here

    def _take_logprobs(self) -> tuple[TokenLogprob, ...]:
        taken, self.logprobs = tuple(self.logprobs), []
        return taken


class Outbox:
    """What the engine thread emitted during one step, handed over once per step: one wake-up of each
    event loop, whatever the number of requests and tokens."""

    def __init__(self):
        self._items: dict[Request, list] = {}

    def emit(self, req: Request, item: Chunk | BaseException) -> None:
        self._items.setdefault(req, []).append(item)

    def flush(self) -> None:
        if not self._items:
            return
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for req, items in self._items.items():
            by_loop.setdefault(req.loop, []).append((req, items))
        self._items = {}
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_hand_over, batch)
            except RuntimeError:  # the client's loop is gone
                pass


def _hand_over(batch: list[tuple[Request, list]]) -> None:
    """On the event loop: what one engine step produced, for every request it touched."""
    for req, items in batch:
        req.arrived.extend(items)
        req.ready.set()


async def received(first: Request, *, choices: int = 1) -> AsyncGenerator[Chunk, None]:
    """On the event loop: the chunks the engine thread hands `first` (and the choices that share its
    mailbox), coalesced, until every choice has finished; an error it hands over is raised."""
    unfinished = choices
    while True:
        if not first.arrived:
            await first.ready.wait()
        first.ready.clear()
        items = coalesced(first.arrived)
        first.arrived.clear()
        for item in items:
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.finish_reason is not None:
                unfinished -= 1
                if not unfinished:
                    return


def coalesced(items: list) -> list:
    """Text chunks of one choice that piled up while the reader was busy become one; errors and the
    last chunk stay in order."""
    out: list = []
    open_at: dict[int, int] = {}      # choice -> where its unfinished chunk is in `out`
    for item in items:
        at = open_at.pop(item.index, None) if isinstance(item, Chunk) else None
        if at is not None:
            prev = out[at]
            out[at] = replace(item, text=prev.text + item.text, logprobs=prev.logprobs + item.logprobs)
        else:
            at = len(out)
            out.append(item)
        if not isinstance(item, Chunk):
            open_at.clear()           # what follows an error stays after it
        elif item.finish_reason is None:
            open_at[item.index] = at
    return out
