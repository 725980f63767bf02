"""OpenAI's Responses API: POST /v1/responses (the event sequence of events.py when streaming),
GET and DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items. A request goes through the
router to the serving door as the chat route's does (limits, keep-alive, KV fields, prompt cache,
admission, the enforcer); errors are OpenAI's envelope before a stream begins, and `error` then
`response.failed` events after. A stored response (`store`, true by default) is written in the
background (store.py); `previous_response_id` continues its conversation, whose rendered prefix is
the previous turn's prompt, so the prompt cache has it warm."""

from __future__ import annotations

import logging
from contextlib import aclosing
from dataclasses import replace

from django.http import HttpResponse, JsonResponse

from ...errors import ContextLengthExceeded, PoolError
from ...runtime import get_runtime
from ...tools.calls import ToolCall
from ...tools.formats import FALLBACK
from ...tools.prompt import prepare_messages
from .. import wants
from ..auth import require_key
from ..dialects import OPENAI, Dialect
from ..errors import envelope, internal
from ..fields import integer, json_body, off_loop
from ..keepalive import KEEPALIVE, until_first
from ..load_wait import opening, sse_comment, stream_after_load
from ..openai import words as openai_words
from ..route import api_route
from ..sse import event_stream
from . import store
from .events import EventStream, replay, sse
from .items import cuts, read_images
from .parse import ResponsesRequest, parse_responses
from .shapes import Response, Text, output_items, status_of, usage

log = logging.getLogger("pool.api.responses")
KEEPALIVE_COMMENT = b": keep-alive\n\n"


def _stream_error(error: PoolError, status: int, kind: str) -> bytes:
    """Only for a failure outside the stream's own handling (it sends error + response.failed)."""
    return sse({"type": "error", "sequence_number": 0, "code": error.code, "message": openai_words.message(error),
                "param": error.param})


def owner(request) -> str:
    """Whose stored responses this request reads and writes: its API key's name ('' without keys)."""
    key = getattr(request, "omlx_key", None)
    return key.name if key is not None else ""


RESPONSES = Dialect("openai-responses", openai_words.envelope, _stream_error)


@api_route("POST", auth=require_key, wants=wants.responses_input)
async def create(request):
    req = replace(await off_loop(parse_responses, json_body(request)), owner=owner(request))
    earlier = await store.conversation(req.previous_response_id, req.owner) if req.previous_response_id else []
    store.check_conversation(earlier, req.input)
    if earlier:      # a stored conversation's images, read again and counted with this input's
        await off_loop(read_images, [*earlier, *req.input], req.images)
    if req.store:
        store.check_input(req.input)
    conversation = [*earlier, *req.input]
    if not req.stream:
        completion, items = await opening(_open(req, conversation), req.model)
        response = Response(model=completion.model_id, echo=req.echo, namespaces=req.namespaces)
        async with completion:
            body = await _collect(completion, _reader(completion), response)
        if req.store:
            await store.keep(body, items, req.input, body["output"], req.owner)
        return JsonResponse(body)
    # a wait on a load past the keep-alive interval begins the stream with progress comments
    events = stream_after_load(_Opened.of(_open(req, conversation)), lambda o: _stream_opened(o, req), name=req.model,
                               interval=get_runtime().settings.sse_keepalive, comment=sse_comment)
    return await event_stream(events, events, RESPONSES)


class _Opened:
    """An opened completion and the items it was given, closed as the completion is."""

    def __init__(self, completion, items: list[dict]):
        self.completion, self.items = completion, items

    @classmethod
    async def of(cls, opening_) -> "_Opened":
        return cls(*await opening_)

    async def aclose(self) -> None:
        await self.completion.aclose()


def _stream_opened(opened: _Opened, req: ResponsesRequest):
    completion = opened.completion
    response = Response(model=completion.model_id, echo=req.echo, namespaces=req.namespaces)
    return _stream(completion, _reader(completion), EventStream(response), req, opened.items)


async def _open(req: ResponsesRequest, items: list[dict]):
    """The completion, and the items it was given. With `truncation: "auto"` a conversation too long
    for the context loses its oldest turns: the longest tail that fits (a turn's boundary, `cuts`),
    found by bisection, so a few prompts are tokenised instead of one per dropped turn (fewer items
    never make a longer prompt). Each tried prompt that fits is let go before the next is tried: a
    model with one slot would otherwise wait on itself."""
    try:
        return await _try(req, items), items
    except ContextLengthExceeded as e:
        if req.truncation != "auto":
            raise _named(e) from None
        error = e
    starts, best = cuts(items)[1:], None
    low, high = 0, len(starts) - 1
    while low <= high:
        middle = (low + high) // 2
        try:
            completion = await _try(req, items[starts[middle]:])
        except ContextLengthExceeded as e:
            error, low = e, middle + 1
            continue
        best, high = middle, middle - 1
        if low > high:
            return completion, items[starts[middle]:]
        await completion.aclose()
    if best is None:
        raise _named(error) from None
    return await _try(req, items[starts[best]:]), items[starts[best]:]


async def _try(req: ResponsesRequest, items: list[dict]):
    spec = req.spec(items)
    assert spec.messages is not None
    if any("tool_calls" in m or m["role"] == "tool" for m in spec.messages):
        prepare_messages(spec.messages, None, FALLBACK)   # tool history it cannot render: a 400 first
    return await get_runtime().router.generate(spec)


