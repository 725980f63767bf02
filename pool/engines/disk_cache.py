"""The prompt cache's disk tier (oMLX's SSD cache): entries pushed out of memory are written under
$OMLX_HOME/prompt-cache/<model's safe name>/ in mlx-lm's prompt cache format (spill.py writes them,
without the KV buffers' padding, off the engine thread), and a later request (after an unload, a
reload, a restart) reads its prefix back instead of prefilling it again.

Room is made before a write and only as much as the entry needs: the folder's least recently used
files go until it fits the model's cap, then any model's until it fits the tier's total
(disk_tier.py). An entry larger than either cap is not written (`stats.skipped`); it never empties
the tier.

Every file carries its tokens and the model's fingerprint (config and weight files' names, sizes
and times) in its safetensors metadata: a changed model folder invalidates its entries. An entry of
an API key's scope (prompt_cache.py) records the scope there too, and in the index, and is named by
it: after a restart a request still finds only its own scope's files. Files are
written to a temporary name and renamed, so a kill during a spill never leaves a half file under a
served name; a file that does not load (truncated, corrupt) is deleted and counted as a miss. At
start, partial files and files the index does not name (a kill between the rename and the index
write) are deleted; only files named as entries are ever deleted, whatever else the folder holds.

A spill the disk refuses (full, read-only) loses only that entry's disk copy: the fault and the
recovery are reported once for all models (pool/storage.py: a log line, an event, the storage_*
gauges), counted in `stats.spill_failures`, never raised."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlx_lm.models.cache import load_prompt_cache

from .. import storage
from .disk_tier import ENTRY, PARTIAL, DiskTier
from .spill import Spill, entry_stem, prepare

log = logging.getLogger(__name__)

SUFFIX = ".safetensors"
PARTIAL_SUFFIX = ".partial" + SUFFIX    # a file being written; renamed to its served name when complete


def model_fingerprint(folder: Path) -> str:
    """What a cache entry is tied to: the model's config and its weight files as they are now."""
    digest = hashlib.sha256((folder / "config.json").read_bytes() if (folder / "config.json").exists() else b"")
    for weights in sorted(folder.glob("*.safetensors")):
        stat = weights.stat()
        digest.update(f"{weights.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def _touch(path: Path) -> None:
    """Mark a file recently used; a read-only folder only loses the LRU order."""
    with contextlib.suppress(OSError):
        os.utime(path)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass
class DiskStats:
    hits: int = 0
    writes: int = 0
    errors: int = 0          # files that did not load: deleted, counted as misses
    spill_failures: int = 0  # entries the disk refused (full, read-only): reported in pool/storage.py
    skipped: int = 0         # entries larger than the model's cap or the tier's total: not written


@dataclass(eq=False)
class DiskCache:
    folder: Path
    max_bytes: int
    fingerprint: str
    tier: DiskTier | None = None      # the total across models; None: this folder's cap only
    stats: DiskStats = field(default_factory=DiskStats)
    _index: dict[str, list[int]] = field(default_factory=dict)   # file name -> its tokens
    _scopes: dict[str, str] = field(default_factory=dict)        # file name -> its scope, when not shared
    _sizes: dict[str, int] = field(default_factory=dict)         # file name -> its bytes

    def __post_init__(self):
        self.folder.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._open()
            if self.tier is not None:
                self.tier.attach(self.folder, self._forget_for_tier)

    @property
    def _lock(self):
        return self.tier.lock if self.tier is not None else _NO_TIER_LOCK

    def _open(self) -> None:
        index_path = self.folder / "index.json"
        try:
            index = json.loads(index_path.read_text())
        except (OSError, ValueError):
            index = {}
        if not isinstance(index, dict) or index.get("fingerprint") != self.fingerprint:
            index = {"entries": {}}     # files of other weights, or none yet: start over
        entries = index.get("entries")
        self._index = {name: tokens for name, tokens in (entries if isinstance(entries, dict) else {}).items()
                       if ENTRY.match(name) and (self.folder / name).exists()}
        self._sizes = {name: self._size(name) for name in self._index}
        scopes = index.get("scopes")
        self._scopes = {name: scope for name, scope in (scopes if isinstance(scopes, dict) else {}).items()
                        if name in self._index and isinstance(scope, str)}
        for orphan in self.folder.iterdir():
            # a spill a kill cut short, one never indexed, or another fingerprint's: only our own names
            if (PARTIAL.match(orphan.name) or ENTRY.match(orphan.name)) and orphan.name not in self._index:
                with contextlib.suppress(OSError):
                    orphan.unlink(missing_ok=True)

    def close(self) -> None:
        """The model unloads: the tier deletes this folder's files without telling it any more."""
        if self.tier is not None:
            self.tier.detach(self.folder, self._forget_for_tier)

    @property
    def nbytes(self) -> int:
        with self._lock:        # the writer thread adds files meanwhile
            return sum(self._sizes.values())

    @property
    def entries(self) -> int:
        return len(self._index)

    def holds(self, tokens: list[int], scope: str | None = None) -> bool:
        return entry_stem(list(tokens), scope) + SUFFIX in self._index

    def put(self, tokens: list[int], cache: list[Any], scope: str | None = None) -> bool:
        """Write one entry now, on this thread (tests; the prompt cache spills through `prepare`)."""
        return self.write(self.prepare(tokens, cache, scope))

    def prepare(self, tokens: list[int], cache: list[Any], scope: str | None = None) -> Spill:
        """On the engine thread: the entry ready for `write` on any thread."""
        metadata = {"tokens": json.dumps(list(tokens)), "fingerprint": self.fingerprint}
        if scope is not None:
            metadata["scope"] = scope
        return prepare(list(tokens), cache, metadata, scope)

    def write(self, spill: Spill) -> bool:
        """Write a prepared entry, making only the room it needs; False when it was not written."""
        name = spill.stem + SUFFIX
        with self._lock:
            if name in self._index:
                _touch(self.folder / name)       # already there: now the most recently used
                return True
            if not self._make_room(spill.nbytes):
                self.stats.skipped += 1
                log.info("a %d-byte prompt cache entry of %s is larger than its disk caps: not written",
                         spill.nbytes, self.folder.name)
                return False
        partial = self.folder / (spill.stem + PARTIAL_SUFFIX)
        try:
            spill.write_to(partial)
            os.replace(partial, self.folder / name)
        except (OSError, RuntimeError) as e:   # a full or read-only disk: the entry's copy is only lost
            fault = storage.fault_of(e, self.folder)    # before the half file goes and frees its space
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)
            self._refused(e, fault)
            return False
        with self._lock:
            self._index[name] = list(spill.tokens)
            if spill.scope is not None:
                self._scopes[name] = spill.scope
            self._sizes[name] = self._size(name)
            if self.tier is not None:
                self.tier.added(self.folder / name)
            self.stats.writes += 1
            written = self._write_index()
        if written:
            storage.health.succeeded(storage.Component.PROMPT_CACHE)
        return True

    def _make_room(self, nbytes: int) -> bool:
        """Delete this folder's least recently used files until `nbytes` more fit its cap, then let
        the tier do the same across models; False, deleting nothing, when either cap is too small."""
        if nbytes > self.max_bytes or (self.tier is not None and nbytes > self.tier.total_bytes):
            return False
        by_age = sorted(self._index, key=lambda name: self._mtime(name))
        total = self.nbytes
        while by_age and total + nbytes > self.max_bytes:
            name = by_age.pop(0)
            total -= self._sizes.get(name, 0)
            self._forget(name, write=False)
        return self.tier is None or self.tier.make_room(nbytes)

    def _refused(self, error: BaseException, fault: storage.Fault | None = None) -> None:
        self.stats.spill_failures += 1
        storage.health.failed(storage.Component.PROMPT_CACHE, fault or storage.fault_of(error, self.folder),
                              f"a spill for {self.folder.name}: {error}")

    def longest_prefix(self, tokens: list[int], scope: str | None = None, *,
                       whole: bool = False) -> tuple[str, int] | None:
        """(file, tokens it shares with `tokens`) of `scope`'s entry sharing the most, or None. With
        `whole`, only entries that are a prefix of `tokens` and shorter (a cache that cannot be cut back)."""
        with self._lock:
            shared = ((name, len(stored), common_prefix(stored, tokens)) for name, stored in self._index.items()
                      if self._scopes.get(name) == scope)
            best = max(((name, common) for name, length, common in shared
                        if not whole or common == length < len(tokens)), key=lambda item: item[1], default=None)
        return best if best and best[1] > 0 else None

    def load(self, name: str, scope: str | None = None) -> tuple[list[int], list[Any]] | None:
        """(tokens, cache) of one file of `scope`; a file that does not load or belongs elsewhere is deleted."""
        path = self.folder / name
        try:
            cache, metadata = load_prompt_cache(str(path), return_metadata=True)
            if metadata.get("fingerprint") != self.fingerprint:
                raise ValueError("written for other weights")
            if metadata.get("scope") != scope:
                raise ValueError("written for another API key's scope")
            tokens = json.loads(metadata["tokens"])
        except Exception as e:  # noqa: BLE001 - any unreadable file is a miss, never a client error
            log.warning("dropping prompt cache file %s: %s", path, e)
            self.stats.errors += 1
            with self._lock:
                self._forget(name)
            return None
        _touch(path)
        if self.tier is not None:
            self.tier.used(path)
        self.stats.hits += 1
        return tokens, cache

    def _forget_for_tier(self, name: str) -> None:
        self._forget(name)

    def _forget(self, name: str, *, write: bool = True) -> None:
        self._index.pop(name, None)
        self._scopes.pop(name, None)
        self._sizes.pop(name, None)
        with contextlib.suppress(OSError):   # a read-only folder: forgotten all the same
            (self.folder / name).unlink(missing_ok=True)
        if self.tier is not None:
            self.tier.removed(self.folder / name)
        if write:
            self._write_index()

    def _write_index(self) -> bool:
        tmp = self.folder / "index.json.tmp"
        try:
            tmp.write_text(json.dumps({"fingerprint": self.fingerprint, "entries": self._index,
                                       "scopes": self._scopes}))
            os.replace(tmp, self.folder / "index.json")
        except OSError as e:    # the files stay; a restart that finds them unnamed deletes them
            fault = storage.fault_of(e, self.folder)
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            self._refused(e, fault)
            return False
        return True

    def _size(self, name: str) -> int:
        try:
            return (self.folder / name).stat().st_size
        except OSError:
            return 0

    def _mtime(self, name: str) -> float:
        try:
            return (self.folder / name).stat().st_mtime
        except OSError:
            return 0.0


_NO_TIER_LOCK = threading.RLock()
