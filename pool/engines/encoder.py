"""EmbeddingEngine: an embedding model's engine (protocol.Encoder): a BERT sentence encoder on its
engine thread (worker.py owns the thread, its commands and the measured release). One request's
inputs are encoded in batches of similar length; concurrent requests queue on the thread, one after
another.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import Sequence

import mlx.core as mx
import numpy as np

from .bert import Pooling, open_bert, pool_states, read_pooling
from .loading import fill_weights
from .mailbox import Command
from .protocol import EngineError, LoadAborted, LoadOptions, LoadResult, RequestAborted
from .worker import EngineWorker, unloaded

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


class EmbeddingEngine(EngineWorker):
    thread_label = "embedding"

    def __init__(self, model_id: str, path: Path, *, load: LoadOptions = LoadOptions()):
        super().__init__(model_id, path)
        self._load_options = load
        self._weight_bytes = 0
        self.tokenizer = None
        # transformers sets the Rust tokenizer's truncation and padding on every call: two threads
        # in it at once can fail with "Already borrowed", so requests tokenize one at a time
        self._tokenizing = threading.Lock()
        self._model = None
        self._pooling = Pooling()
        self._around: tuple[list[int], list[int]] = ([], [])
        self._aborted: tuple[int, RequestAborted | None] = (0, None)   # (epoch, why), replaced as one

    def abort_all(self, message: str, code: str = "request_aborted") -> None:
        """Fail the running request and every queued one; later requests run as usual."""
        epoch, _ = self._aborted
        self._aborted = (epoch + 1, RequestAborted(message, code))

    def _before_stop(self, message: str) -> None:
        self.abort_all(message, "model_unloaded")

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

    async def embed(self, tokens: list[list[int]]) -> np.ndarray:
        """(len(tokens), dimensions) float32 vectors, in the order given."""
        epoch = self._aborted[0]
        loop = asyncio.get_running_loop()
        future = loop.create_future()     # cancelled with its request: the thread stops between batches
        if not self._mailbox.put(Command(lambda: self._embed(tokens, epoch, future), loop=loop, future=future)):
            raise unloaded()
        return await future

    # ---- the engine thread -----------------------------------------------------------------

    def _open(self, memory_free: threading.Event | None) -> LoadResult:
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
        weight_bytes = self._weight_bytes = fill_weights(model, self._load_options.group_bytes, self.load_progress)
        if self.abort_load:
            raise LoadAborted("load aborted: process memory pressure")
        c = model.config
        limit = min(filter(None, (self._pooling.max_tokens, c.max_position_embeddings)))
        self.model_info = {"kind": "embeddings", "dimensions": c.hidden_size, "max_tokens": limit,
                           "context_length": limit, "layers": c.num_hidden_layers, "vocab_size": c.vocab_size,
                           "pooling": self._pooling.mode, "normalized": self._pooling.normalize}
        return LoadResult(measured_bytes=weight_bytes, seconds=time.perf_counter() - started,
                          model_info=self.model_info)

    def _check(self, epoch: int) -> None:
        """Raises when the request was aborted since it was sent."""
        now, error = self._aborted
        if now != epoch:
            raise error

    def _embed(self, tokens: list[list[int]], epoch: int, waiting: asyncio.Future) -> np.ndarray:
        try:
            return self._encode(tokens, epoch, waiting)
        except RequestAborted:
            raise
        except Exception as e:
            log.exception("embedding failed on %s", self.model_id)
            raise EngineError(f"embedding failed: {type(e).__name__}: {e}") from None

    def _encode(self, tokens: list[list[int]], epoch: int, waiting: asyncio.Future) -> np.ndarray:
        out = np.empty((len(tokens), self.model_info["dimensions"]), dtype=np.float32)
        pad = self.tokenizer.pad_token_id or 0
        for batch in plan_batches([len(t) for t in tokens]):
            self._check(epoch)
            if waiting.done():               # nobody waits any more (the request was cancelled)
                return out
            width = max(len(tokens[i]) for i in batch)
            ids = np.full((len(batch), width), pad, dtype=np.int32)
            mask = np.zeros((len(batch), width), dtype=np.int32)
            for row, i in enumerate(batch):
                ids[row, :len(tokens[i])] = tokens[i]
                mask[row, :len(tokens[i])] = 1
            ids_mx, mask_mx = mx.array(ids), mx.array(mask)
            vectors = pool_states(self._model(ids_mx, mask_mx), mask_mx, self._pooling)
            out[batch] = np.array(vectors)
        self._check(epoch)
        return out

    def _held_bytes(self) -> int:
        return self._weight_bytes

    def _drop_model(self) -> None:
        self._model = None
        self.tokenizer = None
        super()._drop_model()
