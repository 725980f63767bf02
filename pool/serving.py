"""The serving door: the one way a request reaches an engine.

`open_completion` admits the request (the gate memory pressure closes), takes a lease on its model
(loading it, evicting others, if needed), waits for one of the model's concurrency slots
(pool/concurrency.py), renders a chat's tools and tool history (pool.tools) and encodes the prompt
on a worker thread, fits it and max_tokens into the model's context (pool/policy/limits.py), applies
the prefill guard and starts generation. A prompt too large for the context is refused by its size
before it is tokenised; a request refused after it was tokenised trims the heap it left. A forced tool call
(tool_choice "required" or a named function) is a tool-call constraint. `count_tokens` renders
and encodes the same prompt without a slot or generation. The `Completion` it returns yields the engine's chunks with
engine errors mapped to the pool's domain errors, and `aclose()` releases everything. Routes parse
and frame; they never see an engine."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from jinja2 import TemplateError

from .admission import Admission
from .capabilities import model_card
from .discovery import CHAT
from .engine_pool import EnginePool
# the constraints a request can carry, for the routes (which never import an engine module)
from .engines.constraints import UnsupportedSchema, json_object, json_schema, tool_calls  # noqa: F401
from .engines.constraints import prepare as prepare_grammar
from .engines.native import trim_native_heap
from .engines.types import Chunk, EngineError, EngineLike, RequestAborted, SamplingParams
from .errors import BadRequest, ContextLengthExceeded, EngineFailure, ModelQueueFull, ServiceUnavailable
from .policy import limits
from .policy.kv import KVConfig, KVFieldError, kv_config
from .policy.vocabulary import Rejection
from .tools import ToolFormat, ToolRequest, prepare_messages, request_format, tool_format

DEFAULT_MAX_TOKENS = 512


@dataclass(frozen=True)
class CompletionSpec:
    """A parsed request: chat `messages` or a completion `prompt`. None = the model's default."""
    model: str
    messages: list[dict] | None = None
    prompt: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    keep_alive: float | None = None
    cache_prompt: bool = True
    kv: dict = field(default_factory=dict)     # max_kv_size, kv_bits, ...: the request's own, if given
    n: int = 1                                 # choices from the one prompt
    logprobs: int | None = None                # None: off; k: each token's logprob and the top k
    logit_bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float | None = None
    constraint: Any = None                     # has make_processor(tokenizer): constrained decoding
    tools: tuple[dict, ...] = ()               # OpenAI function tools, for the chat template
    tool_choice: Any = None
    parallel_tool_calls: bool = True

    @property
    def prompt_param(self) -> str:
        return "messages" if self.messages is not None else "prompt"


