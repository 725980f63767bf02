"""OpenAI-style routes: /v1/models, /v1/chat/completions, /v1/completions (SSE when streaming)."""

from __future__ import annotations

import json
import time
import uuid

from django.http import JsonResponse, StreamingHttpResponse

from ..errors import PoolError
from ..runtime import get_runtime
from ..serving import Completion
from .auth import require_key
from .errors import sse_error
from .parse import json_body, parse_completion
from .route import api_route


def _model_object(entry) -> dict:
    created = int(entry.path.stat().st_mtime) if entry.path.exists() else 0
    return {"id": entry.id, "object": "model", "created": created, "owned_by": "omlx-site",
            "alias": entry.alias, "state": entry.state, "size_bytes": entry.size_bytes}


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
    shape = _Shape(chat=chat, model=completion.model_id)
    if not req.stream:
        async with completion:
            return JsonResponse(await _collect(completion, shape))
    events = _stream(completion, shape, req.include_usage)
    try:
        first = await events.__anext__()  # inside its `async with`: a dropped response still releases the lease
    except BaseException:
        await completion.aclose()
        raise
    return StreamingHttpResponse(_prepend(first, events), content_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


_MARK = "\x00text"    # stands for the text in text_event's template; no JSON encodes anything else so


class _Shape:
    """The OpenAI object shapes for one response."""

    def __init__(self, *, chat: bool, model: str):
        self.chat, self.model = chat, model
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self._text_event: list[bytes] | None = None

    def _base(self, chunk: bool) -> dict:
        kind = "chat.completion" if self.chat else "text_completion"
        return {"id": self.id, "object": kind + (".chunk" if chunk and self.chat else ""),
                "created": self.created, "model": self.model}

    def choice(self, text: str | None, finish_reason, *, chunk: bool, first: bool = False) -> dict:
        if not self.chat:
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        if not chunk:
            return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                    "finish_reason": finish_reason}
        delta = {"role": "assistant", "content": ""} if first else ({"content": text} if text else {})
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}

    def body(self, text, finish_reason, usage) -> dict:
        return {**self._base(False), "choices": [self.choice(text, finish_reason, chunk=False)], "usage": usage}

    def chunk(self, text, finish_reason=None, *, first=False) -> dict:
        return {**self._base(True), "choices": [self.choice(text, finish_reason, chunk=True, first=first)]}

    def text_event(self, text: str) -> bytes:
        """The SSE event of one streamed piece of text. It is sent once per engine step per stream, so
        its fixed parts are encoded once per response and only the text per call."""
        if self._text_event is None:
            event = _sse(self.chunk(_MARK))
            self._text_event = event.split(json.dumps(_MARK).encode())
        head, tail = self._text_event
        return head + json.dumps(text).encode() + tail

    def usage_chunk(self, usage) -> dict:
        return {**self._base(True), "choices": [], "usage": usage}


def _usage(chunk) -> dict:
    return {"prompt_tokens": chunk.prompt_tokens, "completion_tokens": chunk.completion_tokens,
            "total_tokens": chunk.prompt_tokens + chunk.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": chunk.cached_tokens}}


async def _collect(completion: Completion, shape: _Shape) -> dict:
    parts, last = [], None
    async for chunk in completion.chunks():
        parts.append(chunk.text)
        last = chunk
    return shape.body("".join(parts), last.finish_reason, _usage(last))


def _sse(obj) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


async def _stream(completion: Completion, shape: _Shape, include_usage: bool):
    async with completion:
        if shape.chat:
            yield _sse(shape.chunk(None, first=True))
        else:
            yield b": stream start\n\n"
        try:
            async for chunk in completion.chunks():
                if chunk.text or chunk.finish_reason is None:
                    yield shape.text_event(chunk.text)
                if chunk.finish_reason is not None:
                    yield _sse(shape.chunk(None, chunk.finish_reason))
                    if include_usage:
                        yield _sse(shape.usage_chunk(_usage(chunk)))
        except PoolError as e:
            yield sse_error(e)
        yield b"data: [DONE]\n\n"


async def _prepend(first, rest):
    yield first
    async for item in rest:
        yield item
