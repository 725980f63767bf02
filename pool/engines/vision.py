"""VisionEngine: a vision-language model's engine (protocol.TextGenerator) on mlx-vlm, on the engine's
own thread (worker.py owns the thread and its commands).

A request runs through mlx-vlm's own `stream_generate` (its processor, vision tower, mRoPE and the
prefix reuse it does across turns), one token per request and step, so concurrent requests take
turns and each can be cancelled between two tokens; a text-only request takes the same path. The
prompt cache is the text engines' store (prompt_cache.py: scoped, capped, least recently used
first), keyed also by the prompt's image digests (vision_prompt.cache_scope), handed to mlx-vlm as
the `PromptCacheState` it reuses; mlx-vlm reuses a prefix only where what is left is text, so an
image's embeddings are never kept beyond the request but as the KV the cache holds."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from contextlib import aclosing
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterator

import mlx.core as mx

from ..catalog.kinds import config_context_length, read_json
from .generation_request import Outbox, Request, received
from .loading import fill_weights, model_info, tokenizer_for
from .processors import logits_processors, sampler
from .prompt_cache import PromptCache, make_prompt_cache_store
from .protocol import (
    CacheStats,
    Chunk,
    EngineError,
    LoadAborted,
    LoadOptions,
    LoadResult,
    PromptCacheOptions,
    RequestAborted,
    SamplingParams,
)
from .vision_prompt import VisionPrompt, cache_scope, pil_images, split_images
from .worker import EngineWorker, unloaded

log = logging.getLogger(__name__)
PREFILL_STEP = 512


@dataclass(eq=False)
class _Job:
    req: Request
    steps: Iterator[Any]          # mlx-vlm's stream_generate for this request
    state: Any                    # its PromptCacheState: the KV it reused and leaves behind
    scope: str | None
    live: list                    # the KV caches it fills as it runs (counted as the engine's live KV)

    @property
    def kv_bytes(self) -> int:
        return sum(int(getattr(c, "nbytes", 0) or 0) for c in self.live)


class VisionEngine(EngineWorker):
    """One vision-language model on one engine thread. Every public coroutine is safe to call from the loop."""

    def __init__(self, model_id: str, path: Path, *, load: LoadOptions = LoadOptions(),
                 prompt_cache: PromptCacheOptions = PromptCacheOptions(),
                 on_kv_growth: Callable[[int], None] | None = None):
        super().__init__(model_id, path)
        self._load_options = load
        # the disk tier keys entries by tokens alone: a vision model's entries stay in memory
        self._cache_options = replace(prompt_cache, disk_bytes=0, folder=None)
        self._prompt_cache: PromptCache | None = None
        self._model: Any = None
        self._processor: Any = None
        self.tokenizer: Any = None
        self.vocab_size: int | None = None
        self.prefill_step = PREFILL_STEP
        self.prefill_step_alone = PREFILL_STEP
        self._jobs: list[_Job] = []
        self._outbox = Outbox()
        self._weight_bytes = 0
        self.active_requests = 0

    # ---- the prompt (worker threads) ------------------------------------------------------------

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        from mlx_vlm.utils import prepare_inputs

        plain, images = split_images(messages)
        text = self.tokenizer.apply_chat_template(plain, tools=tools, add_generation_prompt=True, tokenize=False)
        if not images:
            return VisionPrompt(self._encode(text), text=text)
        inputs = prepare_inputs(self._processor, images=pil_images(images), prompts=text,
                                image_token_index=getattr(self._model.config, "image_token_index", None),
                                add_special_tokens=self._special_tokens)
        config = self._model.config
        image_token = getattr(config, "image_token_id", None) or getattr(config, "image_token_index", None)
        return VisionPrompt(inputs["input_ids"].flatten().tolist(), text=text, images=images, image_token=image_token)

    def chat_checkpoints(self, messages: list[dict], tools: list[dict] | None, prompt: list[int]) -> tuple[int, ...]:
        return ()

    def encode_text(self, prompt: str) -> list[int]:
        return self._encode(prompt)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=self._special_tokens))

    @functools.cached_property
    def _special_tokens(self) -> bool:
        from mlx_vlm.utils import should_add_special_tokens

        return bool(should_add_special_tokens(self._model.config.model_type, self._processor))

    def prepare_constraints(self) -> None:
        from .grammar import prepare

        prepare(self.tokenizer)

    def abort_all(self, message: str, code: str = "request_aborted") -> None:
        error = RequestAborted(message, code)
        self._post(lambda: self._abort_all(error))

    async def shrink_prompt_cache(self, *, cap_bytes: int, free_bytes: int = 0) -> int:
        def shrink() -> int:
            if self._prompt_cache is None:
                return 0
            freed = self._prompt_cache.set_cap(cap_bytes)
            if free_bytes > freed:
                freed += self._prompt_cache.trim(self._prompt_cache.nbytes - (free_bytes - freed))
            self._update_cache_stats()
            return freed
        return await self.call(shrink)

    # ---- generation (the loop) ------------------------------------------------------------------

    async def generate(self, tokens: list[int], params: SamplingParams) -> AsyncIterator[Chunk]:
        if params.n != 1:
            raise EngineError("a vision model gives one choice per request")
        req = Request(tokens=tokens, params=params, loop=asyncio.get_running_loop())
        if not self._post(lambda: self._start(req), refused=lambda e: self._outbox.emit(req, e)):
            raise unloaded()
        try:
            async with aclosing(received(req)) as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            if not req.done:
                self._post(functools.partial(self._remove, req))

    # ---- the engine thread ----------------------------------------------------------------------

    def _open(self, memory_free: threading.Event | None) -> LoadResult:
        from mlx_vlm.utils import load

        started = time.perf_counter()
        model, processor = load(str(self.path), lazy=True)
        self._model, self._processor = model, processor
        config = read_json(self.path / "config.json")
        eos = getattr(model.config, "eos_token_id", None)
        self.tokenizer = tokenizer_for(self.path, eos)
        if memory_free is not None:
            memory_free.wait()
        if self.abort_load:
            raise LoadAborted("load aborted: process memory pressure")
        self._weight_bytes = fill_weights(model, self._load_options.group_bytes, self.load_progress)
        self.vocab_size = _vocab_size(model)
        info = model_info(model.language_model, config)
        info["context_length"] = config_context_length(config) or info.get("context_length")
        self.model_info = info
        self._prompt_cache = make_prompt_cache_store(self.model_id, self.path, self._cache_options)
        return LoadResult(measured_bytes=self._weight_bytes, seconds=time.perf_counter() - started,
                          model_info=self.model_info)

    def _start(self, req: Request) -> None:
        from mlx_vlm.generate import stream_generate
        from mlx_vlm.generate.common import PromptCacheState
        from mlx_vlm.models import cache as vlm_cache

        p = req.params
        try:
            prompt = req.tokens
            images = prompt.images if isinstance(prompt, VisionPrompt) else ()
            scope = cache_scope(p.cache_scope, tuple(image.digest for image in images))
            state = PromptCacheState()
            if p.cache_prompt and p.kv.default and self._prompt_cache is not None:
                cache, cached = self._prompt_cache.fetch(list(prompt), scope=scope)
                if cache is not None:
                    state.cache, state.token_ids = cache, list(prompt[:cached])
            if p.seed is not None:
                mx.random.seed(p.seed)
            options: dict[str, Any] = {
                "max_tokens": p.max_tokens, "sampler": sampler(p.temperature, p.top_p),
                "logits_processors": logits_processors(p, self.tokenizer) or None,
                "prefill_step_size": self.prefill_step, "prompt_cache_state": state}
            if state.cache is None:     # made here (as mlx-vlm would) so its bytes can be counted while it runs
                options["prompt_cache"] = vlm_cache.make_prompt_cache(self._model.language_model)
            live = state.cache if state.cache is not None else options["prompt_cache"]
            if isinstance(prompt, VisionPrompt) and images:
                steps = stream_generate(self._model, self._processor, prompt.text, image=pil_images(images), **options)
            else:
                steps = stream_generate(self._model, self._processor, "", input_ids=mx.array([list(prompt)]), **options)
            req.detokenizer = self.tokenizer.detokenizer
            self._jobs.append(_Job(req, steps, state, scope, live))
        except Exception as e:  # noqa: BLE001 - this request ends, never the engine's thread
            req.done = True
            self._outbox.emit(req, EngineError(f"could not start generation: {e}"))
        self.active_requests = len(self._jobs)

    def _has_work(self) -> bool:
        return bool(self._jobs)

    def _work(self) -> None:
        for job in list(self._jobs):   # one token each: concurrent requests take turns
            try:
                self._step(job)
            except Exception as e:      # this request ends alone; the others go on
                log.exception("a vision generation step failed on %s", self.model_id)
                self._outbox.emit(job.req, EngineError(f"generation failed: {type(e).__name__}"))
                self._remove(job.req)
        self._update_cache_stats()

    def _step(self, job: _Job) -> None:
        req = job.req
        result = next(job.steps, None)
        if result is None:
            raise EngineError("mlx-vlm ended without a finish reason")
        if req.generated == 0:
            req.cached_tokens = result.cached_tokens
            if req.params.progress is not None:
                req.params.progress.prefill_done = len(req.tokens)
        if result.finish_reason is None:
            chunk, stopped_here = req.advance(result.token, None)
        elif result.token is None:        # nothing generated (max_tokens 0)
            chunk, stopped_here = req.advance(0, "stop")
            chunk = replace(chunk, finish_reason="length") if chunk is not None else None
        else:
            # mlx-vlm's last result repeats the last token (length) or carries the EOS (stop)
            chunk, stopped_here = req.advance(result.token, "stop")
            if chunk is not None and result.finish_reason == "length" and chunk.stop_sequence is None:
                chunk = replace(chunk, finish_reason="length")
        if chunk is not None:
            self._outbox.emit(req, chunk)
        if chunk is not None and chunk.finish_reason is not None:
            if not stopped_here:
                next(job.steps, None)     # mlx-vlm saves the turn's KV in its state after the last result
                self._store(job)
            self._remove(req)

    def _store(self, job: _Job) -> None:
        state, p = job.state, job.req.params
        if not (p.cache_prompt and p.kv.default and self._prompt_cache is not None and state.cache):
            return
        held = max((int(getattr(c, "offset", 0) or 0) for c in state.cache), default=0)
        if held and state.token_ids:
            self._prompt_cache.store(state.token_ids[:held], state.cache, scope=job.scope)

    def _remove(self, req: Request) -> None:
        for job in [j for j in self._jobs if j.req is req]:
            self._jobs.remove(job)
            close = getattr(job.steps, "close", None)
            if close is not None:
                close()
        req.done = True
        self.active_requests = len(self._jobs)

    def _fail_in_flight(self, error: EngineError) -> None:
        for job in self._jobs:
            job.req.done = True
            self._outbox.emit(job.req, error)
        self._jobs = []
        self._outbox.flush()

    def _abort_all(self, error: BaseException) -> None:
        for job in list(self._jobs):
            self._outbox.emit(job.req, error)
            self._remove(job.req)

    def _after_commands(self) -> None:
        if not self._jobs:
            self._update_cache_stats()
        self._outbox.flush()

    def _update_cache_stats(self) -> None:
        pc, kv = self._prompt_cache, sum(job.kv_bytes for job in self._jobs)
        self.cache_stats = CacheStats(kv_bytes=kv) if pc is None else CacheStats(
            kv_bytes=kv, prompt_cache_bytes=pc.nbytes, prompt_cache_entries=pc.entries,
            prompt_cache_cap_bytes=pc.cap_bytes, hits=pc.stats.hits, misses=pc.stats.misses,
            tokens_saved=pc.stats.tokens_saved)

    def _held_bytes(self) -> int:
        return self._weight_bytes + sum(job.kv_bytes for job in self._jobs) + (
            self._prompt_cache.nbytes if self._prompt_cache is not None else 0)

    def _release(self, message: str) -> None:
        self._abort_all(RequestAborted(message or "the model was unloaded", "model_unloaded"))
        self._outbox.flush()
        if self._prompt_cache is not None:
            self._prompt_cache.clear()
        mx.synchronize()

    def _drop_model(self) -> None:
        self._jobs = []
        self._model = self._processor = self.tokenizer = None
        self._prompt_cache = None
        self.__dict__.pop("_special_tokens", None)
        super()._drop_model()


def _vocab_size(model) -> int | None:
    config = model.config
    text = getattr(config, "text_config", None)
    return getattr(text, "vocab_size", None) or getattr(config, "vocab_size", None)