class Completion:
    """One admitted, leased, encoded request. Iterate `chunks()` once; always `aclose()`."""

    def __init__(self, model_id: str, engine: EngineLike, tokens: list[int], params: SamplingParams,
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

    async def chunks(self) -> AsyncIterator[Chunk]:
        try:
            async for chunk in self._engine.generate(self._tokens, self._params):
                yield chunk
        except RequestAborted as e:
            raise ServiceUnavailable(f"The request was aborted: {e}", code=e.code) from None
        except EngineError as e:
            raise EngineFailure(f"The engine failed: {e}") from None

    async def aclose(self) -> None:
        await self._stack.aclose()

    async def __aenter__(self) -> "Completion":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


class Serving:
    def __init__(self, pool: EnginePool, admission: Admission):
        self.pool = pool
        self.admission = admission

    async def open_completion(self, spec: CompletionSpec) -> Completion:
        entry = self.pool.resolve(spec.model)
        self.pool.require_kind(entry, CHAT)      # an embedding model: a 400 at once, before any wait
        context = self._context(entry)
        _check_prompt_size(spec, context, self.pool.conf.prompt_chars_per_token)   # before any wait or load
        tool_request = _tool_request(spec)
        constraint = _forced_call(tool_request) or spec.constraint   # a forced call outranks response_format
        self._refuse_if_queue_full(entry.id)     # at once: before any admission wait, lease or load
        await self.admission.admit()
        stack = AsyncExitStack()
        tokens = None
        try:
            engine = await stack.enter_async_context(self.pool.lease(entry.id, keep_alive=spec.keep_alive))
            # The slot is taken after the lease. A request queues only while the model runs its
            # limit, whose leases keep it loaded anyway, so a queued request's lease neither loads
            # the model nor keeps it busy longer than its running requests do. Taken before the
            # lease, each hand-over would leave the model unleased until the waiter ran: free for
            # the enforcer or another model's load to evict, and for the waiter to reload (evictions
            # in a loop). Unwinding hands the slot on before this request's lease ends.
            await self._take_slot(stack, entry.id)
            if entry.engine is not engine:
                raise ServiceUnavailable(f"The model '{entry.id}' was unloaded while the request waited "
                                         "for a slot; retry.", code="model_unloaded")
            kv = _kv(spec, entry.settings, engine.model_info)
            _check_logit_bias(spec, getattr(engine, "vocab_size", None))
            fmt, tokens = await _prompt(engine, spec, tool_request)
            max_tokens = _fit_context(spec, len(tokens), context, entry.settings)
            if constraint is not None and getattr(engine, "tokenizer", None) is not None:
                # the tokenizer's grammar tables (about 1 s, once per model) are built here rather
                # than on the engine thread, where they would stall the model's running streams
                await asyncio.to_thread(prepare_grammar, engine.tokenizer)
            # each choice holds its own copy of the prompt's KV
            self.admission.check_prefill(entry.id, engine.model_info, len(tokens) * spec.n, self.pool.views(),
                                         param=spec.prompt_param, live_kv_bytes=self.pool.live_kv_bytes(), kv=kv)
            shown = tool_request is not None and tool_request.shown
            return Completion(entry.id, engine, tokens, _sampling(spec, entry.settings, kv, max_tokens, constraint),
                              stack, tool_format=fmt if shown else None, tool_request=tool_request)
        except BaseException as e:
            await stack.aclose()
            if tokens is not None and isinstance(e, BadRequest):
                # what tokenising a refused prompt freed stays in glibc's heap until trimmed
                tokens = None
                await asyncio.to_thread(trim_native_heap)
            raise

    async def count_tokens(self, spec: CompletionSpec) -> int:
        """The prompt's length in tokens exactly as open_completion encodes it (tools included). It
        leases the model (loading it if needed, through admission) but takes no concurrency slot
        and generates nothing."""
        entry = self.pool.resolve(spec.model)
        self.pool.require_kind(entry, CHAT)
        _check_prompt_size(spec, self._context(entry), self.pool.conf.prompt_chars_per_token)
        tool_request = _tool_request(spec)
        await self.admission.admit()
        async with self.pool.lease(entry.id, keep_alive=spec.keep_alive) as engine:
            _, tokens = await _prompt(engine, spec, tool_request)
            return len(tokens)

    def _context(self, entry) -> int:
        """The model's context length (its config.json, read without loading it)."""
        return limits.context_length(model_card(entry.path, entry.kind)["context_length"],
                                     self.pool.conf.context_fallback)

    def _refuse_if_queue_full(self, model_id: str) -> None:
        try:
            self.pool.slots.check(model_id)
        except ModelQueueFull:
            self.admission.on_reject(Rejection.MODEL_QUEUE_FULL)
            raise

    async def _take_slot(self, stack: AsyncExitStack, model_id: str) -> None:
        try:
            await stack.enter_async_context(self.pool.slots.hold(model_id))
        except ModelQueueFull:                  # filled up while this request was loading the model
            self.admission.on_reject(Rejection.MODEL_QUEUE_FULL)
            raise


def _check_prompt_size(spec: CompletionSpec, context: int, chars_per_token: int) -> None:
    """Refuse, before tokenising, a prompt too long to fit the context (tokenising a 10 MB prompt
    took 24 s and left 641 MiB resident; lone surrogates never get here: pool/strict_json.py)."""
    chars, limit = limits.prompt_chars(spec.messages, spec.prompt), limits.max_prompt_chars(context, chars_per_token)
    if chars > limit:
        openai, anthropic = limits.size_messages(chars=chars, limit=limit, context=context,
                                                 chars_per_token=chars_per_token, prompt_param=spec.prompt_param)
        raise ContextLengthExceeded(openai, anthropic_message=anthropic, param=spec.prompt_param,
                                    context_length=context, prompt_characters=chars)


def _fit_context(spec: CompletionSpec, prompt_tokens: int, context: int, defaults: dict) -> int:
    """The max_tokens the engine gets: the client's if it fits beside the prompt, else a 400; a
    default lowered to what fits."""
    default = defaults.get("max_tokens") or DEFAULT_MAX_TOKENS
    fit = limits.fit_context(prompt_tokens=prompt_tokens, requested=spec.max_tokens, default=int(default),
                             context=context)
    if fit.refused is None:
        return fit.max_tokens
    words = dict(context=context, prompt_tokens=prompt_tokens, max_tokens=spec.max_tokens)
    param = spec.prompt_param if fit.refused == limits.PROMPT else "max_tokens"
    raise ContextLengthExceeded(limits.openai_message(fit.refused, prompt_param=spec.prompt_param, **words),
                                anthropic_message=limits.anthropic_message(fit.refused, **words), param=param,
                                context_length=context, prompt_tokens=prompt_tokens)


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
        raise BadRequest(f"'tools': a function's parameters cannot be enforced for a forced call: {e.feature}",
                         param="tools") from None
    except ValueError as e:   # a named function that is not among the tools
        raise BadRequest(f"'tool_choice': {e}", param="tool_choice") from None


def _uses_tools(messages: list[dict], tool_request: ToolRequest | None) -> bool:
    return tool_request is not None or any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)


