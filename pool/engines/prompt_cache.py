"""One model's prefix (prompt) cache, on its engine thread: mlx-lm's LRUPromptCache, bounded by a
cap that memory pressure moves, with the counters the snapshot shows.

A request takes the longest cached prefix of its tokens (an exact entry, a shorter one, or a longer
one trimmed: LRUPromptCache's own search) as a private deep copy, so concurrent requests never
share mutable KV. A finished request stores its prompt + completion KV, so the next turn of the
same chat starts from it. An entry that cannot be trimmed (a recurrent state, a wrapped sliding
window) serves only prompts that extend it: such a model's requests also store checkpoints, their
KV at the chat's boundaries (checkpoints.py), which are entries like any other here.

With a disk tier, an entry is written only when it leaves memory: pushed out by newer entries,
dropped by memory pressure, or cleared at an unload. A finished turn's entry, which the next turn
is about to reuse, stays in memory and is never written while it is there. The write happens on the
process's writer thread (spill.py): the engine thread only takes byte views of the entry's arrays,
so a spill never delays a request, and a request that needs an entry still being written takes it
from memory (`_pending`). On a discrete GPU a byte view is not free: MLX copies the array to host
memory there and then, blocking the engine thread (hundreds of MB for a long chat's entry). So
there (`defer_spills`) an entry pushed out by a newer one waits in `_pending`, unprepared, until the
engine has no request (`prepare_next_spill`, an idle job); a shrink or a clear prepares them all at
once, since memory is wanted back then. At most the cache's cap in bytes waits to be written; an
entry beyond that is dropped and counted (`spills_dropped`). An unload waits for its spills (the
memory it measures as released must be free), and a pressure shrink waits for them off the engine
thread.

Entries have a scope (a request's API key's name, or None: shared; pool/keys): a request reuses only
its own scope's prefixes, in memory, while written and on disk (whose files record their scope), so
no client learns from a hit (`cached_tokens`, a shorter time to the first token) what another sent."""

from __future__ import annotations

import copy
import functools
import itertools
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import mlx.core as mx
from mlx_lm.models.cache import (
    ArraysCache,
    CacheList,
    KVCache,
    LRUPromptCache,
    PromptTrie,
    RotatingKVCache,
    can_trim_prompt_cache,
    trim_prompt_cache,
)

from ..backend import discrete_gpu
from .disk_cache import DiskCache, common_prefix, model_fingerprint
from .disk_tier import tier_at
from .protocol import PromptCacheOptions
from .spill import WRITER, Spill, Writer

log = logging.getLogger(__name__)

KEY = "model"   # LRUPromptCache keys entries by model too; one store serves one model, and it keys scopes
COPY_GAIN = 64  # prompt tokens a written entry or a file must add to memory's best hit to be copied or read


