"""EmbeddingEngine: one embedding model (a BERT sentence encoder) on its own thread.

The same life cycle as `Engine` (types.EngineLike): load on an engine thread (threads.py: kept and
reused), weights measured as they are read, every MLX call on that thread, `stop` measures what the
release freed, and the thread goes back to the idle ones. One request's inputs are encoded in batches of
similar length; concurrent requests queue on the thread, one after another.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import mlx.core as mx
import numpy as np
import psutil

from .embedding_model import Pooling, open_bert, pool_states, read_pooling
from .loading import fill_weights
from .mailbox import Mailbox, settle
from .native import ACCOUNTING, release_memory
from .threads import ENGINE_THREADS, Running
from .types import CacheStats, EngineError, LoadAborted, LoadResult, ReleaseResult, RequestAborted

log = logging.getLogger(__name__)

# Padded tokens encoded in one forward pass. Bounds the activations (attention scores grow with
# batch x length^2: 2048 tokens of 256 take about 25 MB for MiniLM's 12 heads) and how long an
# abort waits (it takes effect between passes: about 1.5 s for a full one on 2 busy CPU cores),
# while still batching short inputs by the dozen.
BATCH_TOKENS = 2048


def plan_batches(lengths: Sequence[int], batch_tokens: int = BATCH_TOKENS) -> list[list[int]]:
    """Input indices grouped for the forward passes: sorted by length so that little is padded,
    each group's size x its longest input at most `batch_tokens` (an input longer than that alone)."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[i] <= batch_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def special_tokens_around(tokenizer) -> tuple[list[int], list[int]]:
    """The ids the tokenizer puts before and after a text's own ([CLS] and [SEP] for BERT), so that
    token-id input reads exactly as the text it came from."""
    bare = list(tokenizer.encode("a", add_special_tokens=False))
    full = list(tokenizer("a")["input_ids"])
    for start in range(len(full) - len(bare) + 1):
        if full[start:start + len(bare)] == bare:
            return full[:start], full[start + len(bare):]
    return [], []


class NotAChatModel(ValueError):
    pass


@dataclass
class _Job:
    kind: str                              # "embed" | "call" | "stop"
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    tokens: list[list[int]] | None = None
    fn: Callable[[], Any] | None = None
    epoch: int = 0                         # abort_all's count when it was sent


def _settle(job: _Job, result: Any = None, error: BaseException | None = None) -> None:
    settle(job.loop, job.future, result, error)


