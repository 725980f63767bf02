"""Ollama's POST /api/chat and POST /api/generate, through the router as the OpenAI routes: NDJSON
lines while streaming (the default, as Ollama's), one object otherwise, the last carrying Ollama's
counters (durations in nanoseconds), and `logprobs` when asked. An empty /api/generate or /api/chat
(no prompt, no messages) loads the model (or unloads it with `keep_alive: 0`), as Ollama's does;
`suffix` is fill-in-the-middle where the model's tokenizer has the tokens for it."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone

from django.http import JsonResponse

from ...catalog.fim import fill_in_the_middle, fim_tokens
from ...catalog.kinds import CHAT
from ...errors import InvalidRequest
from ...policy.vocabulary import ModelState
from ...runtime import get_runtime
from ...serving.specs import CompletionSpec
from ...tools.calls import ToolCall
from .. import wants
from ..auth import require_key
from ..dialects import OLLAMA
from ..fields import json_body, off_loop
from ..route import api_route
from ..sse import event_stream
from .parse import parse_chat, parse_generate

NDJSON = "application/x-ndjson"


def created_at() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def line(body: dict) -> bytes:
    return json.dumps(body).encode() + b"\n"


class Clock:
    """Ollama's counters: from the request's start, the model's (its wait and load), the prompt's
    (to the first token) and the answer's."""

    def __init__(self):
        self.start = time.monotonic()
        self.opened = self.first = self.end = self.start

    def counters(self, final) -> dict:
        ns = lambda seconds: int(max(0.0, seconds) * 1e9)
        return {"total_duration": ns(self.end - self.start), "load_duration": ns(self.opened - self.start),
                "prompt_eval_count": final.prompt_tokens if final else 0,
                "prompt_eval_cached_count": final.cached_tokens if final else 0,
                "prompt_eval_duration": ns(self.first - self.opened),
                "eval_count": final.completion_tokens if final else 0, "eval_duration": ns(self.end - self.first)}


class Answer:
    """The engine's chunks as Ollama's message parts: text, and tool calls with object arguments."""

    def __init__(self, completion):
        self.tools = completion.tool_stream()
        self.calls = 0

    def feed(self, text: str) -> list:
        return [self._part(d) for d in self.tools.feed(text)] if self.tools is not None else ([text] if text else [])

    def finish(self) -> list:
        return [self._part(d) for d in self.tools.finish()] if self.tools is not None else []

    def _part(self, delta):
        if isinstance(delta, ToolCall):
            self.calls += 1
            try:
                arguments = json.loads(delta.arguments or "{}")
            except ValueError:
                arguments = {}
            return {"function": {"name": delta.name, "arguments": arguments}}
        return delta


def _reason(final, answer: Answer) -> str:
    return "stop" if final is None or answer.calls or final.finish_reason != "length" else "length"


LOWEST_LOGPROB = -9999.0   # a token a constraint rules out (-inf): JSON has no -Infinity


def _logprob(value: float) -> float:
    return max(value, LOWEST_LOGPROB)


def logprobs_field(entries) -> dict:
    """Ollama's `logprobs`: [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
    "bytes"}]}], `top_logprobs` only when asked for (Go's omitempty)."""
    out = []
    for e in entries:
        entry = {"token": e.token, "logprob": _logprob(e.logprob), "bytes": list(e.bytes)}
        if e.top:
            entry["top_logprobs"] = [{"token": t, "logprob": _logprob(lp), "bytes": list(b)} for t, lp, b in e.top]
        out.append(entry)
    return {"logprobs": out}


async def _answer(completion, clock: Clock, frame, *, stream: bool, logprobs: bool):
    """Yields the NDJSON lines (stream) or, at the end, the one whole object (not stream). Each line
    carries the logprobs of the tokens since the line before it (text a tool parser holds back too)."""
    answer, texts, calls, final, entries = Answer(completion), [], [], None, []
    async with completion:
        async for chunk in completion.chunks():
            if clock.first == clock.opened:
                clock.first = time.monotonic()
            parts = answer.feed(chunk.text)
            entries.extend(chunk.logprobs)
            if chunk.finish_reason is not None:
                final = chunk
                parts += answer.finish()
            for part in parts:
                if stream:
                    yield line({**frame(part), **(logprobs_field(entries) if logprobs else {}), "done": False})
                    entries = []
                elif isinstance(part, str):
                    texts.append(part)
                else:
                    calls.append(part)
    clock.end = time.monotonic()
    last = frame("") if stream else frame("".join(texts), calls)
    if logprobs:
        last.update(logprobs_field(entries))
    yield line({**last, "done": True, "done_reason": _reason(final, answer), **clock.counters(final)})