def worth_copying(gain: int, usable: int) -> bool:
    """Whether an entry being written, or a file, which covers `usable` tokens of a prompt, `gain` more
    than memory's best hit, is worth its copy: it holds the whole of its entry (a file is read whole),
    while those few tokens cost the model almost nothing to read again. Measured on 32 chats sharing
    only a system prompt: each read a file for a token or two, 11% of the engine thread."""
    return gain >= min(COPY_GAIN, usable // 4)


def _key(scope: str | None) -> Any:
    return KEY if scope is None else (KEY, scope)


def _scope(key: Any) -> str | None:
    return None if key == KEY else key[1]


@dataclass
class PromptCacheStats:
    hits: int = 0
    misses: int = 0
    tokens_saved: int = 0
    spills_dropped: int = 0     # left memory while the writer was a cap's worth behind: not written


class _EvictionTrie(PromptTrie):
    """PromptTrie whose `pop` (LRUPromptCache's only way to drop an entry for space) tells us what
    went, so it can be written to disk instead of lost."""

    def __init__(self, on_evict: Callable[[str | None, list[int], list[Any]], None]):
        super().__init__()
        self.on_evict = on_evict

    def pop(self, model, tokens):
        entry = super().pop(model, tokens)
        self.on_evict(_scope(model), list(tokens), entry.prompt_cache)
        return entry


@dataclass
class _Pending:
    """An entry that left memory and waits for (or is in) its write."""
    tokens: list[int]
    cache: list[Any]
    nbytes: int
    scope: str | None
    prepared: bool = False     # its byte views are taken and its write is queued


class PromptCache:
    def __init__(self, *, max_bytes: int, max_entries: int, disk: DiskCache | None = None,
                 on_evict: Callable[[list[int], list[Any]], None] | None = None, writer: Writer = WRITER,
                 trimmable: bool = True, defer_spills: bool = False):
        self.configured_bytes = max_bytes
        self.trimmable = trimmable     # the model's entries can be cut back; else only whole ones serve from disk
        self.max_entries = max_entries
        self.disk = disk
        self._writer = writer
        self._lru = LRUPromptCache(max_size=max_entries, max_bytes=max_bytes)
        self._pending: dict[int, _Pending] = {}    # being written by the writer thread, by spill number
        self._pending_bytes = 0
        self._spills = itertools.count()
        self.defer_spills = defer_spills   # taking byte views copies off the device: only while idle
        self._storing = False              # inside `store`: an eviction now is a newer entry's push
        self._written = threading.Condition()      # the writer settles `_pending` under it
        # the trie is LRUPromptCache's; replacing it is the one hook it offers for its evictions
        self._lru._trie = _EvictionTrie((lambda scope, tokens, cache: on_evict(tokens, cache)) if on_evict
                                        else self._evicted)
        self.stats = PromptCacheStats()
        self.on_written: Callable[[], None] | None = None   # called on the writer thread after each spill

    def _evicted(self, scope: str | None, tokens: list[int], cache: list[Any]) -> None:
        """On the engine thread: an entry left memory; hand it to the writer unless it is on disk."""
        if self.disk is None or self.disk.holds(tokens, scope):
            return
        nbytes = sum(c.nbytes for c in cache)
        number = next(self._spills)
        with self._written:
            if self._pending and self._pending_bytes + nbytes > self.configured_bytes:
                self.stats.spills_dropped += 1
                return
            self._pending[number] = _Pending(list(tokens), cache, nbytes, scope)
            self._pending_bytes += nbytes
        if not (self.defer_spills and self._storing):
            self._prepare(number)

    def prepare_next_spill(self) -> bool:
        """On the engine thread, while it is idle: take the byte views of the oldest entry waiting
        for them and queue its write; False when none waits."""
        with self._written:
            number = next((n for n, p in self._pending.items() if not p.prepared), None)
        if number is None:
            return False
        self._prepare(number)
        return True

    def _prepare_all(self) -> None:
        while self.prepare_next_spill():
            pass

    def _prepare(self, number: int) -> None:
        pending = self._pending[number]
        try:
            assert self.disk is not None
            spill = self.disk.prepare(pending.tokens, pending.cache, pending.scope)
        except Exception:    # an entry that cannot be saved is only not on disk
            log.exception("a prompt cache entry could not be prepared for the disk tier")
            self.stats.spills_dropped += 1
            self._settle(number)
            return
        pending.prepared = True
        self._writer.submit(functools.partial(self._write, number, spill, self.disk))

    def _write(self, number: int, spill: Spill, disk: DiskCache) -> None:
        """On the writer thread."""
        try:
            disk.write(spill)
        finally:
            spill.parts.clear()          # its views of the arrays: the memory is free once written
            self._settle(number)
            if self.on_written is not None:
                self.on_written()

    def _settle(self, number: int) -> None:
        with self._written:
            self._pending_bytes -= self._pending.pop(number).nbytes
            self._written.notify_all()

    def wait_for_spills(self, timeout: float | None = None) -> bool:
        """Block until every entry handed to the writer is written (or refused); False on a timeout.
        Any thread; those still waiting for an idle moment are not waited for (`clear` prepares them)."""
        with self._written:
            return self._written.wait_for(lambda: not any(p.prepared for p in self._pending.values()), timeout)

    @property
    def waiting_for_idle(self) -> bool:
        """Entries that left memory wait for the engine to be idle to be prepared."""
        with self._written:
            return any(not p.prepared for p in self._pending.values())

    @property
    def spilling(self) -> int:
        """Entries waiting for (or in) their write."""
        with self._written:
            return len(self._pending)

    @property
    def nbytes(self) -> int:
        """Bytes held: the entries in memory and those still being written."""
        return self._lru.nbytes + self._pending_bytes

    @property
    def entries(self) -> int:
        return len(self._lru)

    @property
    def cap_bytes(self) -> int:
        return self._lru.max_bytes

    def fetch(self, tokens: list[int], *, scope: str | None = None) -> tuple[list[Any] | None, int]:
        """(a private copy of the longest cached prefix of `scope`'s entries, how many tokens it
        covers). At least one token is always left to compute: the model must see one to give the
        next logits."""
        cache, rest = self._lru.fetch_nearest_cache(_key(scope), tokens)
        if cache is not None and not rest:
            if can_trim_prompt_cache(cache):
                trim_prompt_cache(cache, 1)
            else:    # a state cannot give a token back: the checkpoint one token short, or a shorter prefix
                cache, rest = self._lru.fetch_nearest_cache(_key(scope), tokens[:-1])
            rest = rest + tokens[-1:] if cache is not None else tokens
        cached = len(tokens) - len(rest) if cache is not None else 0
        if self._pending:
            cache, cached = self._from_pending(tokens, cache, cached, scope)
        if self.disk is not None:
            cache, cached = self._from_disk(tokens, cache, cached, scope)
        if cache is None:
            self.stats.misses += 1
            return None, 0
        self.stats.hits += 1
        self.stats.tokens_saved += cached
        return cache, cached

    def _from_pending(self, tokens: list[int], cache, cached: int, scope: str | None):
        """An entry still being written, when it covers more of the prompt: a copy, from memory."""
        with self._written:
            candidates = [p for p in self._pending.values() if p.scope == scope and (
                self.trimmable or common_prefix(p.tokens, tokens) == len(p.tokens) < len(tokens))]
        best = max(((p, min(common_prefix(p.tokens, tokens), len(tokens) - 1)) for p in candidates),
                   key=lambda item: item[1], default=None)
        if best is None or best[1] <= cached or not worth_copying(best[1] - cached, best[1]):
            return cache, cached
        pending, usable = best
        if len(pending.tokens) > usable and not can_trim_prompt_cache(pending.cache):
            return cache, cached
        copied = copy.deepcopy(pending.cache)
        if len(pending.tokens) > usable:
            trim_prompt_cache(copied, len(pending.tokens) - usable)
        return copied, usable

    def _from_disk(self, tokens: list[int], cache, cached: int, scope: str | None):
        """The disk tier's entry instead, when it covers more of the prompt than memory does."""
        best = self.disk.longest_prefix(tokens, scope, whole=not self.trimmable)
        usable = min(best[1], len(tokens) - 1) if best is not None else 0
        if best is None or usable <= cached or not worth_copying(usable - cached, usable):
            return cache, cached
        loaded = self.disk.load(best[0], scope)
        if loaded is None:
            return cache, cached
        stored, disk_cache = loaded
        if len(stored) > usable:
            if not can_trim_prompt_cache(disk_cache):
                return cache, cached
            trim_prompt_cache(disk_cache, len(stored) - usable)
        return disk_cache, usable

    def store(self, tokens: list[int], cache: list[Any], *, scope: str | None = None) -> None:
        if tokens and cache:
            for c in cache:
                _own_arrays(c)
            # a batch's extract is a lazy copy: unevaluated, the entry holds the whole batch's KV it came
            # from until it is used or evicted (measured: 100-300 MB after rounds of 32 streams)
            mx.async_eval([c.state for c in cache])
            self._storing = True
            try:
                self._lru.insert_cache(_key(scope), list(tokens), cache)
            finally:
                self._storing = False

    def set_cap(self, cap_bytes: int) -> int:
        """Move the cap (memory pressure walks it); entries over it go, least recently used first.
        Returns the bytes freed (those being written are free once written: `wait_for_spills`)."""
        self._lru.max_bytes = max(0, int(cap_bytes))
        return self.trim(self._lru.max_bytes)

    def trim(self, to_bytes: int) -> int:
        """Drop least recently used entries until at most `to_bytes` are held; the bytes freed."""
        before = self._lru.nbytes
        self._lru.trim_to(n_bytes=max(0, int(to_bytes)))
        self._prepare_all()       # memory is wanted back: no entry waits for an idle moment now
        return before - self._lru.nbytes

    def clear(self) -> int:
        """Drop every entry (to the disk tier, when there is one, waiting for the writes): the model
        is being unloaded, and the memory it frees must be free when this returns."""
        before = self._lru.nbytes
        self.on_written = None
        self._lru.trim_to(n_sequences=0)
        self._prepare_all()
        self.wait_for_spills()
        if self.disk is not None:
            self.disk.close()
        return before


def _own_arrays(c: Any) -> None:
    """mlx-lm's BatchGenerator extracts a sequence's state (ArraysCache) and sliding window
    (RotatingKVCache) as slices of the batch's arrays, which keep the whole batch's buffer alive (a
    deep copy shares it too); a contiguous copy holds only its own rows, the bytes the entry counts.
    A KVCache's buffer grows 256 tokens at a time, so a short chat's entry would hold (and count)
    mostly padding: one with more than a quarter unused keeps only its used rows (mlx-lm's
    update_and_fetch grows such a buffer again when a request extends it)."""
    if isinstance(c, CacheList):
        for inner in c.caches:
            _own_arrays(inner)
    elif isinstance(c, ArraysCache):
        c.cache = [None if a is None else mx.contiguous(a) for a in c.cache]
    elif isinstance(c, RotatingKVCache) and c.keys is not None:
        c.keys, c.values = mx.contiguous(c.keys), mx.contiguous(c.values)
    elif type(c) is KVCache and c.keys is not None and c.keys.ndim == 4 \
            and 4 * (c.keys.shape[2] - c.offset) > c.keys.shape[2]:
        c.keys, c.values = (mx.contiguous(a[..., :c.offset, :]) for a in (c.keys, c.values))


def make_prompt_cache_store(model_id: str, model_path: Path, options: PromptCacheOptions,
                            on_written: Callable[[], None] | None = None, *,
                            trimmable: bool = True) -> PromptCache | None:
    """The store an engine's options ask for (None when off), with its disk tier when there is one;
    `on_written` is called on the writer thread after each spill (the engine re-reads its counters)."""
    if options.max_bytes <= 0 or options.max_entries <= 0:
        return None
    disk = None
    if options.folder is not None and options.disk_bytes > 0:
        folder = Path(options.folder)
        try:
            tier = tier_at(folder.parent, options.disk_total_bytes)
            disk = DiskCache(folder, max_bytes=options.disk_bytes, fingerprint=model_fingerprint(model_path),
                             tier=tier)
        except OSError as e:   # a read-only or full data folder: memory only
            log.warning("no disk tier for %s's prompt cache: %s", model_id, e)
    store = PromptCache(max_bytes=options.max_bytes, max_entries=options.max_entries, disk=disk, trimmable=trimmable,
                        defer_spills=discrete_gpu())
    store.on_written = on_written
    return store
