"""A completion on this host: a chat's `messages` or a text `prompt` in, chunks of text out.

`open_completion` takes the model through the door (door.py: kind, queue, gate, lease, slot), renders
a chat's tools and tool history (pool.tools) and encodes the prompt on a worker thread, fits it and
max_tokens into the model's context (pool/policy/limits.py), applies the prefill guard and starts
generation. A prompt too large for the context is refused by its size before any wait or
tokenising; a request refused after it was tokenised trims the heap it left. A forced tool call
(tool_choice "required" or a named function) is a tool-call constraint. `count_tokens` renders and
encodes the same prompt without a slot or generation. The `Completion` it returns yields the
engine's chunks (engine errors mapped by door.engine_errors) and `aclose()` releases everything.
Routes parse and frame; they never see an engine."""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack, aclosing
from typing import Any, AsyncIterator

from jinja2 import TemplateError

from ..catalog.kinds import CHAT, model_card
from ..engines.protocol import Chunk, SamplingParams, TextGenerator
from ..errors import ContextLengthExceeded, InvalidRequest, ModelCannotSeeImages
from ..host.entries import Entry
from ..policy import limits
from ..policy.kv import KVConfig, KVFieldError, kv_config
from ..tools.calls import ToolCall
from ..tools.formats import ToolFormat, request_format, tool_format
from ..tools.prompt import prepare_messages
from ..tools.request import ToolRequest
from ..tools.stream import ToolStream, split_tool_calls
from ..traces.flow import cancelled_error, settled, traced, was_cancelled
from ..traces.trace import current as current_trace
from .constraints import UnsupportedSchema, tool_calls
from .door import Door, engine_errors
from .images import has_images
from .specs import CompletionSpec


