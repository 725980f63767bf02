"""OpenAI-style routes: /v1/models, /v1/chat/completions, /v1/completions (SSE when streaming).

A chat request with tools (tool_choice not "none") has its answer split into content and tool calls
by pool.tools: `message.tool_calls` when whole, `delta.tool_calls` chunks (one ToolStream per choice)
when streamed, and finish_reason "tool_calls" when the answer holds a call.

A stream sends an SSE comment (`: keep-alive`) every OMLX_SSE_KEEPALIVE seconds until its first
token, so a client with a read timeout waits out a long prompt (pool/api/keepalive.py)."""

from __future__ import annotations

import json
import time
import uuid

from dataclasses import replace

from django.http import JsonResponse

from ..capabilities import model_card
from ..errors import PoolError
from ..runtime import get_runtime
from ..serving import Completion
from ..tools import ToolCall, ToolStream, finish_reason, split_tool_calls
from .auth import require_key
from .errors import sse_error
from .keepalive import KEEPALIVE, OPENAI_COMMENT, until_first
from .sse import event_stream
from .fields import json_body
from .parse import parse_completion
from .route import api_route


def _model_object(entry) -> dict:
    created = int(entry.path.stat().st_mtime) if entry.path.exists() else 0
    return {"id": entry.id, "object": "model", "created": created, "owned_by": "omlx-site",
            "alias": entry.alias, "state": entry.state, "size_bytes": entry.size_bytes,
            **model_card(entry.path, entry.kind)}


@api_route("GET", auth=require_key)
async def list_models(request):
    pool = get_runtime().pool
    data = [_model_object(e) for e in sorted(pool.entries.values(), key=lambda e: e.id) if not e.hidden]
    return JsonResponse({"object": "list", "data": data})


@api_route("GET", auth=require_key)
async def get_model(request, model_id: str):
    return JsonResponse(_model_object(get_runtime().pool.resolve(model_id)))


@api_route("POST", auth=require_key)
async def chat_completions(request):
    return await _complete(request, chat=True)


@api_route("POST", auth=require_key)
async def completions(request):
    return await _complete(request, chat=False)


async def _complete(request, *, chat: bool):
    req = parse_completion(json_body(request), chat=chat)
    completion = await get_runtime().serving.open_completion(req.spec)
    shape = _Shape(chat=chat, model=completion.model_id, n=req.spec.n, logprobs=req.spec.logprobs is not None)
    if not req.stream:
        async with completion:
            return JsonResponse(await _collect(completion, shape))
    events = _stream(completion, shape, req.include_usage)
    return await event_stream(completion, events)


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


class _Shape:
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
            return _sse(self.chunk(chunk.index, chunk.text, entries=chunk.logprobs))
        template = self._text_events.get(chunk.index)
        if template is None:
            event = _sse(self.chunk(chunk.index, _MARK))
            template = self._text_events[chunk.index] = event.split(json.dumps(_MARK).encode())
        head, tail = template
        return head + json.dumps(chunk.text).encode() + tail

    def tool_call_event(self, index: int, call: ToolCall, position: int) -> bytes:
        """One whole call as a `delta.tool_calls` chunk; `position` is the call's place in the choice."""
        choice = {"index": index, "delta": {"tool_calls": [call.openai_delta(position)]}, "logprobs": None,
                  "finish_reason": None}
        return _sse({**self._base(True), "choices": [choice]})

    def usage_chunk(self, usage) -> dict:
        return {**self._base(True), "choices": [], "usage": usage}


def _usage(finals) -> dict:
    """The prompt is counted once, however many choices were drawn from it."""
    finals = list(finals)
    prompt, cached = finals[0].prompt_tokens, finals[0].cached_tokens
    completion = sum(chunk.completion_tokens for chunk in finals)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


async def _collect(completion: Completion, shape: _Shape) -> dict:
    texts = [[] for _ in range(shape.n)]
    entries = [[] for _ in range(shape.n)]
    finals = {}
    async for chunk in completion.chunks():
        texts[chunk.index].append(chunk.text)
        entries[chunk.index].extend(chunk.logprobs)
        if chunk.finish_reason is not None:
            finals[chunk.index] = chunk
    choices = [_choice(shape, completion, i, "".join(texts[i]), finals[i].finish_reason, entries[i])
               for i in range(shape.n)]
    return shape.body(choices, _usage(finals[i] for i in range(shape.n)))


def _choice(shape: _Shape, completion: Completion, index: int, text: str, reason: str, entries) -> dict:
    fmt, tools = completion.tool_format, completion.tool_request
    if fmt is None:
        return shape.choice(index, text, reason, chunk=False, entries=entries)
    content, calls = split_tool_calls(text, fmt, tools=tools.tools, parallel=tools.parallel_tool_calls)
    return shape.choice(index, content, finish_reason(reason, bool(calls)), chunk=False, entries=entries,
                        tool_calls=calls)


class _ToolEvents:
    """A streamed chat with tools: each choice's text goes through its own ToolStream, content comes
    out as text events, each call as one `delta.tool_calls` chunk."""

    def __init__(self, shape: _Shape, completion: Completion):
        tools = completion.tool_request
        self.shape = shape
        self.streams = [ToolStream(completion.tool_format, tools=tools.tools, parallel=tools.parallel_tool_calls)
                        for _ in range(shape.n)]

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


def _sse(obj) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


async def _stream(completion: Completion, shape: _Shape, include_usage: bool):
    async with completion:
        if shape.chat:
            for index in range(shape.n):
                yield _sse(shape.chunk(index, None, first=True))
        else:
            yield b": stream start\n\n"
        finals = {}
        tools = _ToolEvents(shape, completion) if completion.tool_format is not None else None
        try:
            async for chunk in until_first(completion.chunks(), get_runtime().settings.sse_keepalive):
                if chunk is KEEPALIVE:
                    yield OPENAI_COMMENT
                    continue
                if tools is not None:
                    for event in tools.events(chunk):
                        yield event
                elif chunk.text or chunk.logprobs or chunk.finish_reason is None:
                    yield shape.text_event(chunk)
                if chunk.finish_reason is not None:
                    finals[chunk.index] = chunk
                    reason = chunk.finish_reason if tools is None else tools.reason(chunk)
                    yield _sse(shape.chunk(chunk.index, None, reason))
            if include_usage:
                yield _sse(shape.usage_chunk(_usage(finals.values())))
        except PoolError as e:
            yield sse_error(e)
        yield b"data: [DONE]\n\n"

