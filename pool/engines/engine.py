"""One Engine per loaded model: mlx-lm loading and batched generation on the engine's own thread.

The event loop never touches MLX. It sends commands through a queue; the engine thread runs a
`BatchGenerator` (continuous batching: requests join and leave between decode steps) and hands
what each step produced back to the event loop in one `loop.call_soon_threadsafe` per step.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import mlx.core as mx
import psutil
from mlx_lm.generate import generation_stream
from mlx_lm.sample_utils import make_sampler

from .choices import SharedPrefill
from .lanes import BatchLane, SoloLane, new_cache, prefill_chunk
from .loading import fill_weights, model_info, open_model
from .mailbox import Mailbox, settle
from .native import ACCOUNTING, release_memory
from .processors import TokenText, logits_processors, token_logprob
from .prompt_cache import PromptCache, make_prompt_cache_store
from .requests import Outbox, Request, coalesced
from .threads import ENGINE_THREADS, Running
from .types import (CacheStats, Chunk, EngineError, KVConfig, LoadAborted, LoadResult, ReleaseResult,
                    RequestAborted, SamplingParams)

log = logging.getLogger(__name__)

STATS_INTERVAL = 0.05     # seconds between two readings of the KV sizes while requests decode
PREFILL_STEP = 512         # prompt tokens read per step until the pool sets its own (OMLX_PREFILL_STEP)


@dataclass
class _Command:
    kind: str                      # "insert" | "cancel" | "call" | "abort_all" | "stop"
    request: Request | None = None
    requests: list[Request] | None = None   # insert: one per choice
    fn: Callable[[], Any] | None = None
    future: asyncio.Future | None = None
    loop: asyncio.AbstractEventLoop | None = None
    message: str = ""
    error: BaseException | None = None


def _resolve(cmd: _Command, result: Any = None, error: BaseException | None = None) -> None:
    settle(cmd.loop, cmd.future, result, error)


def _rss() -> int:
    return psutil.Process().memory_info().rss


class Engine:
    """Owns one model on one thread. Every public coroutine is safe to call from the event loop."""

    def __init__(self, model_id: str, path: Path, *, prompt_cache_bytes: int = 0, prompt_cache_entries: int = 10,
                 prompt_cache_dir: Path | None = None, prompt_cache_disk_bytes: int = 0):
        self.model_id = model_id
        self.path = Path(path)
        self._cache_options = (prompt_cache_bytes, prompt_cache_entries, prompt_cache_dir, prompt_cache_disk_bytes)
        self._prompt_cache: PromptCache | None = None    # made on the engine thread (the disk tier reads files)
        self.cache_stats = CacheStats()
        self._commands = Mailbox()
        self._thread: Running | None = None
        self._model = None
        self._tokenizer = None
        self._lanes: dict[Any, BatchLane | SoloLane] = {}    # KVConfig, or ("solo", n) for quantized KV
        self._solo_ids = itertools.count()
        self._stop_tokens: list[list[int]] = []
        self.prefill_step = PREFILL_STEP     # the enforcer lowers it under pressure (read each step)
        self._requests: dict[int, Request] = {}
        self._prefills: list[SharedPrefill] = []       # prompts read once for several choices
        self._token_text: TokenText | None = None       # made for the first request asking for logprobs
        self._outbox = Outbox()
        self._stats_at = 0.0
        self._stop_command: _Command | None = None
        self.abort_load = False
        self._weight_bytes = 0
        self.model_info: dict = {}
        self.active_requests = 0

    # ---- lifecycle -------------------------------------------------------------------------

    async def load(self, *, memory_free: threading.Event | None = None) -> LoadResult:
        """Load on an engine thread (threads.py). With `memory_free`, everything but the weights is read first
        and the weights wait for it (set once the models this load evicts are gone)."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._thread = ENGINE_THREADS.start(functools.partial(self._run, loop, fut, memory_free),
                                            name=f"engine:{self.model_id}")
        return await fut

    async def stop(self, message: str = "the model was unloaded") -> ReleaseResult:
        """End every request, free the model and end the thread; returns what was measured."""
        if self._thread is None or not self._thread.is_alive():
            return ReleaseResult(0, 0, 0, 0)
        result = await self._send("stop", message=message)
        # the thread still has to end its MLX streams; a process that exits first can abort
        await asyncio.to_thread(self._thread.join, 30)
        return result

    async def call(self, fn: Callable[[], Any]) -> Any:
        """Run fn on the engine thread between decode steps (MLX work that must not leave it)."""
        return await self._send("call", fn=fn)

    async def shrink_prompt_cache(self, *, cap_bytes: int, free_bytes: int = 0) -> int:
        """Set the prompt cache's cap, and drop least recently used entries until `free_bytes` more
        are freed; returns the bytes freed."""
        return await self.call(lambda: self._shrink_prompt_cache(cap_bytes, free_bytes))

    def abort_all(self, message: str, code: str = "request_aborted") -> None:
        """End every running request with `RequestAborted(message, code)`; the model stays loaded."""
        self._commands.put(_Command("abort_all", error=RequestAborted(message, code)))

    async def _send(self, kind: str, **kw) -> Any:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        if not self._commands.put(_Command(kind, future=fut, loop=loop, **kw)):
            raise RequestAborted("the model was unloaded", "model_unloaded")
        return await fut

    # ---- prompts ---------------------------------------------------------------------------

    @property
    def tokenizer(self):
        return self._tokenizer

    @property
    def vocab_size(self) -> int | None:
        return len(self._tokenizer) if self._tokenizer is not None else None

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The prompt of a chat; `tools` (OpenAI function tools) go to the chat template, which
        renders them where it knows how (one without tool support ignores them)."""
        tok = self._tokenizer
        if getattr(tok, "has_chat_template", False):
            extra = {"tools": list(tools)} if tools else {}
            return list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **extra))
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
        return list(tok.encode(text))

    def encode_text(self, prompt: str) -> list[int]:
        return list(self._tokenizer.encode(prompt))

    # ---- generation ------------------------------------------------------------------------

    async def generate(self, tokens: list[int], params: SamplingParams) -> AsyncIterator[Chunk]:
        """Yield chunks of text; with `params.n` > 1, the chunks of every choice (`Chunk.index`),
        until each has had its last. Closing or cancelling the iterator removes the request from
        the batch before the next decode step."""
        loop = asyncio.get_running_loop()
        first = Request(tokens=tokens, params=params, loop=loop)
        choices = [first] + [Request(tokens=tokens, params=params, loop=loop, ready=first.ready,
                                     arrived=first.arrived, index=i) for i in range(1, params.n)]
        if not self._commands.put(_Command("insert", requests=choices)):
            raise RequestAborted("the model was unloaded", "model_unloaded")
        unfinished = len(choices)
        try:
            while True:
                if not first.arrived:
                    await first.ready.wait()
                first.ready.clear()
                items = coalesced(first.arrived)
                first.arrived.clear()
                for item in items:
                    if isinstance(item, BaseException):
                        raise item
                    yield item
                    if item.finish_reason is not None:
                        unfinished -= 1
                        if not unfinished:
                            return
        finally:
            for req in choices:
                if not req.done:
                    self._commands.put(_Command("cancel", request=req))

    # ---- the engine thread -----------------------------------------------------------------

    def _run(self, loop: asyncio.AbstractEventLoop, load_future: asyncio.Future,
             memory_free: threading.Event | None) -> None:
        load_cmd = _Command("load", future=load_future, loop=loop)
        try:
            try:
                result = self._load(memory_free)
            except BaseException as e:  # noqa: BLE001 - reported to the waiting coroutine
                self._drop_model()
                _resolve(load_cmd, error=e)
                return
            if self.abort_load:
                self._drop_model()
                _resolve(load_cmd, error=LoadAborted("load aborted: process memory pressure"))
                return
            _resolve(load_cmd, result)
            self._serve()
        finally:
            self._close()   # the thread then synchronizes and goes back to ENGINE_THREADS

    def _close(self) -> None:
        """Take no more commands and answer those still queued: a caller that raced the unload
        (the enforcer shrinking caches, a request arriving) gets an error, never a wait forever."""
        gone = RequestAborted("the model was unloaded", "model_unloaded")
        for cmd in self._commands.close():
            if cmd.kind == "insert":
                for req in cmd.requests:
                    self._outbox.emit(req, gone)
            elif cmd.kind == "stop":
                _resolve(cmd, ReleaseResult(0, 0, 0, 0))
            else:
                _resolve(cmd, error=gone)
        self._outbox.flush()

    def _load(self, memory_free: threading.Event | None) -> LoadResult:
        started = time.perf_counter()
        model, tokenizer, config = open_model(self.path)
        self._model, self._tokenizer = model, tokenizer
        if memory_free is not None:
            memory_free.wait()
        if self.abort_load:
            raise LoadAborted("load aborted: process memory pressure")
        # the weights' own bytes, not MLX's active-memory delta: other engines allocate meanwhile
        weight_bytes = self._weight_bytes = fill_weights(model)
        self.model_info = model_info(model, config)
        self._prompt_cache = make_prompt_cache_store(self.model_id, self.path, *self._cache_options)
        self._stop_tokens = [[t] for t in sorted(tokenizer.eos_token_ids)]
        self._lanes = {KVConfig(): BatchLane(model, KVConfig(), self._stop_tokens)}
        return LoadResult(measured_bytes=weight_bytes,
                          seconds=time.perf_counter() - started, model_info=self.model_info)

    def _serve(self) -> None:
        while self._stop_command is None:
            busy = bool(self._requests or self._prefills)
            pc = self._prompt_cache
            self._handle_commands(block=not busy and not (pc is not None and pc.unsaved))
            if busy and self._stop_command is None:
                self._step()
            elif pc is not None and pc.unsaved and self._stop_command is None:
                pc.save_one()            # idle: write the disk tier's entries now (prompt_cache.py)
            self._outbox.flush()
        self._release(self._stop_command)

    def _handle_commands(self, block: bool) -> None:
        while True:
            try:
                cmd = self._commands.get(block=block)
            except queue.Empty:
                return
            block = False
            if cmd.kind == "insert":
                self._insert(cmd.requests)
            elif cmd.kind == "cancel":
                self._remove(cmd.request)
            elif cmd.kind == "abort_all":
                self._abort_all(cmd.error)
            elif cmd.kind == "call":
                try:
                    _resolve(cmd, cmd.fn())
                except BaseException as e:  # noqa: BLE001
                    _resolve(cmd, error=e)
            elif cmd.kind == "stop":
                self._stop_command = cmd
                return

    def _insert(self, choices: list[Request]) -> None:
        """A request's choices: one starts in its lane at once; several have their prompt read once
        (a SharedPrefill, stepped with the lanes) and then start together."""
        req, p = choices[0], choices[0].params
        try:   # anything that fails here ends this request, never the engine's thread
            if p.seed is not None:
                mx.random.seed(p.seed)
            cache, cached = None, 0
            if p.cache_prompt and p.kv.default and self._prompt_cache is not None:
                cache, cached = self._prompt_cache.fetch(req.tokens)
            for choice in choices:
                choice.cached_tokens = cached
            if len(choices) == 1:
                self._start(req, req.tokens[cached:], cache, req.tokens[:cached])
            else:
                cache = cache if cache is not None else new_cache(self._model, p.kv)
                self._prefills.append(SharedPrefill(self._model, req.tokens[cached:], cache,
                                                    req.tokens[:cached], choices))
        except Exception as e:  # noqa: BLE001
            self._fail_start(choices, e)
            return
        self._count_active()

    def _start(self, req: Request, tokens: list[int], cache, all_tokens: list[int]) -> None:
        """Put one choice into its lane, with its own sampler and logits processors."""
        p = req.params
        req.lane = self._lane_for(p.kv)
        if p.logprobs is not None and self._token_text is None:
            self._token_text = TokenText(self._tokenizer)
        req.uid = self._lanes[req.lane].insert(
            tokens, cache=cache, all_tokens=all_tokens, max_tokens=p.max_tokens,
            sampler=make_sampler(temp=p.temperature, top_p=p.top_p if p.top_p < 1.0 else 0.0),
            processors=logits_processors(p, self._tokenizer))
        req.detokenizer = self._tokenizer.detokenizer
        self._requests[(req.lane, req.uid)] = req

    def _fail_start(self, choices: list[Request], error: Exception) -> None:
        for req in choices:
            self._remove(req)
            self._retire(req.lane)
            self._outbox.emit(req, EngineError(f"could not start generation: {error}"))

    def _step_prefills(self) -> None:
        """Read one chunk of each shared prompt; a prompt read in full starts its choices."""
        for job in list(self._prefills):
            try:
                if not job.step(prefill_chunk(job.requests[0].params.kv, self.prefill_step)):
                    continue
                self._prefills.remove(job)
                for req, cache in job.fork():
                    self._start(req, job.pending, cache, job.fed)
            except Exception as e:  # noqa: BLE001 - ends these choices, not the thread
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
            lane_type = BatchLane if kv.batches else SoloLane
            self._lanes[key] = lane_type(self._model, kv, self._stop_tokens)
        return key

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
        self._count_active()

    def _drop_from_prefills(self, req: Request) -> None:
        for job in self._prefills:
            if req in job.requests:
                job.requests.remove(req)
                if not job.requests:
                    self._prefills.remove(job)
                return

    def _store(self, req: Request, cache, tokens) -> None:
        # one choice's KV is enough for the next turn, whichever choice the client keeps
        if req.params.cache_prompt and req.params.kv.default and self._prompt_cache is not None and cache \
                and req.index == 0:
            self._prompt_cache.store(list(tokens), cache)

    def _abort_all(self, error: BaseException) -> None:
        waiting = [req for job in self._prefills for req in job.requests]
        for req in list(self._requests.values()) + waiting:
            self._remove(req)
            self._outbox.emit(req, error)

    def _step(self) -> None:
        if self._prefills:
            self._step_prefills()
        for key, lane in list(self._lanes.items()):
            if lane.empty:
                continue
            lane.set_prefill_step(self.prefill_step)
            try:
                steps = lane.step()
            except Exception as e:  # noqa: BLE001 - one bad step must not kill the thread
                log.exception("generation step failed on %s", self.model_id)
                self._fail_lane(key, EngineError(f"generation failed: {type(e).__name__}"))
                continue
            for step in steps:
                req = self._requests.get((key, step.uid))
                if req is None:
                    continue
                try:   # a request that fails here ends alone; the lane and the thread go on
                    if step.finish_reason is not None:
                        self._store(req, step.prompt_cache, step.all_tokens)
                    self._deliver(req, step.token, step.finish_reason, step.logprobs)
                except Exception as e:  # noqa: BLE001
                    log.exception("delivering a token failed on %s", self.model_id)
                    self._remove(req)
                    self._outbox.emit(req, EngineError(f"generation failed: {type(e).__name__}"))
            self._retire(key)
        if time.monotonic() - self._stats_at >= STATS_INTERVAL or not self._requests:
            self._update_cache_stats()

    def _fail_lane(self, key, error: EngineError) -> None:
        for req in [r for (k, _), r in self._requests.items() if k == key]:
            self._remove(req)
            self._outbox.emit(req, error)
        lane = self._lanes.pop(key, None)
        if lane is not None:
            lane.close()
        if key == KVConfig():
            self._lanes[key] = BatchLane(self._model, KVConfig(), self._stop_tokens)

    def _update_cache_stats(self) -> None:
        self._stats_at = time.monotonic()
        pc = self._prompt_cache
        kv = sum(lane.kv_bytes for lane in self._lanes.values()) + sum(job.kv_bytes for job in self._prefills)
        disk = pc.disk if pc is not None else None
        self.cache_stats = CacheStats(kv_bytes=kv) if pc is None else CacheStats(
            kv_bytes=kv, prompt_cache_bytes=pc.nbytes, prompt_cache_entries=pc.entries,
            prompt_cache_cap_bytes=pc.cap_bytes, hits=pc.stats.hits, misses=pc.stats.misses,
            tokens_saved=pc.stats.tokens_saved, disk_bytes=disk.nbytes if disk else 0,
            disk_entries=disk.entries if disk else 0, disk_hits=disk.stats.hits if disk else 0)

    def _shrink_prompt_cache(self, cap_bytes: int, free_bytes: int) -> int:
        pc = self._prompt_cache
        if pc is None:
            return 0
        freed = pc.set_cap(cap_bytes)
        if free_bytes > freed:
            freed += pc.trim(pc.nbytes - (free_bytes - freed))
        self._update_cache_stats()
        return freed

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

    def _release(self, cmd: _Command) -> None:
        with ACCOUNTING:          # no load fills weights while the fall is measured
            rss_before, active_before = _rss(), mx.get_active_memory()
            held = self._weight_bytes + sum(lane.kv_bytes for lane in self._lanes.values()) + (
                self._prompt_cache.nbytes if self._prompt_cache is not None else 0)
            self._abort_all(RequestAborted(cmd.message or "the model was unloaded", "model_unloaded"))
            self._outbox.flush()
            if self._prompt_cache is not None:
                self._prompt_cache.clear()
            mx.synchronize(generation_stream)  # mlx-lm's look-ahead step still holds arrays
            self._drop_model()
            result = ReleaseResult(active_before, mx.get_active_memory(), rss_before, _rss(), held)
        _resolve(cmd, result)

    def _drop_model(self) -> None:
        for lane in self._lanes.values():
            lane.close()
        self._lanes = {}
        self._prefills = []
        self._token_text = None
        self._model = self._tokenizer = None
        self._requests.clear()
        release_memory()

