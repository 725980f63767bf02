"""What an engine is to the pool: the values it takes and gives, its errors, and its methods.

`Engine` (engine.py) is the MLX one; tests give the pool a small fake with the same methods through
the pool's `engine_factory`."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Protocol

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
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    cache_prompt: bool = True      # reuse and store prefix KV in the model's prompt cache
    kv: KVConfig = KVConfig()


@dataclass(frozen=True)
class Chunk:
    """A piece of generated text; the last one of a request carries `finish_reason`."""
    text: str
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0         # prompt tokens whose KV came from the prompt cache


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

    @property
    def freed_bytes(self) -> int:
        return max(0, self.active_before - self.active_after)


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


class EngineLike(Protocol):
    model_id: str
    abort_load: bool
    model_info: dict   # layers, kv_heads, head_dim, bytes_per_element, context_length
    cache_stats: CacheStats

    def __init__(self, model_id: str, path: Path, *, prompt_cache_bytes: int = 0,
                 prompt_cache_entries: int = 10): ...
    async def load(self, *, memory_free: threading.Event | None = None) -> LoadResult: ...
    async def stop(self, message: str = ...) -> ReleaseResult: ...
    async def call(self, fn: Callable[[], Any]) -> Any: ...
    async def shrink_prompt_cache(self, *, cap_bytes: int, free_bytes: int = 0) -> int: ...
    def abort_all(self, message: str, code: str = ...) -> None: ...
    def encode_chat(self, messages: list[dict]) -> list[int]: ...
    def encode_text(self, prompt: str) -> list[int]: ...
    def generate(self, tokens: list[int], params: SamplingParams) -> AsyncIterator[Chunk]: ...