class Completion:
    """One admitted, leased, encoded request. Iterate `chunks()` once; always `aclose()`."""

    def __init__(self, model_id: str, engine: TextGenerator, tokens: list[int], params: SamplingParams,
                 stack: AsyncExitStack, *, tool_format: ToolFormat | None = None,
                 tool_request: ToolRequest | None = None):
        self.model_id = model_id
        self.prompt_tokens = len(tokens)
        self.n = params.n
        # how this request's tool calls look (pool.tools): set when the answer is to be parsed for
        # calls (tools given, tool_choice not "none"); None otherwise
        self.tool_format = tool_format
        self.tool_request = tool_request
        self._engine, self._tokens, self._params, self._stack = engine, tokens, params, stack
        self.trace = current_trace.get()

    def tool_stream(self) -> ToolStream | None:
        """A parser of one choice's text into content and tool calls, when the answer is to be
        parsed for calls; None otherwise."""
        tools = self.tool_request
        if self.tool_format is None or tools is None:
            return None
        return ToolStream(self.tool_format, tools=tools.tools, parallel=tools.parallel_tool_calls)

    def split_tool_calls(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """A whole answer -> (content, calls); content None when the answer is only calls."""
        tools = self.tool_request
        if self.tool_format is None or tools is None:
            return text, []
        return split_tool_calls(text, self.tool_format, tools=tools.tools, parallel=tools.parallel_tool_calls)

    async def chunks(self) -> AsyncIterator[Chunk]:
        with engine_errors():
            chunks = self._engine.generate(self._tokens, self._params)
            if self.trace is not None:
                chunks = traced(self.trace, chunks)
            async with aclosing(chunks):
                async for chunk in chunks:
                    yield chunk

    async def aclose(self) -> None:
        if self.trace is not None:
            settled(self.trace, self._engine, self._params)
        await self._stack.aclose()

    async def __aenter__(self) -> "Completion":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


async def open_completion(door: Door, model_id: str, spec: CompletionSpec) -> Completion:
    context: int | None = None

    def check(entry: Entry) -> None:     # before any wait or load
        nonlocal context
        context = context_length(entry, door.pool.conf.context_fallback)
        if spec.context_limit is not None:
            context = min(context, spec.context_limit)
        _check_prompt_size(spec, context, door.pool.conf.prompt_chars_per_token)
        _check_vision(spec, entry)

    tool_request = _tool_request(spec)
    constraint = _forced_call(tool_request) or spec.constraint   # a forced call outranks response_format
    stack = AsyncExitStack()
    tokens = None
    try:
        lease = await stack.enter_async_context(door.acquire(model_id, CHAT, keep_alive=spec.keep_alive, check=check))
        entry, engine = lease.entry, lease.engine
        kv = _kv(spec, entry.model_settings, engine.model_info)
        _check_logit_bias(spec, engine.vocab_size)
        fmt, tokens, checkpoints = await _prompt(engine, spec, tool_request)
        max_tokens = _fit_context(spec, len(tokens), context, entry.model_settings.get("max_tokens")
                                  or door.pool.conf.default_max_tokens)
        if constraint is not None:
            await asyncio.to_thread(engine.prepare_constraints)
        # each choice holds its own copy of the prompt's KV
        door.gate.check_prefill(entry.id, engine.model_info, len(tokens), door.pool.views(), choices=spec.n,
                                param=spec.prompt_param, live_kv_bytes=door.pool.live_kv_bytes(), kv=kv,
                                prefill_chunk=max(door.pool.prefill_step, door.pool.prefill_step_alone))
        shown = tool_request is not None and tool_request.shown
        if (trace := current_trace.get()) is not None:
            trace.task = None
            trace.prefilling(len(tokens))
            trace.image_tokens = getattr(tokens, "image_tokens", 0)
        params = _sampling(spec, entry.model_settings, kv, max_tokens, constraint, checkpoints)
        return Completion(entry.id, engine, tokens, params, stack, tool_format=fmt if shown else None,
                          tool_request=tool_request)
    except BaseException as e:
        await stack.aclose()
        if was_cancelled(current_trace.get(), e):
            raise cancelled_error() from None
        if tokens is not None and isinstance(e, InvalidRequest):
            # what tokenising a refused prompt freed stays in glibc's heap until trimmed
            tokens = None
            await asyncio.to_thread(engine.trim_heap)
        raise


async def count_tokens(door: Door, model_id: str, spec: CompletionSpec) -> int:
    """The prompt's length in tokens exactly as open_completion encodes it (tools included). It
    leases the model (loading it if needed, through the gate) but takes no concurrency slot and
    generates nothing."""
    def check(entry: Entry) -> None:
        _check_prompt_size(spec, context_length(entry, door.pool.conf.context_fallback),
                           door.pool.conf.prompt_chars_per_token)
        _check_vision(spec, entry)

    tool_request = _tool_request(spec)
    async with door.acquire(model_id, CHAT, keep_alive=spec.keep_alive, slot=False, check=check) as lease:
        _, tokens, _ = await _prompt(lease.engine, spec, tool_request, checkpoints=False)
        return len(tokens)


def context_length(entry: Entry, fallback: int) -> int:
    """The model's context length (its config.json, read without loading it)."""
    return limits.context_length(model_card(entry.card_folder, entry.kind)["context_length"], fallback)


def _check_prompt_size(spec: CompletionSpec, context: int, chars_per_token: int) -> None:
    """Refuse, before tokenising, a prompt too long to fit the context (tokenising a 10 MB prompt
    took 24 s and left 641 MiB resident; lone surrogates never get here: pool/strict_json.py)."""
    tools = len(json.dumps(spec.tools, ensure_ascii=False)) if spec.tools else 0   # the template renders them
    chars = limits.prompt_chars(spec.messages, spec.prompt) + tools
    limit = limits.max_prompt_chars(context, chars_per_token)
    if chars > limit:
        raise ContextLengthExceeded(part=ContextLengthExceeded.CHARACTERS, context=context,
                                    prompt_param="tools" if tools > limit else spec.prompt_param, characters=chars,
                                    max_characters=limit, chars_per_token=chars_per_token)


def _check_vision(spec: CompletionSpec, entry: Entry) -> None:
    """Images only for a model that sees them: refused before any wait or load. A vision model's
    engine (mlx-vlm's stream_generate) makes one answer per request."""
    sees = "vision" in model_card(entry.card_folder, entry.kind)["capabilities"]
    if has_images(spec.messages) and not sees:
        raise ModelCannotSeeImages(model=entry.id)
    if spec.n > 1 and sees:
        raise InvalidRequest(f"The model '{entry.id}' makes one answer per request; 'n' must be 1.", param="n")


def _fit_context(spec: CompletionSpec, prompt_tokens: int, context: int, default: int | None) -> int:
    """The max_tokens the engine gets: the client's if it fits beside the prompt, else refused; a
    default (None: the whole context) lowered to what fits."""
    fit = limits.fit_context(prompt_tokens=prompt_tokens, requested=spec.max_tokens,
                             default=context if default is None else int(default), context=context)
    if fit.refused is None:
        return fit.max_tokens
    part = ContextLengthExceeded.PROMPT if fit.refused == limits.PROMPT else ContextLengthExceeded.COMPLETION
    raise ContextLengthExceeded(part=part, context=context, prompt_param=spec.prompt_param,
                                prompt_tokens=prompt_tokens, max_tokens=spec.max_tokens)


def _tool_request(spec: CompletionSpec) -> ToolRequest | None:
    if spec.messages is None or not spec.tools:
        return None
    return ToolRequest(tuple(spec.tools), spec.tool_choice or "auto", spec.parallel_tool_calls)


def _forced_call(tool_request: ToolRequest | None) -> Any:
    """The constraint of tool_choice "required" or a named function: the answer is a call in the
    fallback format (request_format prompts and parses such a request in that format)."""
    if tool_request is None or not tool_request.forces_call:
        return None
    try:
        return tool_calls(list(tool_request.tools), tool_request.forced_name, tool_request.parallel_tool_calls)
    except UnsupportedSchema as e:
        raise InvalidRequest(f"'tools': a function's parameters cannot be enforced for a forced call: {e.feature}",
                         param="tools") from None
    except ValueError as e:   # a named function that is not among the tools
        raise InvalidRequest(f"'tool_choice': {e}", param="tool_choice") from None


def _uses_tools(messages: list[dict], tool_request: ToolRequest | None) -> bool:
    return tool_request is not None or any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)


