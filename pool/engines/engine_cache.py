"""A text engine's prompt cache and KV accounting, on its engine thread: what a request leaves in
the prompt cache, the cache's cap that memory pressure moves, and the sizes the snapshot reads."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from .generation_request import Request
from .prompt_cache import PromptCache
from .protocol import CacheStats

KV_GROWTH_STEP = 64 * 2**20   # the live KV grown by this much since the last report wakes the enforcer


class PromptCaching:
    """Mixed into TextEngine: `_prompt_cache`, `_lanes` and `_prefills` are the engine's."""

    _prompt_cache: PromptCache | None
    _lanes: dict[Any, Any]
    _prefills: list[Any]
    _on_kv_growth: Callable[[int], None] | None
    _kv_reported: int
    _stats_at: float
    _stats_stale: bool
    cache_stats: CacheStats
    call: Any

    async def shrink_prompt_cache(self, *, cap_bytes: int, free_bytes: int = 0) -> int:
        """Set the prompt cache's cap, and drop least recently used entries until `free_bytes` more
        are freed; returns the bytes freed."""
        freed = await self.call(lambda: self._shrink_prompt_cache(cap_bytes, free_bytes))
        if (store := self._prompt_cache) is not None:   # what left memory is written: wait here, off the thread
            await asyncio.to_thread(store.wait_for_spills)
        return freed

    def _has_idle_work(self) -> bool:
        return super()._has_idle_work() or (  # type: ignore[misc]
            self._prompt_cache is not None and self._prompt_cache.waiting_for_idle)

    def _idle_step(self) -> None:
        if self._prompt_cache is None or not self._prompt_cache.prepare_next_spill():   # memory first
            super()._idle_step()  # type: ignore[misc]

    def _store(self, req: Request, cache, tokens) -> None:
        # one choice's KV is enough for the next turn, whichever choice the client keeps
        if req.params.cache_prompt and req.params.kv.default and self._prompt_cache is not None and cache \
                and req.index == 0:
            self._prompt_cache.store(list(tokens), cache, scope=req.params.cache_scope)

    def _update_cache_stats(self) -> None:
        self._stats_at, self._stats_stale = time.monotonic(), False
        pc = self._prompt_cache
        kv = sum(lane.kv_bytes for lane in self._lanes.values()) + sum(job.kv_bytes for job in self._prefills)
        disk = pc.disk if pc is not None else None
        self.cache_stats = CacheStats(kv_bytes=kv) if pc is None else CacheStats(
            kv_bytes=kv, prompt_cache_bytes=pc.nbytes, prompt_cache_entries=pc.entries,
            prompt_cache_cap_bytes=pc.cap_bytes, hits=pc.stats.hits, misses=pc.stats.misses,
            tokens_saved=pc.stats.tokens_saved, disk_bytes=disk.nbytes if disk else 0,
            disk_entries=disk.entries if disk else 0, disk_hits=disk.stats.hits if disk else 0)
        if kv < self._kv_reported:
            self._kv_reported = kv
        elif kv - self._kv_reported >= KV_GROWTH_STEP:
            self._kv_reported = kv
            if self._on_kv_growth is not None:
                self._on_kv_growth(kv)

    def _shrink_prompt_cache(self, cap_bytes: int, free_bytes: int) -> int:
        pc = self._prompt_cache
        if pc is None:
            return 0
        freed = pc.set_cap(cap_bytes)
        if free_bytes > freed:
            freed += pc.trim(pc.nbytes - (free_bytes - freed))
        self._update_cache_stats()
        return freed
