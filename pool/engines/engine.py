"""One Engine per loaded model: mlx-lm loading and batched generation on the engine's own thread.

The event loop never touches MLX. It sends commands through a queue; the engine thread runs a
`BatchGenerator` (continuous batching: requests join and leave between decode steps) and hands
what each step produced back to the event loop in one `loop.call_soon_threadsafe` per step.
"""

from __future__ import annotations

import asyncio
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

from .lanes import BatchLane, SoloLane
from .loading import fill_weights, model_info, open_model
from .native import ACCOUNTING, release_memory
from .prompt_cache import PromptCache, make_prompt_cache_store
from .requests import Outbox, Request, coalesced
from .types import (CacheStats, Chunk, EngineError, KVConfig, LoadAborted, LoadResult, ReleaseResult,
                    RequestAborted, SamplingParams)

log = logging.getLogger(__name__)

STATS_INTERVAL = 0.05     # seconds between two readings of the KV sizes while requests decode
PREFILL_STEP = 512         # prompt tokens read per step until the pool sets its own (OMLX_PREFILL_STEP)


@dataclass
class _Command:
    kind: str                      # "insert" | "cancel" | "call" | "abort_all" | "stop"
    request: Request | None = None
    fn: Callable[[], Any] | None = None
    future: asyncio.Future | None = None
    loop: asyncio.AbstractEventLoop | None = None
    message: str = ""
    error: BaseException | None = None