def _chat_prompt(engine: TextGenerator, messages: list[dict], tool_request: ToolRequest | None):
    """On a worker thread (a tokenizer's first tool_format renders its template twice): the request's
    tool format, and the messages and `tools=` its chat template gets."""
    fmt = request_format(tool_format(engine.tokenizer), tool_request)
    return (fmt, *prepare_messages(messages, tool_request, fmt))


async def _prompt(engine: TextGenerator, spec: CompletionSpec, tool_request: ToolRequest | None, *,
                  checkpoints: bool = True) -> tuple[ToolFormat | None, list[int], tuple[int, ...]]:
    """(the request's tool format or None, its prompt tokens, where the prompt cache keeps its KV
    for a model whose cache cannot be cut back). A chat with tools or tool history is rendered
    through pool.tools first; its InvalidRequest keeps the field it names."""
    fmt, messages, template_tools = None, spec.messages, None
    if spec.messages is not None and _uses_tools(spec.messages, tool_request):
        fmt, messages, template_tools = await asyncio.to_thread(_chat_prompt, engine, spec.messages, tool_request)
    tokens = await _encode(engine, spec, messages, template_tools)
    layout = engine.model_info.get("kv_layout")
    if not checkpoints or messages is None or not spec.cache_prompt or layout is None or layout.trimmable:
        return fmt, tokens, ()
    return fmt, tokens, await asyncio.to_thread(engine.chat_checkpoints, messages, template_tools, tokens)


async def _encode(engine: TextGenerator, spec: CompletionSpec, messages: list[dict] | None,
                  template_tools: list[dict] | None) -> list[int]:
    try:
        if messages is not None and template_tools:
            return await asyncio.to_thread(engine.encode_chat, messages, template_tools)
        if messages is not None:
            return await asyncio.to_thread(engine.encode_chat, messages)
        return await asyncio.to_thread(engine.encode_text, spec.prompt)
    except Exception as e:  # noqa: BLE001 - input the tokenizer rejects is the client's to fix
        if spec.messages is None:
            what = "tokenizer rejected the prompt"
        elif isinstance(e, TemplateError):
            what = "chat template rejected the messages"
        else:
            what = "tokenizer rejected the messages"
        raise InvalidRequest(f"The model's {what}: {e}", param=spec.prompt_param) from None


def _kv(spec: CompletionSpec, defaults: dict, model_info: dict) -> KVConfig:
    try:
        return kv_config(spec.kv, defaults, layout=model_info.get("kv_layout"),
                         quantized_kv=model_info.get("quantized_kv", True))
    except KVFieldError as e:
        where = "" if e.field in spec.kv else " (the model's default)"
        raise InvalidRequest(f"{e}{where}", param=e.field) from None


def _check_logit_bias(spec: CompletionSpec, vocab_size: int | None) -> None:
    if vocab_size is None:
        return
    outside = [token for token, _ in spec.logit_bias if token >= vocab_size]
    if outside:
        raise InvalidRequest(f"'logit_bias' names token {outside[0]}, outside this model's vocabulary "
                         f"(0 to {vocab_size - 1})", param="logit_bias")


def _sampling(spec: CompletionSpec, defaults: dict, kv: KVConfig, max_tokens: int,
              constraint: Any = None, checkpoints: tuple[int, ...] = ()) -> SamplingParams:
    def pick(value, name, fallback):
        if value is not None:
            return value
        return defaults.get(name) if defaults.get(name) is not None else fallback
    return SamplingParams(max_tokens=max_tokens,
                          temperature=float(pick(spec.temperature, "temperature", 0.0)),
                          top_p=float(pick(spec.top_p, "top_p", 1.0)), stop=spec.stop, seed=spec.seed,
                          cache_prompt=spec.cache_prompt, kv=kv, n=spec.n, logit_bias=spec.logit_bias,
                          presence_penalty=spec.presence_penalty, frequency_penalty=spec.frequency_penalty,
                          repetition_penalty=spec.repetition_penalty, logprobs=spec.logprobs,
                          constraint=constraint, cache_scope=spec.cache_scope, checkpoints=checkpoints,
                          progress=current_trace.get())
