"""Where an engine's requests decode, by the KV cache they asked for.

Requests whose KV configuration can share a batch share a `BatchLane`: one mlx-lm BatchGenerator.
The default (a growing KVCache) is one lane; each `max_kv_size` is another (a RotatingKVCache built
by hand, since mlx-lm's make_prompt_cache ignores max_kv_size for llama, whose model makes its own
cache). Quantized KV (`kv_bits`) has no batched cache in mlx-lm, so each such request decodes in a
`SoloLane` of its own: mlx-lm's generate_step, one token per engine step, beside the batches. The
engine steps every lane in turn, so all of them run concurrently on its one thread."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, generate_step, generation_stream
from mlx_lm.models.cache import RotatingKVCache

from .types import KVConfig

ROTATING_KEEP = 4          # tokens a rotating cache always keeps at the start (mlx-lm's default)


@dataclass(frozen=True)
class Step:
    """One token for one request of a lane; the last carries the request's KV and tokens."""
    uid: int
    token: int
    finish_reason: str | None
    prompt_cache: list[Any] | None = None
    all_tokens: list[int] | None = None


class BatchLane:
    def __init__(self, model, config: KVConfig, stop_tokens: list[list[int]]):
        self.model, self.config = model, config
        self._generator = BatchGenerator(model, stop_tokens=stop_tokens, stream=generation_stream)
        self._live: set[int] = set()

    def set_prefill_step(self, tokens: int) -> None:
        # read by each step: the next chunk uses it. A rotating cache holds its window plus the chunk
        # being read, so its chunks are a quarter of the window: the peak stays near the window.
        if self.config.max_kv_size is not None:
            tokens = min(tokens, max(ROTATING_KEEP * 16, self.config.max_kv_size // 4))
        self._generator.prefill_step_size = tokens

    def insert(self, tokens: list[int], *, cache, all_tokens: list[int], max_tokens: int, sampler) -> int:
        if cache is None and self.config.max_kv_size is not None:
            cache = [RotatingKVCache(max_size=self.config.max_kv_size, keep=ROTATING_KEEP) for _ in self.model.layers]
        (uid,) = self._generator.insert([tokens], max_tokens=[max_tokens], caches=[cache],
                                        all_tokens=[all_tokens], samplers=[sampler])
        self._live.add(uid)
        return uid

    def step(self) -> list[Step]:
        _, responses = self._generator.next()
        steps = []
        for r in responses:
            if r.finish_reason is not None:
                self._live.discard(r.uid)
            steps.append(Step(r.uid, r.token, r.finish_reason, r.prompt_cache, r.all_tokens))
        return steps

    def remove(self, uid: int, *, keep_cache: bool = False):
        """Take a request out; with keep_cache, returns (its KV, its tokens) for the prompt cache."""
        self._live.discard(uid)
        caches = self._generator.remove([uid], return_prompt_caches=keep_cache)
        return caches.get(uid)

    @property
    def kv_bytes(self) -> int:
        return self._generator.prompt_cache_nbytes if self._live else 0

    @property
    def empty(self) -> bool:
        return not self._live

    def close(self) -> None:
        self._generator.close()


class SoloLane:
    """One request with quantized KV: mlx-lm's generate_step (kv_bits, kv_group_size,
    quantized_kv_start), stopping at the model's stop tokens and at max_tokens."""

    def __init__(self, model, config: KVConfig, stop_tokens: list[list[int]]):
        self.model, self.config = model, config
        self._stop = {t for seq in stop_tokens for t in seq if len(seq) == 1}
        self._steps = None
        self._cache: list[Any] = []
        self._uid, self._max_tokens, self._generated = 0, 0, 0
        self._prefill_step = 2048

    def set_prefill_step(self, tokens: int) -> None:
        self._prefill_step = tokens                   # for a request not yet started

    def insert(self, tokens: list[int], *, cache, all_tokens: list[int], max_tokens: int, sampler) -> int:
        from mlx_lm.models.cache import make_prompt_cache

        self._cache = cache or make_prompt_cache(self.model)
        self._max_tokens = max_tokens
        c = self.config
        self._steps = generate_step(mx.array(tokens), self.model, max_tokens=max_tokens, sampler=sampler,
                                    prompt_cache=self._cache, kv_bits=c.kv_bits, kv_group_size=c.kv_group_size,
                                    quantized_kv_start=c.quantized_kv_start, prefill_step_size=self._prefill_step)
        return self._uid

    def step(self) -> list[Step]:
        if self._steps is None:
            return []
        token, _ = next(self._steps)
        token = int(token.item() if hasattr(token, "item") else token)
        self._generated += 1
        finish = "stop" if token in self._stop else ("length" if self._generated >= self._max_tokens else None)
        if finish is not None:
            self._steps.close()
            self._steps = None
        return [Step(self._uid, token, finish)]

    def remove(self, uid: int, *, keep_cache: bool = False):
        if self._steps is not None:
            self._steps.close()
            self._steps = None
        return None

    @property
    def kv_bytes(self) -> int:
        return sum(c.nbytes for c in self._cache) if self._steps is not None else 0

    @property
    def empty(self) -> bool:
        return self._steps is None

    def close(self) -> None:
        self._cache = []
