"""OpenAI-style routes: /v1/models, /v1/chat/completions, /v1/completions (SSE when streaming)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import AsyncExitStack

from django.http import JsonResponse, StreamingHttpResponse

from ..engines.engine import EngineError, RequestAborted, SamplingParams
from ..errors import BadRequest, EngineFailure, ServiceUnavailable
from ..runtime import get_runtime
from .auth import require_key
from .errors import sse_error
from .parse import CompletionRequest, json_body, parse_completion
from .route import api_route

DEFAULT_MAX_TOKENS = 512


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


def _sampling(req: CompletionRequest, defaults: dict) -> SamplingParams:
    def pick(value, name, fallback):
        return value if value is not None else (defaults.get(name) if defaults.get(name) is not None else fallback)
    return SamplingParams(max_tokens=int(pick(req.max_tokens, "max_tokens", DEFAULT_MAX_TOKENS)),
                          temperature=float(pick(req.temperature, "temperature", 0.0)),
                          top_p=float(pick(req.top_p, "top_p", 1.0)), stop=req.stop, seed=req.seed)


async def _encode(engine, req: CompletionRequest) -> list[int]:
    try:
        if req.messages is not None:
            return await asyncio.to_thread(engine.encode_chat, req.messages)
        return await asyncio.to_thread(engine.encode_text, req.prompt)
    except Exception as e:  # noqa: BLE001 - a template that rejects the conversation is the client's to fix
        raise BadRequest(f"The model's chat template rejected the messages: {e}",
                         param="messages" if req.messages is not None else "prompt") from None


def _aborted(e: RequestAborted) -> ServiceUnavailable:
    return ServiceUnavailable(f"The request was aborted: {e}", code=getattr(e, "code", "request_aborted"))


async def _complete(request, *, chat: bool):
    runtime = get_runtime()
    req = parse_completion(json_body(request), chat=chat)
    entry = runtime.pool.resolve(req.model)
    await runtime.enforcer.admit()
    stack = AsyncExitStack()
    try:
        engine = await stack.enter_async_context(runtime.pool.lease(entry.id, keep_alive=req.keep_alive))
        tokens = await _encode(engine, req)
        runtime.enforcer.check_prefill(entry, engine, len(tokens), param="messages" if chat else "prompt")
        params = _sampling(req, entry.settings)
        shape = _Shape(chat=chat, model=entry.id)
        if req.stream:
            events = _stream(engine, tokens, params, shape, req.include_usage, stack)
            first = await events.__anext__()  # started, so a dropped response still releases the lease
            return StreamingHttpResponse(_prepend(first, events), content_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        async with stack:
            return JsonResponse(await _collect(engine, tokens, params, shape))
    except BaseException:
        await stack.aclose()
        raise


class _Shape:
    """The OpenAI object shapes for one response."""

    def __init__(self, *, chat: bool, model: str):
        self.chat, self.model = chat, model
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

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

    def usage_chunk(self, usage) -> dict:
        return {**self._base(True), "choices": [], "usage": usage}


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


async def _collect(engine, tokens, params, shape: _Shape) -> dict:
    parts, last = [], None
    try:
        async for chunk in engine.generate(tokens, params):
            parts.append(chunk.text)
            last = chunk
    except RequestAborted as e:
        raise _aborted(e) from None
    except EngineError as e:
        raise EngineFailure(f"The engine failed: {e}") from None
    return shape.body("".join(parts), last.finish_reason, _usage(last.prompt_tokens, last.completion_tokens))


def _sse(obj) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


async def _stream(engine, tokens, params, shape: _Shape, include_usage: bool, stack: AsyncExitStack):
    async with stack:
        if shape.chat:
            yield _sse(shape.chunk(None, first=True))
        else:
            yield b": stream start\n\n"
        try:
            async for chunk in engine.generate(tokens, params):
                if chunk.text or chunk.finish_reason is None:
                    yield _sse(shape.chunk(chunk.text))
                if chunk.finish_reason is not None:
                    yield _sse(shape.chunk(None, chunk.finish_reason))
                    if include_usage:
                        yield _sse(shape.usage_chunk(_usage(chunk.prompt_tokens, chunk.completion_tokens)))
        except RequestAborted as e:
            yield sse_error(_aborted(e))
        except EngineError as e:
            yield sse_error(EngineFailure(f"The engine failed: {e}"))
        yield b"data: [DONE]\n\n"


async def _prepend(first, rest):
    yield first
    async for item in rest:
        yield item