class EmbeddingEngine:
    def __init__(self, model_id: str, path: Path, **_cache_options):
        # prompt cache options are a language model's: an encoder keeps nothing between requests
        self.model_id = model_id
        self.path = Path(path)
        self.abort_load = False
        self._weight_bytes = 0
        self.model_info: dict = {}
        self.cache_stats = CacheStats()
        self.prefill_step = 0            # set by the pool for every engine; an encoder reads it never
        self.tokenizer = None
        # transformers sets the Rust tokenizer's truncation and padding on every call: two threads
        # in it at once can fail with "Already borrowed", so requests tokenize one at a time
        self._tokenizing = threading.Lock()
        self._model = None
        self._pooling = Pooling()
        self._around: tuple[list[int], list[int]] = ([], [])
        self._jobs = Mailbox()
        self._thread: Running | None = None
        self._aborted: tuple[int, RequestAborted | None] = (0, None)   # (epoch, why), replaced as one

    # ---- lifecycle -------------------------------------------------------------------------

    async def load(self, *, memory_free: threading.Event | None = None) -> LoadResult:
        loop = asyncio.get_running_loop()
        job = _Job("load", loop, loop.create_future())
        self._thread = ENGINE_THREADS.start(functools.partial(self._run, job, memory_free),
                                            name=f"embedding:{self.model_id}")
        return await job.future

    async def stop(self, message: str = "the model was unloaded") -> ReleaseResult:
        if self._thread is None or not self._thread.is_alive():
            return ReleaseResult(0, 0, 0, 0)
        self.abort_all(message, "model_unloaded")
        result = await self._send("stop")
        await asyncio.to_thread(self._thread.join, 30)
        return result

    async def call(self, fn: Callable[[], Any]) -> Any:
        return await self._send("call", fn=fn)

    async def shrink_prompt_cache(self, *, cap_bytes: int, free_bytes: int = 0) -> int:
        return 0

    def abort_all(self, message: str, code: str = "request_aborted") -> None:
        """Fail the running request and every queued one; later requests run as usual."""
        epoch, _ = self._aborted
        self._aborted = (epoch + 1, RequestAborted(message, code))

    async def _send(self, kind: str, **fields) -> Any:
        loop = asyncio.get_running_loop()
        job = _Job(kind, loop, loop.create_future(), epoch=self._aborted[0], **fields)
        if not self._jobs.put(job):
            raise RequestAborted("the model was unloaded", "model_unloaded")
        return await job.future

    # ---- inputs ------------------------------------------------------------------------------

    @property
    def max_tokens(self) -> int:
        return self.model_info["max_tokens"]

    def tokenize(self, inputs: Sequence[str | Sequence[int]]) -> list[list[int]]:
        """Each input's token ids as the model reads them, special tokens included. Token-id inputs
        are taken as a text's own ids (no special tokens), as OpenAI's are."""
        texts = [i for i, x in enumerate(inputs) if isinstance(x, str)]
        out: list[list[int] | None] = [None] * len(inputs)
        if texts:
            with self._tokenizing:
                encoded = self.tokenizer([inputs[i] for i in texts], add_special_tokens=True)["input_ids"]
            for i, ids in zip(texts, encoded):
                out[i] = list(ids)
        before, after = self._around
        for i, x in enumerate(inputs):
            if out[i] is None:
                out[i] = [*before, *x, *after]
        return out

    def encode_chat(self, messages: list[dict]) -> list[int]:
        raise NotAChatModel(f"'{self.model_id}' is an embedding model; send its inputs to /v1/embeddings")

    def encode_text(self, prompt: str) -> list[int]:
        raise NotAChatModel(f"'{self.model_id}' is an embedding model; send its inputs to /v1/embeddings")

    async def generate(self, tokens, params):
        raise EngineError(f"'{self.model_id}' is an embedding model: it does not generate text")
        yield  # pragma: no cover - an async generator, as Engine.generate is

    async def embed(self, tokens: list[list[int]]) -> np.ndarray:
        """(len(tokens), dimensions) float32 vectors, in the order given."""
        return await self._send("embed", tokens=tokens)

    # ---- the engine thread -----------------------------------------------------------------

    def _run(self, load_job: _Job, memory_free: threading.Event | None) -> None:
        try:
            try:
                result = self._load(memory_free)
            except BaseException as e:  # noqa: BLE001 - reported to the waiting coroutine
                self._drop_model()
                _settle(load_job, error=e)
                return
            _settle(load_job, result)
            self._serve()
        finally:
            for job in self._jobs.close():     # sent as the model unloaded: answered, not left waiting
                if job.kind == "stop":
                    _settle(job, ReleaseResult(0, 0, 0, 0))
                else:
                    _settle(job, error=RequestAborted("the model was unloaded", "model_unloaded"))

    def _load(self, memory_free: threading.Event | None) -> LoadResult:
        from transformers import AutoTokenizer

        started = time.perf_counter()
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.path))
        self._around = special_tokens_around(self.tokenizer)
        self._pooling = read_pooling(self.path)
        model = open_bert(self.path)
        if memory_free is not None:
            memory_free.wait()
        if self.abort_load:
            raise LoadAborted("load aborted: process memory pressure")
        self._model = model
        weight_bytes = self._weight_bytes = fill_weights(model)
        if self.abort_load:
            raise LoadAborted("load aborted: process memory pressure")
        c = model.config
        limit = min(filter(None, (self._pooling.max_tokens, c.max_position_embeddings)))
        self.model_info = {"kind": "embeddings", "dimensions": c.hidden_size, "max_tokens": limit,
                           "context_length": limit, "layers": c.num_hidden_layers, "vocab_size": c.vocab_size,
                           "pooling": self._pooling.mode, "normalized": self._pooling.normalize}
        return LoadResult(measured_bytes=weight_bytes, seconds=time.perf_counter() - started,
                          model_info=self.model_info)

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job.kind == "stop":
                _settle(job, self._release())
                return
            try:
                if job.kind == "call":
                    _settle(job, job.fn())
                elif job.kind == "embed":
                    self._embed(job)
            except RequestAborted as e:
                _settle(job, error=e)
            except Exception as e:  # noqa: BLE001 - one bad request must not end the thread
                log.exception("embedding failed on %s", self.model_id)
                _settle(job, error=EngineError(f"embedding failed: {type(e).__name__}: {e}"))

    def _check(self, job: _Job) -> bool:
        """False when nobody waits any more; raises when the request was aborted."""
        epoch, error = self._aborted
        if epoch != job.epoch:
            raise error
        return not job.future.done()

    def _embed(self, job: _Job) -> None:
        tokens = job.tokens
        out = np.empty((len(tokens), self.model_info["dimensions"]), dtype=np.float32)
        pad = self.tokenizer.pad_token_id or 0
        for batch in plan_batches([len(t) for t in tokens]):
            if not self._check(job):
                return
            width = max(len(tokens[i]) for i in batch)
            ids = np.full((len(batch), width), pad, dtype=np.int32)
            mask = np.zeros((len(batch), width), dtype=np.int32)
            for row, i in enumerate(batch):
                ids[row, :len(tokens[i])] = tokens[i]
                mask[row, :len(tokens[i])] = 1
            ids_mx, mask_mx = mx.array(ids), mx.array(mask)
            vectors = pool_states(self._model(ids_mx, mask_mx), mask_mx, self._pooling)
            out[batch] = np.array(vectors)
        if self._check(job):
            _settle(job, out)

    def _release(self) -> ReleaseResult:
        with ACCOUNTING:          # no load fills weights while the fall is measured
            rss_before, active_before = _rss(), mx.get_active_memory()
            mx.synchronize()
            self._drop_model()
            return ReleaseResult(active_before, mx.get_active_memory(), rss_before, _rss(), self._weight_bytes)

    def _drop_model(self) -> None:
        self._model = None
        self.tokenizer = None
        release_memory()


def _rss() -> int:
    return psutil.Process().memory_info().rss