def _chat_prompt(engine: EngineLike, messages: list[dict], tool_request: ToolRequest | None):
    """On a worker thread (a tokenizer's first tool_format renders its template twice): the request's
    tool format, and the messages and `tools=` its chat template gets."""
    fmt = request_format(tool_format(getattr(engine, "tokenizer", None)), tool_request)
    return (fmt, *prepare_messages(messages, tool_request, fmt))


async def _prompt(engine: EngineLike, spec: CompletionSpec,
                  tool_request: ToolRequest | None) -> tuple[ToolFormat | None, list[int]]:
    """(the request's tool format or None, its prompt tokens). A chat with tools or tool history is
    rendered through pool.tools first; its BadRequest keeps the field it names."""
    fmt, messages, template_tools = None, spec.messages, None
    if spec.messages is not None and _uses_tools(spec.messages, tool_request):
        fmt, messages, template_tools = await asyncio.to_thread(_chat_prompt, engine, spec.messages, tool_request)
    return fmt, await _encode(engine, spec, messages, template_tools)


async def _encode(engine: EngineLike, spec: CompletionSpec, messages: list[dict] | None,
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
        raise BadRequest(f"The model's {what}: {e}", param=spec.prompt_param) from None


def _kv(spec: CompletionSpec, defaults: dict, model_info: dict) -> KVConfig:
    try:
        return kv_config(spec.kv, defaults, head_dim=model_info.get("head_dim"),
                         quantized_kv=model_info.get("quantized_kv", True))
    except KVFieldError as e:
        where = "" if e.field in spec.kv else " (the model's default)"
        raise BadRequest(f"{e}{where}", param=e.field) from None


def _check_logit_bias(spec: CompletionSpec, vocab_size: int | None) -> None:
    if vocab_size is None:
        return
    outside = [token for token, _ in spec.logit_bias if token >= vocab_size]
    if outside:
        raise BadRequest(f"'logit_bias' names token {outside[0]}, outside this model's vocabulary "
                         f"(0 to {vocab_size - 1})", param="logit_bias")


def _sampling(spec: CompletionSpec, defaults: dict, kv: KVConfig, max_tokens: int,
              constraint: Any = None) -> SamplingParams:
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
                          constraint=constraint)