def _resolve(cmd: _Command, result: Any = None, error: BaseException | None = None) -> None:
    fut, loop = cmd.future, cmd.loop
    if fut is None or loop is None:
        return

    def settle():
        if fut.done():
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)
    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:
        pass


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
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._model = None
        self._tokenizer = None
        self._lanes: dict[Any, BatchLane | SoloLane] = {}    # KVConfig, or ("solo", n) for quantized KV
        self._solo_ids = itertools.count()
        self._stop_tokens: list[list[int]] = []
        self.prefill_step = PREFILL_STEP     # the enforcer lowers it under pressure (read each step)
        self._requests: dict[int, Request] = {}
        self._outbox = Outbox()
        self._stats_at = 0.0
        self._stop_command: _Command | None = None
        self.abort_load = False
        self.model_info: dict = {}
        self.active_requests = 0

    # ---- lifecycle -------------------------------------------------------------------------

    async def load(self, *, memory_free: threading.Event | None = None) -> LoadResult:
        """Load on a new engine thread. With `memory_free`, everything but the weights is read first
        and the weights wait for it (set once the models this load evicts are gone)."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._thread = threading.Thread(target=self._run, args=(loop, fut, memory_free),
                                        name=f"engine:{self.model_id}", daemon=True)
        self._thread.start()
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
        self._commands.put(_Command(kind, future=fut, loop=loop, **kw))
        return await fut

    # ---- prompts ---------------------------------------------------------------------------

    @property
    def tokenizer(self):
        return self._tokenizer

    def encode_chat(self, messages: list[dict]) -> list[int]:
        tok = self._tokenizer
        if getattr(tok, "has_chat_template", False):
            return list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
        return list(tok.encode(text))

    def encode_text(self, prompt: str) -> list[int]:
        return list(self._tokenizer.encode(prompt))

    # ---- generation ------------------------------------------------------------------------

    async def generate(self, tokens: list[int], params: SamplingParams) -> AsyncIterator[Chunk]:
        """Yield chunks of text. Closing or cancelling the iterator removes the request from the
        batch before the next decode step."""
        loop = asyncio.get_running_loop()
        req = Request(tokens=tokens, params=params, loop=loop)
        self._commands.put(_Command("insert", request=req))
        try:
            while True:
                if not req.arrived:
                    await req.ready.wait()
                req.ready.clear()
                items, req.arrived = coalesced(req.arrived), []
                for item in items:
                    if isinstance(item, BaseException):
                        raise item
                    yield item
                    if item.finish_reason is not None:
                        return
        finally:
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
            mx.synchronize()
            mx.clear_streams()  # without this ~13% of processes abort at exit

    def _load(self, memory_free: threading.Event | None) -> LoadResult:
        started = time.perf_counter()
        model, tokenizer, config = open_model(self.path)
        self._model, self._tokenizer = model, tokenizer
        if memory_free is not None:
            memory_free.wait()
        if self.abort_load:
            raise LoadAborted("load aborted: process memory pressure")
        # the weights' own bytes, not MLX's active-memory delta: other engines allocate meanwhile
        weight_bytes = fill_weights(model)
        self.model_info = model_info(model, config)
        self._prompt_cache = make_prompt_cache_store(self.model_id, self.path, *self._cache_options)
        self._stop_tokens = [[t] for t in sorted(tokenizer.eos_token_ids)]
        self._lanes = {KVConfig(): BatchLane(model, KVConfig(), self._stop_tokens)}
        return LoadResult(measured_bytes=weight_bytes,
                          seconds=time.perf_counter() - started, model_info=self.model_info)

    def _serve(self) -> None:
        while self._stop_command is None:
            self._handle_commands(block=not self._requests)
            if self._requests and self._stop_command is None:
                self._step()
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
                self._insert(cmd.request)
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

    def _insert(self, req: Request) -> None:
        p = req.params
        try:   # anything that fails here ends this request, never the engine's thread
            if p.seed is not None:
                mx.random.seed(p.seed)
            cache = None
            if p.cache_prompt and p.kv.default and self._prompt_cache is not None:
                cache, req.cached_tokens = self._prompt_cache.fetch(req.tokens)
            req.lane = self._lane_for(p.kv)
            req.uid = self._lanes[req.lane].insert(
                req.tokens[req.cached_tokens:], cache=cache, all_tokens=req.tokens[:req.cached_tokens],
                max_tokens=p.max_tokens, sampler=make_sampler(temp=p.temperature, top_p=p.top_p if p.top_p < 1.0 else 0.0))
        except Exception as e:  # noqa: BLE001
            req.done = True
            self._retire(req.lane)
            self._outbox.emit(req, EngineError(f"could not start generation: {e}"))
            return
        req.detokenizer = self._tokenizer.detokenizer
        self._requests[(req.lane, req.uid)] = req
        self.active_requests = len(self._requests)

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
        req.done = True
        self.active_requests = len(self._requests)

    def _store(self, req: Request, cache, tokens) -> None:
        if req.params.cache_prompt and req.params.kv.default and self._prompt_cache is not None and cache:
            self._prompt_cache.store(list(tokens), cache)

    def _abort_all(self, error: BaseException) -> None:
        for req in list(self._requests.values()):
            self._remove(req)
            self._outbox.emit(req, error)

    def _step(self) -> None:
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
                    self._deliver(req, step.token, step.finish_reason)
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
        kv = sum(lane.kv_bytes for lane in self._lanes.values())
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

    def _deliver(self, req: Request, token: int, finish_reason: str | None) -> None:
        chunk, stopped_here = req.advance(token, finish_reason)
        if chunk is not None:
            self._outbox.emit(req, chunk)
        if chunk is not None and chunk.finish_reason is not None:
            self._remove(req, keep_cache=stopped_here)   # a stop string ends it before the generator does

    def _release(self, cmd: _Command) -> None:
        with ACCOUNTING:          # no load fills weights while the fall is measured
            rss_before, active_before = _rss(), mx.get_active_memory()
            self._abort_all(RequestAborted(cmd.message or "the model was unloaded", "model_unloaded"))
            self._outbox.flush()
            if self._prompt_cache is not None:
                self._prompt_cache.clear()
            mx.synchronize(generation_stream)  # mlx-lm's look-ahead step still holds arrays
            self._drop_model()
            result = ReleaseResult(active_before, mx.get_active_memory(), rss_before, _rss())
        _resolve(cmd, result)

    def _drop_model(self) -> None:
        for lane in self._lanes.values():
            lane.close()
        self._lanes = {}
        self._model = self._tokenizer = None
        self._requests.clear()
        release_memory()

