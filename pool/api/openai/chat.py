"""POST /v1/chat/completions and /v1/completions (SSE when streaming), through the router.

A chat request with tools (tool_choice not "none") has its answer split into content and tool calls
by pool.tools: `message.tool_calls` when whole, `delta.tool_calls` chunks (shapes.ToolEvents) when
streamed, and finish_reason "tool_calls" when the answer holds a call. A stream sends an SSE comment
(`: keep-alive`) every OMLX_SSE_KEEPALIVE seconds until its first token (pool/api/keepalive.py)."""

from __future__ import annotations

from django.http import JsonResponse

from ...runtime import get_runtime
from ...tools.calls import finish_reason
from .. import wants
from ..auth import require_key
from ..dialects import OPENAI
from ..fields import json_body, off_loop
from ..keepalive import KEEPALIVE, until_first
from ..load_wait import opening, sse_comment, stream_after_load
from ..route import api_route
from ..sse import event_stream
from .parse import parse_completion
from .shapes import Shape, ToolEvents, sse

KEEPALIVE_COMMENT = b": keep-alive\n\n"     # an SSE comment: every SSE reader skips it


@api_route("POST", auth=require_key, wants=wants.openai_chat)
async def chat_completions(request):
    return await _complete(request, chat=True)


@api_route("POST", auth=require_key, wants=wants.openai_completion)
async def completions(request):
    return await _complete(request, chat=False)


async def _complete(request, *, chat: bool):
    req = await off_loop(parse_completion, json_body(request), chat=chat)
    runtime = get_runtime()

    def shape_of(completion) -> Shape:
        return Shape(chat=chat, model=completion.model_id, n=req.spec.n, logprobs=req.spec.logprobs is not None)
    if not req.stream:
        completion = await opening(runtime.router.generate(req.spec), req.spec.model)
        async with completion:
            return JsonResponse(await _collect(completion, shape_of(completion)))
    # a wait on a load past the keep-alive interval begins the stream with progress comments
    events = stream_after_load(runtime.router.generate(req.spec), lambda c: _stream(c, shape_of(c), req.include_usage),
                               name=req.spec.model, interval=runtime.settings.sse_keepalive, comment=sse_comment)
    return await event_stream(events, events, OPENAI)


def _usage(finals) -> dict:
    """The prompt is counted once, however many choices were drawn from it."""
    finals = list(finals)
    prompt, cached = finals[0].prompt_tokens, finals[0].cached_tokens
    completion = sum(chunk.completion_tokens for chunk in finals)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


async def _collect(completion, shape: Shape) -> dict:
    texts: list[list[str]] = [[] for _ in range(shape.n)]
    entries: list[list] = [[] for _ in range(shape.n)]
    finals = {}
    async for chunk in completion.chunks():
        texts[chunk.index].append(chunk.text)
        entries[chunk.index].extend(chunk.logprobs)
        if chunk.finish_reason is not None:
            finals[chunk.index] = chunk
    choices = [_choice(shape, completion, i, "".join(texts[i]), finals[i].finish_reason, entries[i])
               for i in range(shape.n)]
    return shape.body(choices, _usage(finals[i] for i in range(shape.n)))


def _choice(shape: Shape, completion, index: int, text: str, reason: str, entries) -> dict:
    if completion.tool_format is None:
        return shape.choice(index, text, reason, chunk=False, entries=entries)
    content, calls = completion.split_tool_calls(text)
    return shape.choice(index, content, finish_reason(reason, bool(calls)), chunk=False, entries=entries,
                        tool_calls=calls)


async def _stream(completion, shape: Shape, include_usage: bool):
    async with completion:
        if shape.chat:
            for index in range(shape.n):
                yield sse(shape.chunk(index, None, first=True))
        else:
            yield b": stream start\n\n"
        finals = {}
        tools = ToolEvents(shape, completion) if completion.tool_format is not None else None
        async for chunk in until_first(completion.chunks(), get_runtime().settings.sse_keepalive):
            if chunk is KEEPALIVE:
                yield KEEPALIVE_COMMENT
                continue
            if tools is not None:
                for event in tools.events(chunk):
                    yield event
            elif chunk.text or chunk.logprobs or chunk.finish_reason is None:
                yield shape.text_event(chunk)
            if chunk.finish_reason is not None:
                finals[chunk.index] = chunk
                reason = chunk.finish_reason if tools is None else tools.reason(chunk)
                yield sse(shape.chunk(chunk.index, None, reason))
        if include_usage:
            yield sse(shape.usage_chunk(_usage(finals.values())))
        yield OPENAI.stream_end
