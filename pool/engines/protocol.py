"""What an engine is to the pool: the values it takes and gives, its errors, and its methods, split
by what a kind of model does (as vLLM separates `generate` from `encode`):

- `Engine`: what every engine does: load, stop (measuring what it freed), run a function on its
  thread, abort its requests;
- `TextGenerator`: an engine that tokenizes prompts and generates text (pool/engines/generator.py);
- `Encoder`: an engine that turns inputs into vectors (pool/engines/encoder.py).

pool/catalog/kinds.py says which kind of model gets which engine. Tests give the pool small fakes with the
same methods (tests/fakes.py)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Protocol, Sequence

from ..policy.kv import KVConfig


class EngineError(RuntimeError):
    """The engine failed while serving a request (reported as a 500 without a traceback)."""


class RequestAborted(RuntimeError):
    """The request was ended from outside: an unload, or the memory enforcer."""

    def __init__(self, message: str, code: str = "request_aborted"):
        super().__init__(message)
        self.code = code


class LoadAborted(RuntimeError):
    pass


@dataclass(frozen=True)
class LoadOptions:
    """How an engine reads its model: decided by the pool (pool/host/engine_pool.py), obeyed here."""
    group_bytes: int = 64 * 2**20     # weight bytes evaluated at a time (OMLX_LOAD_GROUP_BYTES)
    dequantize: bool = False          # serve a quantized model as float32 (the CPU backend, when it fits)
    warm_batches: tuple[int, ...] = ()   # after the load, batch sizes run once in the background (warmup.py)
    warm_prompt: int = 0              # and one prompt of this many tokens (0: none)
    draft: Path | None = None         # a draft model's folder: proposes tokens for a lone request (drafting.py)
    draft_dequantize: bool = False    # read the draft dequantized (its own folder's choice, as for any model)
    draft_tokens: int = 3             # tokens it proposes a round (OMLX_DRAFT_TOKENS)
    draft_min_acceptance: float = 0.3  # below this share accepted, it stops paying (OMLX_DRAFT_MIN_ACCEPTANCE)


@dataclass(frozen=True)
class PromptCacheOptions:
    """A language model's prefix cache: its caps in memory and its disk tier (0 = none)."""
    max_bytes: int = 0
    max_entries: int = 10
    folder: Path | None = None
    disk_bytes: int = 0
    disk_total_bytes: int | None = None   # the disk tier's total across models (folder's parent); None = auto


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    cache_prompt: bool = True      # reuse and store prefix KV in the model's prompt cache
    kv: KVConfig = KVConfig()
    n: int = 1                     # choices from one prompt, read once
    logit_bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float | None = None
    logprobs: int | None = None    # None: off; k: each token's logprob and the k most likely
    constraint: Any = None         # has make_processor(tokenizer) -> a logits processor
    cache_scope: str | None = None  # prompt cache entries it may reuse and makes: its API key's (None: shared)
    checkpoints: tuple[int, ...] = ()   # prompt positions the prompt cache keeps (a cache that cannot be cut back)
    adapter: str | None = None     # a LoRA adapter attached to this (base) engine that the request runs with
    progress: Any = None           # the request's trace: the engine thread sets its `generated` and `prefill_done`

    @property
    def processed(self) -> bool:
        """Whether this request's logits pass through processors of its own."""
        return bool(self.logit_bias or self.presence_penalty or self.frequency_penalty
                    or self.repetition_penalty is not None or self.constraint is not None)


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token: its text, log-probability, UTF-8 bytes, and the most likely tokens at
    its step as (text, logprob, bytes), most likely first."""
    token: str
    logprob: float
    bytes: tuple[int, ...]
    top: tuple[tuple[str, float, tuple[int, ...]], ...] = ()


@dataclass(frozen=True)
class Chunk:
    """A piece of generated text; the last one of a choice carries `finish_reason`."""
    text: str
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0         # prompt tokens whose KV came from the prompt cache
    logprobs: tuple[TokenLogprob, ...] = ()   # the tokens since the last chunk (text held back included)
    index: int = 0                 # the choice, when a request asked for several (n)
    stop_sequence: str | None = None   # on the last chunk: the stop string that ended the choice
    draft_proposed: int = 0        # on the last chunk: tokens its model's draft proposed (speculative decoding)
    draft_accepted: int = 0        # ... and of them, those the model kept


@dataclass(frozen=True)
class LoadResult:
    measured_bytes: int
    seconds: float
    model_info: dict


@dataclass(frozen=True)
class ReleaseResult:
    active_before: int
    active_after: int
    rss_before: int
    rss_after: int
    held_bytes: int = 0      # the engine's own arrays when it let them go: weights, caches, KV
    kept_bytes: int = 0      # weights something still held after the release (a leak: 0 when it works)
    cache_before: int = 0    # MLX's buffer cache across the release
    cache_after: int = 0

    @property
    def active_drop(self) -> int:
        """The fall of the process's MLX active memory across the release; other engines' work
        moves it too, so it measures this release only while they are idle."""
        return max(0, self.active_before - self.active_after)

    @property
    def freed_bytes(self) -> int:
        """What MLX gave back to the device: the fall of its active memory and its buffer cache
        together (weights freed into the cache and left there are not freed)."""
        return max(0, self.active_before + self.cache_before - self.active_after - self.cache_after)


@dataclass(frozen=True)
class CacheStats:
    """One engine's KV memory, as the snapshot shows it (read from the loop, written by the thread)."""
    kv_bytes: int = 0                 # live KV of its running requests
    prompt_cache_bytes: int = 0
    prompt_cache_entries: int = 0
    prompt_cache_cap_bytes: int = 0
    hits: int = 0
    misses: int = 0
    tokens_saved: int = 0
    disk_bytes: int = 0               # the prompt cache's disk tier
    disk_entries: int = 0
    disk_hits: int = 0


class Engine(Protocol):
    model_id: str
    abort_load: bool
    model_info: dict   # what the pool and the door read: context_length, and a kind's own fields
    cache_stats: CacheStats

    async def load(self, *, memory_free: threading.Event | None = None) -> LoadResult: ...
    async def stop(self, message: str = ...) -> ReleaseResult: ...
    async def call(self, fn: Callable[[], Any]) -> Any: ...
    def abort_all(self, message: str, code: str = ...) -> None: ...
    def trim_heap(self) -> None: ...


class TextGenerator(Engine, Protocol):
    prefill_step: int      # prompt tokens read per step; memory pressure lowers it
    tokenizer: Any
    vocab_size: int | None

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]: ...
    def chat_checkpoints(self, messages: list[dict], tools: list[dict] | None,
                         prompt: list[int]) -> tuple[int, ...]: ...
    def encode_text(self, prompt: str) -> list[int]: ...
    def prepare_constraints(self) -> None: ...
    def generate(self, tokens: list[int], params: SamplingParams) -> AsyncIterator[Chunk]: ...
    async def shrink_prompt_cache(self, *, cap_bytes: int, free_bytes: int = 0) -> int: ...


class Encoder(Engine, Protocol):
    def tokenize(self, inputs: Sequence[str | Sequence[int]]) -> list[list[int]]: ...
    async def embed(self, tokens: list[list[int]]) -> Any: ...    # (inputs, dimensions) float32 array
