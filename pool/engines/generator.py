"""TextEngine: a language model's engine (protocol.TextGenerator): mlx-lm loading and batched
generation on the engine's own thread (worker.py owns the thread and its commands).

The engine thread runs a `BatchGenerator` per lane (continuous batching: requests join and leave
between decode steps) and hands what each step produced back to the event loop in one
`loop.call_soon_threadsafe` per step (generation_request.Outbox).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import threading
import time
from contextlib import aclosing
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import mlx.core as mx
from mlx_lm.generate import generation_stream

from .adapter_hosting import AdapterHosting
from .admission import Arrivals, PromptEncoding
from .checkpoints import positions
from .drafting import Drafter, DraftHolder, load_drafter
from .engine_cache import PromptCaching
from .generation_request import Outbox, Request, received
from .lanes import BatchLane, SoloLane, new_cache, prefill_chunk
from .loading import fill_weights, model_info, open_model
from .multi_lora import AdapterSet
from .processors import TokenText, logits_processors, sampler, token_logprob
from .prompt_cache import PromptCache, make_prompt_cache_store
from .protocol import (
    Chunk,
    EngineError,
    KVConfig,
    LoadAborted,
    LoadOptions,
    LoadResult,
    PromptCacheOptions,
    RequestAborted,
    SamplingParams,
)
from .shared_prefill import SharedPrefill
from .warmup import warm_jobs
from .worker import EngineWorker, unloaded

log = logging.getLogger(__name__)

STATS_INTERVAL = 0.05     # seconds between two readings of the KV sizes while requests decode
PREFILL_STEP = 512         # prompt tokens read per step until the pool sets its own (OMLX_PREFILL_STEP)
PREFILL_STEP_ALONE = 2048  # ... by a request alone (OMLX_PREFILL_STEP_ALONE): it holds nobody up


class TextEngine(PromptEncoding, PromptCaching, DraftHolder, AdapterHosting, EngineWorker):
    """One language model on one engine thread. Every public coroutine is safe to call from the event loop."""

    def __init__(self, model_id: str, path: Path, *, load: LoadOptions = LoadOptions(),
                 prompt_cache: PromptCacheOptions = PromptCacheOptions(),
                 on_kv_growth: Callable[[int], None] | None = None):
        super().__init__(model_id, path)
        self._load_options = load
        self._cache_options = prompt_cache
        self._prompt_cache: PromptCache | None = None    # made on the engine thread (the disk tier reads files)
        self._on_kv_growth = on_kv_growth       # called from the thread when the live KV grew a KV_GROWTH_STEP
        self._kv_reported = 0
        self._model = None
        self._tokenizer = None
        self._config: dict = {}
        self._drafter: Drafter | None = None
        self._adapter_set: AdapterSet | None = None     # its LoRA adapters' matrices, once one attaches
        self._lanes: dict[Any, BatchLane | SoloLane] = {}    # KVConfig, or ("solo", n) for quantized KV
        self._solo_ids = itertools.count()
        self._stop_tokens: list[list[int]] = []
        self.prefill_step = PREFILL_STEP     # the enforcer lowers both under pressure (read each step)
        self.prefill_step_alone = PREFILL_STEP_ALONE
        self._requests: dict[Any, Request] = {}
        self._prefills: list[SharedPrefill] = []       # prompts read once for several choices
        self._token_text: TokenText | None = None       # made for the first request asking for logprobs
        self._outbox = Outbox()
        self.arrivals = Arrivals()     # requests arriving together start in one step (admission.py)
        self._stats_at = 0.0
        self._stats_stale = False     # a request left since the KV sizes were last read
        self._weight_bytes = 0
        self.active_requests = 0

    def abort_all(self, message: str, code: str = "request_aborted") -> None:
        """End every running request with `RequestAborted(message, code)`; the model stays loaded."""
        error = RequestAborted(message, code)
        self._post(lambda: self._abort_all(error))

    # ---- generation ------------------------------------------------------------------------

    async def generate(self, tokens: list[int], params: SamplingParams) -> AsyncIterator[Chunk]:
        """Yield chunks of text; with `params.n` > 1, the chunks of every choice (`Chunk.index`),
        until each has had its last. Closing or cancelling the iterator removes the request from
        the batch before the next decode step."""
        loop = asyncio.get_running_loop()
        first = Request(tokens=tokens, params=params, loop=loop)
        choices = [first] + [Request(tokens=tokens, params=params, loop=loop, ready=first.ready,
                                     arrived=first.arrived, index=i) for i in range(1, params.n)]
        self.arrivals.arrived()     # before the post: the engine thread never waits for this one
        if not self._post(lambda: self._insert(choices), refused=functools.partial(self._refuse, choices)):
            raise unloaded()
        try:
            async with aclosing(received(first, choices=len(choices))) as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            for req in choices:
                if not req.done:
                    self._post(functools.partial(self._remove, req))

    # ---- the engine thread -----------------------------------------------------------------

    def _refuse(self, choices: list[Request], error: BaseException) -> None:
        for req in choices:
            self._outbox.emit(req, error)

    def _open(self, memory_free: threading.Event | None) -> LoadResult:
        started = time.perf_counter()
        model, tokenizer, config, weight_bytes = self._read_model(memory_free)
        self._model, self._tokenizer, self._config = model, tokenizer, config
        self._adapter_set = AdapterSet(model)
        self._weight_bytes = weight_bytes
        self.model_info = model_info(model, config)
        if self._drafter is not None:
            self.model_info["draft"] = {"model": self._load_options.draft.name if self._load_options.draft else None,
                                        "bytes": self._drafter.nbytes, "tokens": self._drafter.tokens}
        self._prompt_cache = make_prompt_cache_store(self.model_id, self.path, self._cache_options,
                                                     on_written=lambda: self._post(self._update_cache_stats),
                                                     trimmable=self._trimmable)
        self._stop_tokens = [[t] for t in sorted(tokenizer.eos_token_ids)]
        self._lanes = {KVConfig(): self._new_lane(KVConfig())}
        self._idle_jobs = warm_jobs(lambda: (self._model, self._stop_tokens, self.prefill_step_alone, self._trimmable),
                                    self._load_options, model_id=self.model_id)
        return LoadResult(measured_bytes=weight_bytes,
                          seconds=time.perf_counter() - started, model_info=self.model_info)

    def parts(self) -> tuple[Any, Any, dict]:
        """(model, tokenizer, config) once loaded, for an adapter over this model (engines/adapter.py):
        set once by the load, read from another engine's thread."""
        return self._model, self._tokenizer, self._config

    def _read_model(self, memory_free: threading.Event | None) -> tuple[Any, Any, dict, int]:
        """(model, tokenizer, config, the bytes its weights took), the weights read once `memory_free`."""
        model, tokenizer, config = open_model(self.path, dequantize=self._load_options.dequantize)
        self._model, self._tokenizer = model, tokenizer
        if memory_free is not None:
            memory_free.wait()
        if self.abort_load:
            raise LoadAborted("load aborted: process memory pressure")
        # the weights' own bytes, not MLX's active-memory delta: other engines allocate meanwhile
        weight_bytes = fill_weights(model, self._load_options.group_bytes, self.load_progress)
        self._drafter = load_drafter(self._load_options, config, self.model_id)
        return model, tokenizer, config, weight_bytes + (self._drafter.nbytes if self._drafter else 0)

    @property
    def _trimmable(self) -> bool:
        """The model's caches can be cut back (else its prompt cache keeps checkpoints)."""
        layout = self.model_info.get("kv_layout")
        return layout is None or layout.trimmable

    def _has_work(self) -> bool:
        return bool(self._requests or self._prefills)

    def _work(self) -> None:
        try:
            self._step()
        except Exception as e:          # a bug outside a lane's own step: errors for its requests, not a hang
            log.exception("an engine step failed on %s", self.model_id)
            self._abort_all(EngineError(f"generation failed: {type(e).__name__}"))

    def _admission_wait(self) -> float:
        return self.arrivals.wait()

    def _after_commands(self) -> None:
        if not (self._requests or self._prefills):
            self.arrivals.idle()         # an insert that failed starts no step
            if self._stats_stale:
                self._update_cache_stats()   # the last request left between steps: its KV is gone
        self._outbox.flush()

    def _insert(self, choices: list[Request]) -> None:
        """A request's choices: one starts in its lane at once; several have their prompt read once
        (a SharedPrefill, stepped with the lanes) and then start together."""
        req, p = choices[0], choices[0].params
        self.arrivals.inserted()
        try:   # anything that fails here ends this request, never the engine's thread
            if p.seed is not None:
                mx.random.seed(p.seed)
            cache, cached, marks = None, 0, ()
            if p.cache_prompt and p.kv.default and self._prompt_cache is not None:
                cache, cached = self._prompt_cache.fetch(req.tokens, scope=p.cache_scope)
                if not self._trimmable:
                    marks = positions(p.checkpoints, cached, len(req.tokens))
            for choice in choices:
                choice.cached_tokens = cached
            if len(choices) == 1:
                self._start(req, req.tokens[cached:], cache, req.tokens[:cached], marks)
            else:
                cache = cache if cache is not None else new_cache(self._model, p.kv)
                self._prefills.append(SharedPrefill(self._model_for(p.adapter), req.tokens[cached:], cache,
                                                    req.tokens[:cached], choices, marks))
        except Exception as e:  # noqa: BLE001
            self._fail_start(choices, e)
            return
        self._count_active()

    def _start(self, req: Request, tokens: list[int], cache, all_tokens: list[int], marks=()) -> None:
        """Put one choice into its lane, with its own sampler and logits processors."""
        p = req.params
        req.lane = self._lane_for(p.kv)
        if p.logprobs is not None and self._token_text is None:
            self._token_text = TokenText(self._tokenizer)
        req.uid = self._lanes[req.lane].insert(
            tokens, cache=cache, all_tokens=all_tokens, max_tokens=p.max_tokens,
            sampler=sampler(p.temperature, p.top_p),
            processors=logits_processors(p, self._tokenizer), checkpoints=marks, adapter=p.adapter)
        req.detokenizer = self._tokenizer.detokenizer
        self._requests[(req.lane, req.uid)] = req

    def _fail_start(self, choices: list[Request], error: Exception) -> None:
        for req in choices:
            self._outbox.emit(req, EngineError(f"could not start generation: {error}"))
            self._remove(req)
            self._retire(req.lane)

    def _step_prefills(self) -> None:
        """Read one chunk of each shared prompt; a prompt read in full starts its choices."""
        for job in list(self._prefills):
            try:
                done = job.step(prefill_chunk(job.requests[0].params.kv, self.prefill_step))
                for cache, tokens in job.kept:
                    self._store(job.requests[0], cache, tokens)
                job.kept.clear()
                if not done:
                    continue
                self._prefills.remove(job)
                for req, cache in job.fork():
                    self._start(req, job.pending, cache, job.fed)
            except Exception as e:
                log.exception("reading a shared prompt failed on %s", self.model_id)
                if job in self._prefills:
                    self._prefills.remove(job)
                self._fail_start(job.requests, e)
        self._count_active()

    def _count_active(self) -> None:
        self.active_requests = len(self._requests) + sum(len(job.requests) for job in self._prefills)

    def _lane_for(self, kv: KVConfig):
        """Requests that can batch together share a lane; quantized KV gets one of its own."""
        key = kv if kv.batches else ("solo", next(self._solo_ids))
        if key not in self._lanes:
            self._lanes[key] = self._new_lane(kv)
        return key

    def _new_lane(self, kv: KVConfig) -> BatchLane | SoloLane:
        if not kv.batches:
            return SoloLane(self._model, kv, self._stop_tokens, self._adapter_set)
        return BatchLane(self._model, kv, self._stop_tokens, trimmable=self._trimmable,
                         drafter=self._drafter if kv == KVConfig() else None, adapters=self._adapter_set)

    def _retire(self, key) -> None:
        """Close a lane its last request left, but the default one, which stays for the next."""
        lane = self._lanes.get(key)
        if lane is not None and lane.empty and key != KVConfig():
            lane.close()
            del self._lanes[key]

    def _remove(self, req: Request, *, keep_cache: bool = False) -> None:
        if req.uid is not None and self._requests.pop((req.lane, req.uid), None) is not None:
            lane = self._lanes.get(req.lane)
            kept = lane.remove(req.uid, keep_cache=keep_cache) if lane is not None else None
            if kept:
                self._store(req, *kept)
            self._retire(req.lane)
        elif req.uid is None:
            self._drop_from_prefills(req)
        req.done = True
        self._stats_stale = True
        self._count_active()

    def _drop_from_prefills(self, req: Request) -> None:
        for job in self._prefills:
            if req in job.requests:
                job.requests.remove(req)
                if not job.requests:
                    self._prefills.remove(job)
                return

    def _in_flight(self) -> list[Request]:
        return list(self._requests.values()) + [req for job in self._prefills for req in job.requests]

    def _fail_in_flight(self, error: EngineError) -> None:
        for req in self._in_flight():
            self._outbox.emit(req, error)
        self._requests, self._prefills = {}, []
        self._outbox.flush()

    def _abort_all(self, error: BaseException) -> None:
        for req in self._in_flight():
            self._outbox.emit(req, error)      # first: a remove that fails (the device) must not lose it
            self._remove(req)

    def _step(self) -> None:
        self.arrivals.stepped()
        if self._prefills:
            self._step_prefills()
        prefill = self.prefill_step_alone if len(self._requests) == 1 and not self._prefills else self.prefill_step
        for key, lane in list(self._lanes.items()):
            if lane.empty:
                continue
            lane.set_prefill_step(prefill)
            try:
                steps = lane.step()
            except Exception as e:
                log.exception("generation step failed on %s", self.model_id)
                self._fail_lane(key, EngineError(f"generation failed: {type(e).__name__}"))
                continue
            self._note_prompt_read(key, lane)
            for uid, cache, tokens in lane.checkpoints():
                if (req := self._requests.get((key, uid))) is not None:
                    self._store(req, cache, tokens)
            for step in steps:
                req = self._requests.get((key, step.uid))
                if req is None:
                    continue
                try:   # a request that fails here ends alone; the lane and the thread go on
                    if step.finish_reason is not None:
                        self._store(req, step.prompt_cache, step.all_tokens)
                        req.draft = step.draft or req.draft
                    self._deliver(req, step.token, step.finish_reason, step.logprobs)
                except Exception as e:
                    log.exception("delivering a token failed on %s", self.model_id)
                    self._outbox.emit(req, EngineError(f"generation failed: {type(e).__name__}"))
                    self._remove(req)
            self._retire(key)
        if time.monotonic() - self._stats_at >= STATS_INTERVAL or not self._requests:
            self._update_cache_stats()

    def _note_prompt_read(self, key, lane) -> None:
        for uid, read in lane.prompt_read().items():
            req = self._requests.get((key, uid))
            if req is not None and req.params.progress is not None and not req.index:
                req.params.progress.prefill_done = read

    def _fail_lane(self, key, error: EngineError) -> None:
        for req in [r for (k, _), r in self._requests.items() if k == key]:
            self._outbox.emit(req, error)      # first: a remove that fails (the device) must not lose it
            self._remove(req)
        lane = self._lanes.pop(key, None)
        if lane is not None:
            lane.close()
        if key == KVConfig():
            self._lanes[key] = self._new_lane(KVConfig())

    def _deliver(self, req: Request, token: int, finish_reason: str | None, logprobs=None) -> None:
        top = req.params.logprobs
        if top is not None and finish_reason != "stop" and logprobs is not None:
            chunk, stopped_here = req.advance(token, finish_reason,
                                              token_logprob(logprobs, token, top, self._token_text))
        else:
            chunk, stopped_here = req.advance(token, finish_reason)
        if chunk is not None:
            self._outbox.emit(req, chunk)
        if chunk is not None and chunk.finish_reason is not None:
            self._remove(req, keep_cache=stopped_here)   # a stop string ends it before the generator does

    def _held_bytes(self) -> int:
        return self._weight_bytes + sum(lane.kv_bytes for lane in self._lanes.values()) + (
            self._prompt_cache.nbytes if self._prompt_cache is not None else 0)

    def _release(self, message: str) -> None:
        self._abort_all(RequestAborted(message or "the model was unloaded", "model_unloaded"))
        self._outbox.flush()
        if self._prompt_cache is not None:
            self._prompt_cache.clear()
        mx.synchronize(generation_stream)  # mlx-lm's look-ahead step still holds arrays

    def _close_lanes(self) -> None:
        lanes, self._lanes = list(self._lanes.values()), {}
        while lanes:                  # no name is left bound to a lane (and its model) after
            lanes.pop().close()

    def _drop_model(self) -> None:
        self._close_lanes()
        self._prefills, self._token_text = [], None
        self._model = self._tokenizer = self._drafter = self._adapter_set = None
        self._prompt_cache = None     # its entries' KV, the disk tier's unsaved ones too
        self._requests.clear()
        super()._drop_model()