def _named(e: ContextLengthExceeded) -> ContextLengthExceeded:
    """The door's context error as the Responses API names its fields: `input`, `max_output_tokens`."""
    named = ContextLengthExceeded(part=e.part, context=e.context, prompt_param="input", prompt_tokens=e.prompt_tokens,
                                  max_tokens=e.max_tokens, characters=e.characters, max_characters=e.max_characters,
                                  chars_per_token=e.chars_per_token)
    if e.part == ContextLengthExceeded.COMPLETION:
        named.param = "max_output_tokens"
    return named


class _Reader:
    """The engine's text as pieces: through the request's tool-call parser when it has tools."""

    def __init__(self, stream):
        self._stream = stream

    def feed(self, text: str) -> list:
        if self._stream is None:
            return [Text(text)] if text else []
        return [d if isinstance(d, ToolCall) else Text(d) for d in self._stream.feed(text)]

    def finish(self) -> list:
        if self._stream is None:
            return []
        return [d if isinstance(d, ToolCall) else Text(d) for d in self._stream.finish()]


def _reader(completion) -> _Reader:
    return _Reader(completion.tool_stream())


async def _collect(completion, reader: _Reader, response: Response) -> dict:
    pieces, last = [], None
    async for chunk in completion.chunks():
        pieces.extend(reader.feed(chunk.text))
        last = chunk
    pieces.extend(reader.finish())
    assert last is not None
    output = output_items(pieces, response.namespaces)
    status, details = status_of(last.finish_reason, output, requested=response.echo.get("max_output_tokens"),
                                output_tokens=last.completion_tokens)
    return response.body(status=status, output=output, incomplete_details=details,
                         usage=usage(last.prompt_tokens, last.cached_tokens, last.completion_tokens))


async def _stream(completion, reader: _Reader, events: EventStream, req: ResponsesRequest, items: list[dict]):
    start = events.start()
    if req.store:
        store.streaming(start[0]["response"], req.owner)        # GET shows it in_progress until it is written
    try:
        async with completion, aclosing(_events(completion, reader, events, req, items)) as stream:
            yield b"".join(sse(e) for e in start)
            async for out in stream:
                yield out
    finally:
        store.streamed(start[0]["response"]["id"])


async def _events(completion, reader: _Reader, events: EventStream, req: ResponsesRequest, items: list[dict]):
    try:
        async for chunk in until_first(completion.chunks(), get_runtime().settings.sse_keepalive):
            if chunk is KEEPALIVE:
                yield KEEPALIVE_COMMENT
                continue
            out = [e for piece in reader.feed(chunk.text) for e in events.feed(piece)]
            if chunk.finish_reason is not None:
                out += [e for piece in reader.finish() for e in events.feed(piece)]
                out += events.finish(finish_reason=chunk.finish_reason, usage=usage(
                    chunk.prompt_tokens, chunk.cached_tokens, chunk.completion_tokens))
                assert events.final is not None
                if req.store:       # stored before its final event: a failure is the error event instead
                    if out:
                        yield b"".join(sse(e) for e in out)
                    out = []
                    await store.keep(events.final, items, req.input, events.final["output"], req.owner)
                out.append(events.final_event())
            if out:
                yield b"".join(sse(e) for e in out)
    except Exception as e:  # the stream has begun: error and response.failed events
        error = e if isinstance(e, PoolError) else internal()
        if error is not e:
            log.exception("unexpected error in a responses stream", exc_info=e)
        detail = envelope(error, OPENAI)["error"]
        yield b"".join(sse(x) for x in events.fail(code=detail["code"], message=detail["message"],
                                                   param=detail["param"]))


# ---- stored responses ----------------------------------------------------------------------------

@api_route("GET", "DELETE", auth=require_key)
async def retrieve(request, response_id: str):
    """The stored response; with ?stream=true its stream's events again (`starting_after` a sequence
    number), as the SDK's `retrieve(id, stream=True)` reads them."""
    if request.method == "DELETE":
        await store.delete(response_id, owner(request))
        return JsonResponse({"id": response_id, "object": "response", "deleted": True})
    body = await store.get(response_id, owner(request))
    if request.GET.get("stream", "false").lower() not in ("true", "1"):
        return JsonResponse(body)
    after = request.GET.get("starting_after")
    after = -1 if after is None else integer({"starting_after": _int(after)}, "starting_after", minimum=0)
    return HttpResponse(b"".join(sse(e) for e in replay(body) if e["sequence_number"] > after),
                        content_type="text/event-stream", headers={"Cache-Control": "no-cache"})


@api_route("GET", auth=require_key)
async def input_items(request, response_id: str):
    """The conversation's input items (earlier turns included), newest first unless ?order=asc."""
    items = await store.input_items(response_id, owner(request))
    limit = integer({"limit": _int(request.GET.get("limit", "20"))}, "limit", minimum=1, maximum=100)
    if request.GET.get("order", "desc") == "desc":
        items = items[::-1]
    data = items[:limit]
    return JsonResponse({"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                         "last_id": data[-1]["id"] if data else None, "has_more": len(items) > len(data)})


def _int(text: str):
    try:
        return int(text)
    except ValueError:
        return text
