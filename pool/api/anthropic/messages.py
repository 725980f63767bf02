"""Anthropic's Messages API: POST /v1/messages (SSE events when streaming) and
POST /v1/messages/count_tokens, through the router as the OpenAI routes. Errors come in Anthropic's
envelope and words (words.py), 529 where the OpenAI routes answer 503. A stream sends `ping` events
every OMLX_SSE_KEEPALIVE seconds until its first token (pool/api/keepalive.py)."""

from __future__ import annotations

from django.http import JsonResponse

from ...runtime import get_runtime
from ...tools.calls import ToolCall
from .. import wants
from ..auth import require_key
from ..dialects import ANTHROPIC
from ..fields import off_loop
from ..keepalive import KEEPALIVE, until_first
from ..load_wait import opening, sse_comment, stream_after_load
from ..route import api_route
from ..sse import event_stream
from . import events as shape
from .events import EventStream, Text, sse
from .parse import parse_count_tokens, parse_messages, read_body


@api_route("POST", auth=require_key, dialect=ANTHROPIC, wants=wants.anthropic_messages)
async def messages(request):
    req = await off_loop(parse_messages, read_body(request))
    runtime = get_runtime()
    if not req.stream:
        completion = await opening(runtime.router.generate(req.spec), req.spec.model)
        async with completion:
            return JsonResponse(await _collect(completion, _reader(completion)))
    # a wait on a load past the keep-alive interval begins the stream with progress comments
    events = stream_after_load(runtime.router.generate(req.spec), lambda c: _stream(c, _reader(c)),
                               name=req.spec.model, interval=runtime.settings.sse_keepalive, comment=sse_comment)
    return await event_stream(events, events, ANTHROPIC)


@api_route("POST", auth=require_key, dialect=ANTHROPIC, wants=wants.model_in_body_here_first)
async def count_tokens(request):
    spec = await off_loop(parse_count_tokens, read_body(request))
    return JsonResponse({"input_tokens": await get_runtime().router.count_tokens(spec)})


# ---- the answer ----------------------------------------------------------------------------------

class _PlainText:
    """The engine's text as text pieces (no tools shown to the model)."""

    def feed(self, text: str) -> list:
        return [Text(text)] if text else []

    def finish(self) -> list:
        return []


class _WithTools:
    """The engine's text through the tools layer's parser: text pieces and tool calls, in order."""

    def __init__(self, stream):
        self._stream = stream

    def feed(self, text: str) -> list:
        return [_piece(d) for d in self._stream.feed(text)]

    def finish(self) -> list:
        return [_piece(d) for d in self._stream.finish()]


def _piece(delta):
    if isinstance(delta, ToolCall):
        return shape.ToolUse(id=delta.id.replace("call_", "toolu_", 1), name=delta.name, arguments=delta.arguments)
    return Text(delta)


def _reader(completion):
    """The answer's text as pieces: through the request's tool-call parser when it has tools."""
    stream = completion.tool_stream()
    return _PlainText() if stream is None else _WithTools(stream)


async def _collect(completion, reader) -> dict:
    pieces, last = [], None
    async for chunk in completion.chunks():
        pieces.extend(reader.feed(chunk.text))
        last = chunk
    pieces.extend(reader.finish())
    stop_sequence = last.stop_sequence
    tool_use = any(isinstance(p, shape.ToolUse) for p in pieces)
    return shape.message(model=completion.model_id, content=shape.content_blocks(pieces),
                         stop_reason=shape.stop_reason(last.finish_reason, stop_sequence, tool_use=tool_use),
                         stop_sequence=None if tool_use else stop_sequence,
                         usage=shape.usage(last.prompt_tokens, last.completion_tokens, last.cached_tokens))


async def _stream(completion, reader):
    async with completion:
        stream = EventStream(model=completion.model_id, input_tokens=completion.prompt_tokens)
        for event in stream.start():
            yield sse(*event)
        async for chunk in until_first(completion.chunks(), get_runtime().settings.sse_keepalive):
            if chunk is KEEPALIVE:
                yield sse("ping", {"type": "ping"})
                continue
            events = [e for piece in reader.feed(chunk.text) for e in stream.feed(piece)]
            if chunk.finish_reason is not None:
                events += [e for piece in reader.finish() for e in stream.feed(piece)]
                stop_sequence = None if stream.tool_use else chunk.stop_sequence
                events += stream.finish(
                    stop_reason=shape.stop_reason(chunk.finish_reason, stop_sequence, tool_use=stream.tool_use),
                    stop_sequence=stop_sequence, output_tokens=chunk.completion_tokens,
                    cached_tokens=chunk.cached_tokens)
            if events:
                yield b"".join(sse(*event) for event in events)
