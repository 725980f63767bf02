"""The serving door: the one way a request reaches an engine.

`open_completion` admits the request (the gate memory pressure closes), takes a lease on its model
(loading it, evicting others, if needed), waits for one of the model's concurrency slots
(pool/concurrency.py), encodes the prompt on a worker thread, applies the prefill guard and starts
generation. The `Completion` it returns yields the engine's chunks with
engine errors mapped to the pool's domain errors, and `aclose()` releases everything. Routes parse
and frame; they never see an engine."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import AsyncIterator

from .admission import Admission
from .engine_pool import EnginePool
from .engines.types import Chunk, EngineError, EngineLike, RequestAborted, SamplingParams
from .errors import BadRequest, EngineFailure, ModelQueueFull, ServiceUnavailable
from .policy.kv import KVConfig, KVFieldError, kv_config
from .policy.vocabulary import Rejection

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

    @property
    def prompt_param(self) -> str:
        return "messages" if self.messages is not None else "prompt"


class Completion:
    """One admitted, leased, encoded request. Iterate `chunks()` once; always `aclose()`."""

    def __init__(self, model_id: str, engine: EngineLike, tokens: list[int], params: SamplingParams,
                 stack: AsyncExitStack):
        self.model_id = model_id
        self.prompt_tokens = len(tokens)
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
        self._refuse_if_queue_full(entry.id)     # at once: before any admission wait, lease or load
        await self.admission.admit()
        stack = AsyncExitStack()
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
            tokens = await _encode(engine, spec)
            self.admission.check_prefill(entry.id, engine.model_info, len(tokens), self.pool.views(),
                                         param=spec.prompt_param, kv=kv)
            return Completion(entry.id, engine, tokens, _sampling(spec, entry.settings, kv), stack)
        except BaseException:
            await stack.aclose()
            raise

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


async def _encode(engine: EngineLike, spec: CompletionSpec) -> list[int]:
    try:
        if spec.messages is not None:
            return await asyncio.to_thread(engine.encode_chat, spec.messages)
        return await asyncio.to_thread(engine.encode_text, spec.prompt)
    except Exception as e:  # noqa: BLE001 - input the tokenizer rejects is the client's to fix
        what = "chat template rejected the messages" if spec.messages is not None else "tokenizer rejected the prompt"
        raise BadRequest(f"The model's {what}: {e}", param=spec.prompt_param) from None


def _kv(spec: CompletionSpec, defaults: dict, model_info: dict) -> KVConfig:
    try:
        return kv_config(spec.kv, defaults, head_dim=model_info.get("head_dim"),
                         quantized_kv=model_info.get("quantized_kv", True))
    except KVFieldError as e:
        where = "" if e.field in spec.kv else " (the model's default)"
        raise BadRequest(f"{e}{where}", param=e.field) from None


def _sampling(spec: CompletionSpec, defaults: dict, kv: KVConfig) -> SamplingParams:
    def pick(value, name, fallback):
        if value is not None:
            return value
        return defaults.get(name) if defaults.get(name) is not None else fallback
    return SamplingParams(max_tokens=int(pick(spec.max_tokens, "max_tokens", DEFAULT_MAX_TOKENS)),
                          temperature=float(pick(spec.temperature, "temperature", 0.0)),
                          top_p=float(pick(spec.top_p, "top_p", 1.0)), stop=spec.stop, seed=spec.seed,
                          cache_prompt=spec.cache_prompt, kv=kv)
