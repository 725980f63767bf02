"""One model's prefix (prompt) cache, on its engine thread: mlx-lm's LRUPromptCache, bounded by a
cap that memory pressure moves, with the counters the snapshot shows.

A request takes the longest cached prefix of its tokens (an exact entry, a shorter one, or a longer
one trimmed: LRUPromptCache's own search) as a private deep copy, so concurrent requests never
share mutable KV. A finished request stores its prompt + completion KV, so the next turn of the
same chat starts from it.

With a disk tier, entries are written while the engine is idle (`save_one`, called between requests)
and when the cache is cleared or shrunk from outside (an unload, memory pressure). Writing one as
LRU churn pushes it out would stall every running stream: mlx's safetensors writer holds the GIL
(measured on the GPU at 32 streams: 19% of the engine thread). An entry pushed out by new entries
before the engine was idle is dropped and counted (`spills_dropped`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from mlx_lm.models.cache import LRUPromptCache, PromptTrie, can_trim_prompt_cache, trim_prompt_cache

from .disk_cache import DiskCache, model_fingerprint
from .protocol import PromptCacheOptions

log = logging.getLogger(__name__)

KEY = "model"   # LRUPromptCache keys entries by model too; one store serves one model


@dataclass
class PromptCacheStats:
    hits: int = 0
    misses: int = 0
    tokens_saved: int = 0
    spills_dropped: int = 0     # pushed out during sustained load before they could be written


class _EvictionTrie(PromptTrie):
    """PromptTrie whose `pop` (LRUPromptCache's only way to drop an entry for space) tells us what
    went, so it can be written to disk instead of lost."""

    def __init__(self, on_evict: Callable[[list[int], list[Any]], None]):
        super().__init__()
        self.on_evict = on_evict

    def pop(self, model, tokens):
        entry = super().pop(model, tokens)
        self.on_evict(list(tokens), entry.prompt_cache)
        return entry


class PromptCache:
    def __init__(self, *, max_bytes: int, max_entries: int, disk: DiskCache | None = None,
                 on_evict: Callable[[list[int], list[Any]], None] | None = None):
        self.configured_bytes = max_bytes
        self.max_entries = max_entries
        self.disk = disk
        self._lru = LRUPromptCache(max_size=max_entries, max_bytes=max_bytes)
        self._unsaved: dict[tuple[int, ...], bool] = {}   # held here, not yet on disk (newest last)
        self._spill_now = False          # set while an unload or pressure pushes entries out
        # the trie is LRUPromptCache's; replacing it is the one hook it offers for its evictions
        self._lru._trie = _EvictionTrie(on_evict or self._evicted)
        self.stats = PromptCacheStats()

    def _evicted(self, tokens: list[int], cache: list[Any]) -> None:
        if not self._unsaved.pop(tuple(tokens), False):
            return                       # no disk tier, or already written
        if self._spill_now:
            self.disk.put(tokens, cache)
        else:
            self.stats.spills_dropped += 1

    @property
    def unsaved(self) -> bool:
        """Whether an entry waits to be written to the disk tier."""
        return bool(self._unsaved)

    def save_one(self) -> bool:
        """Write the newest entry not yet on disk; False when there is none."""
        while self._unsaved:
            key = next(reversed(self._unsaved))
            del self._unsaved[key]
            try:
                entry = self._lru._trie.get(KEY, list(key))
            except KeyError:             # replaced by a longer entry of the same chat
                continue
            self.disk.put(list(key), entry.prompt_cache)
            return True
        return False

    @property
    def nbytes(self) -> int:
        return self._lru.nbytes

    @property
    def entries(self) -> int:
        return len(self._lru)

    @property
    def cap_bytes(self) -> int:
        return self._lru.max_bytes

    def fetch(self, tokens: list[int]) -> tuple[list[Any] | None, int]:
        """(a private copy of the longest cached prefix's KV, how many tokens it covers). At least
        one token is always left to compute: the model must see one to give the next logits."""
        cache, rest = self._lru.fetch_nearest_cache(KEY, tokens)
        if cache is not None and not rest:
            trim_prompt_cache(cache, 1)
            rest = tokens[-1:]
        cached = len(tokens) - len(rest) if cache is not None else 0
        if self.disk is not None:
            cache, cached = self._from_disk(tokens, cache, cached)
        if cache is None:
            self.stats.misses += 1
            return None, 0
        self.stats.hits += 1
        self.stats.tokens_saved += cached
        return cache, cached

    def _from_disk(self, tokens: list[int], cache, cached: int):
        """The disk tier's entry instead, when it covers more of the prompt than memory does."""
        best = self.disk.longest_prefix(tokens)
        if best is None or min(best[1], len(tokens) - 1) <= cached:
            return cache, cached
        loaded = self.disk.load(best[0])
        if loaded is None:
            return cache, cached
        stored, disk_cache = loaded
        usable = min(best[1], len(tokens) - 1)
        if len(stored) > usable:
            if not can_trim_prompt_cache(disk_cache):
                return cache, cached
            trim_prompt_cache(disk_cache, len(stored) - usable)
        return disk_cache, usable

    def store(self, tokens: list[int], cache: list[Any]) -> None:
        if tokens and cache:
            if self.disk is not None:
                key = tuple(tokens)
                self._unsaved.pop(key, None)
                self._unsaved[key] = True
            self._lru.insert_cache(KEY, list(tokens), cache)

    def set_cap(self, cap_bytes: int) -> int:
        """Move the cap (memory pressure walks it); entries over it go, least recently used first.
        Returns the bytes freed."""
        self._lru.max_bytes = max(0, int(cap_bytes))
        return self.trim(self._lru.max_bytes)

    def trim(self, to_bytes: int) -> int:
        """Drop least recently used entries until at most `to_bytes` are held; the bytes freed."""
        before = self.nbytes
        self._spill_now = True
        try:
            self._lru.trim_to(n_bytes=max(0, int(to_bytes)))
        finally:
            self._spill_now = False
        return before - self.nbytes

    def clear(self) -> int:
        """Drop every entry (to the disk tier, when there is one): the model is being unloaded."""
        before = self.nbytes
        self._spill_now = True
        try:
            self._lru.trim_to(n_sequences=0)
        finally:
            self._spill_now = False
        return before


def make_prompt_cache_store(model_id: str, model_path: Path, options: PromptCacheOptions) -> PromptCache | None:
    """The store an engine's options ask for (None when off), with its disk tier when there is one."""
    if options.max_bytes <= 0 or options.max_entries <= 0:
        return None
    disk = None
    if options.folder is not None and options.disk_bytes > 0:
        try:
            disk = DiskCache(Path(options.folder), max_bytes=options.disk_bytes,
                             fingerprint=model_fingerprint(model_path))
        except OSError as e:   # a read-only or full data folder: memory only
            log.warning("no disk tier for %s's prompt cache: %s", model_id, e)
    return PromptCache(max_bytes=options.max_bytes, max_entries=options.max_entries, disk=disk)
