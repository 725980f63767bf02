"""The shapes of OpenAI's answers: chat.completion and text_completion objects and their stream
chunks, choices with logprobs, and a streamed chat's tool calls as `delta.tool_calls` chunks."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import replace

from ...tools.calls import ToolCall, finish_reason

_MARK = "\x00text"    # stands for the text in text_event's template; no JSON encodes anything else so
LOWEST_LOGPROB = -9999.0   # what OpenAI shows for a token that cannot be chosen (JSON has no -Infinity)


def _lp(value: float) -> float:
    return value if value >= LOWEST_LOGPROB else LOWEST_LOGPROB


def chat_logprobs(entries) -> dict:
    """Chat's `logprobs`: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}."""
    return {"content": [{"token": e.token, "logprob": _lp(e.logprob), "bytes": list(e.bytes),
                         "top_logprobs": [{"token": t, "logprob": _lp(lp), "bytes": list(b)} for t, lp, b in e.top]}
                        for e in entries]}


def completion_logprobs(entries, offset: int = 0) -> dict:
    """/v1/completions' `logprobs`: parallel lists; `text_offset` counts characters of the
    completion from `offset` (where the tokens before these ended)."""
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += len(e.token)
    return {"tokens": [e.token for e in entries], "token_logprobs": [_lp(e.logprob) for e in entries],
            "top_logprobs": [{t: _lp(lp) for t, lp, _ in e.top} for e in entries], "text_offset": offsets}


class Shape:
    """The OpenAI object shapes for one response: `n` choices, with logprobs when asked."""

    def __init__(self, *, chat: bool, model: str, n: int = 1, logprobs: bool = False):
        self.chat, self.model, self.n, self.logprobs = chat, model, n, logprobs
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self._text_events: dict[int, list[bytes]] = {}
        self._offsets = [0] * n       # each choice's text so far, for completions' text_offset

    def _base(self, chunk: bool) -> dict:
        kind = "chat.completion" if self.chat else "text_completion"
        return {"id": self.id, "object": kind + (".chunk" if chunk and self.chat else ""),
                "created": self.created, "model": self.model}

    def _logprobs(self, index: int, entries, *, chunk: bool) -> dict | None:
        if not self.logprobs or (chunk and not entries):
            return None
        if self.chat:
            return chat_logprobs(entries)
        rendered = completion_logprobs(entries, self._offsets[index])
        self._offsets[index] += sum(len(e.token) for e in entries)
        return rendered

    def choice(self, index: int, text: str | None, finish_reason, *, chunk: bool, first: bool = False,
               entries=(), tool_calls=()) -> dict:
        logprobs = self._logprobs(index, entries, chunk=chunk)
        if not self.chat:
            return {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
        if not chunk:
            message = {"role": "assistant", "content": text}
            if tool_calls:
                message["tool_calls"] = [call.openai() for call in tool_calls]
            return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}
        delta = {"role": "assistant", "content": ""} if first else ({"content": text} if text else {})
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}

    def body(self, choices: list[dict], usage) -> dict:
        return {**self._base(False), "choices": choices, "usage": usage}

    def chunk(self, index: int, text, finish_reason=None, *, first=False, entries=()) -> dict:
        choice = self.choice(index, text, finish_reason, chunk=True, first=first, entries=entries)
        return {**self._base(True), "choices": [choice]}

    def text_event(self, chunk) -> bytes:
        """The SSE event of one streamed piece of text. It is sent once per engine step per stream, so
        its fixed parts are encoded once per response (and choice) and only the text per call."""
        if chunk.logprobs:
            return sse(self.chunk(chunk.index, chunk.text, entries=chunk.logprobs))
        template = self._text_events.get(chunk.index)
        if template is None:
            event = sse(self.chunk(chunk.index, _MARK))
            template = self._text_events[chunk.index] = event.split(json.dumps(_MARK).encode())
        head, tail = template
        return head + json.dumps(chunk.text).encode() + tail

    def tool_call_event(self, index: int, call: ToolCall, position: int) -> bytes:
        """One whole call as a `delta.tool_calls` chunk; `position` is the call's place in the choice."""
        choice = {"index": index, "delta": {"tool_calls": [call.openai_delta(position)]}, "logprobs": None,
                  "finish_reason": None}
        return sse({**self._base(True), "choices": [choice]})

    def usage_chunk(self, usage) -> dict:
        return {**self._base(True), "choices": [], "usage": usage}


class ToolEvents:
    """A streamed chat with tools: each choice's text goes through its own ToolStream, content comes
    out as text events, each call as one `delta.tool_calls` chunk."""

    def __init__(self, shape: Shape, completion):
        self.shape = shape
        self.streams = [completion.tool_stream() for _ in range(shape.n)]

    def events(self, chunk) -> list[bytes]:
        stream = self.streams[chunk.index]
        deltas = stream.feed(chunk.text)
        if chunk.finish_reason is not None:
            deltas += stream.finish()
        out, entries = [], chunk.logprobs       # the chunk's logprobs ride on its first event
        sent = stream.calls - sum(isinstance(d, ToolCall) for d in deltas)
        for delta in deltas:
            if isinstance(delta, ToolCall):
                if entries:
                    out.append(self.shape.text_event(replace(chunk, text="")))
                    entries = ()
                out.append(self.shape.tool_call_event(chunk.index, delta, sent))
                sent += 1
            else:
                out.append(self.shape.text_event(replace(chunk, text=delta, logprobs=entries)))
                entries = ()
        if entries:
            out.append(self.shape.text_event(replace(chunk, text="")))
        return out

    def reason(self, chunk) -> str:
        return finish_reason(chunk.finish_reason, self.streams[chunk.index].calls > 0)


def sse(obj) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