async def _respond(completion, clock: Clock, frame, stream: bool, logprobs: bool):
    answer = _answer(completion, clock, frame, stream=stream, logprobs=logprobs)
    if stream:
        return await event_stream(completion, answer, OLLAMA, content_type=NDJSON)
    body = b"".join([piece async for piece in answer])
    return JsonResponse(json.loads(body))


# ---- /api/chat -----------------------------------------------------------------------------------

@api_route("POST", auth=require_key, dialect=OLLAMA, wants=wants.ollama_chat)
async def chat(request):
    req = await off_loop(parse_chat, json_body(request))
    clock = Clock()
    router = get_runtime().router
    model = req.spec.model      # the name as the client wrote it, as Ollama echoes it

    def frame(part, calls=()):
        message = {"role": "assistant", "content": part if isinstance(part, str) else ""}
        if not isinstance(part, str) or calls:
            message["tool_calls"] = list(calls) or [part]
        return {"model": model, "created_at": created_at(), "message": message}

    if not req.spec.messages:
        reason = await _load_or_unload(router, model, req.spec.keep_alive)
        return JsonResponse({**frame(""), "done": True, "done_reason": reason})
    completion = await router.generate(req.spec)
    clock.opened = clock.first = time.monotonic()
    return await _respond(completion, clock, frame, req.stream, req.spec.logprobs is not None)


# ---- /api/generate -------------------------------------------------------------------------------

@api_route("POST", auth=require_key, dialect=OLLAMA, wants=wants.ollama_generate)
async def generate(request):
    req = await off_loop(parse_generate, json_body(request))
    router = get_runtime().router
    if req.empty:
        reason = await _load_or_unload(router, req.model, req.fields.get("keep_alive"))
        return JsonResponse({"model": req.model, "created_at": created_at(), "response": "", "done": True,
                             "done_reason": reason})
    target = router.resolve(req.model)
    fields = req.fields
    if req.suffix is not None:
        tokens = fim_tokens(target.model.card_folder)
        if tokens is None:
            raise InvalidRequest(f"suffix: '{target.model_id}' has no fill-in-the-middle tokens in its tokenizer; "
                                 "use a code model that has them (Qwen2.5-Coder, StarCoder2, DeepSeek-Coder, ...)",
                                 param="suffix")
        spec = CompletionSpec(model=target.model_id, prompt=fill_in_the_middle(tokens, req.prompt, req.suffix),
                              **fields)
    elif req.raw:
        spec = CompletionSpec(model=target.model_id, prompt=req.prompt, **fields)
    else:
        system = [{"role": "system", "content": req.system}] if req.system else []
        spec = CompletionSpec(model=target.model_id, messages=[*system, {"role": "user", "content": req.content}],
                              **fields)
    clock = Clock()
    completion = await router.generate(spec)
    clock.opened = clock.first = time.monotonic()
    model = req.model

    def frame(part, calls=()):
        return {"model": model, "created_at": created_at(), "response": part if isinstance(part, str) else ""}

    return await _respond(completion, clock, frame, req.stream, req.fields.get("logprobs") is not None)


async def _load_or_unload(router, name: str, keep_alive: float | None) -> str:
    """Ollama's verbs, an empty generate or chat: load the model, or with keep_alive 0 unload it;
    Ollama's done_reason."""
    target = router.resolve(name)
    if keep_alive == 0:
        if target.model.state == ModelState.LOADED:
            await router.unload(target.model_id)
        return "unload"
    async with router.lease(target.model_id, CHAT, keep_alive=keep_alive):
        pass
    return "load"
