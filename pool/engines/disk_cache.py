"""The prompt cache's disk tier (oMLX's SSD cache): entries pushed out of memory are written with
mlx-lm's save_prompt_cache under $OMLX_HOME/prompt-cache/<model>/, least recently used files go when
the folder passes its byte cap, and a later request (after an unload, a reload, a restart) reads its
prefix back instead of prefilling it again.

Every file carries its tokens and the model's fingerprint (config and weight files' names, sizes
and times) in its safetensors metadata: a changed model folder invalidates its entries. Files are
written to a temporary name and renamed, so a kill during a spill never leaves a half file under a
served name; a file that does not load (truncated, corrupt) is deleted and counted as a miss. At
start, partial files and files the index does not name (a kill between the rename and the index
write) are deleted.

A spill the disk refuses (full, read-only) loses only that entry's disk copy (it stays in memory
until pushed out): the fault and the recovery are reported once for all models (pool/storage.py: a
log line, an event, the storage_* gauges), counted in `stats.spill_failures`, never raised."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache

from .. import storage

log = logging.getLogger(__name__)

SUFFIX = ".safetensors"
PARTIAL = ".partial" + SUFFIX    # a file being written; renamed to its served name when complete


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


def _common_prefix(a: list[int], b: list[int]) -> int:
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


@dataclass
class DiskCache:
    folder: Path
    max_bytes: int
    fingerprint: str
    stats: DiskStats = field(default_factory=DiskStats)
    _index: dict[str, list[int]] = field(default_factory=dict)   # file name -> its tokens
    _sizes: dict[str, int] = field(default_factory=dict)         # file name -> its bytes (read per step)

    def __post_init__(self):
        self.folder.mkdir(parents=True, exist_ok=True)
        index_path = self.folder / "index.json"
        try:
            index = json.loads(index_path.read_text())
        except (OSError, ValueError):
            index = {}
        if index.get("fingerprint") != self.fingerprint:
            index = {"entries": {}}     # another model's files, or none yet: start over
            for stale in self.folder.glob(f"*{SUFFIX}"):
                stale.unlink(missing_ok=True)
        self._index = {name: tokens for name, tokens in index.get("entries", {}).items()
                       if (self.folder / name).exists()}
        self._sizes = {name: self._size(name) for name in self._index}
        for orphan in self.folder.glob(f"*{SUFFIX}"):
            if orphan.name not in self._index:   # a spill a kill cut short, or one never indexed
                orphan.unlink(missing_ok=True)

    @property
    def nbytes(self) -> int:
        return sum(self._sizes.values())

    @property
    def entries(self) -> int:
        return len(self._index)

    def put(self, tokens: list[int], cache: list[Any]) -> None:
        stem = hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:24]
        name = stem + SUFFIX
        if name in self._index:
            _touch(self.folder / name)       # already there: now the most recently used
            return
        partial = self.folder / (stem + PARTIAL)
        try:
            save_prompt_cache(str(partial), cache, metadata={"tokens": json.dumps(tokens),
                                                             "fingerprint": self.fingerprint})
            os.replace(partial, self.folder / name)
        except (OSError, RuntimeError) as e:   # a full or read-only disk: the entry's copy is only lost
            fault = storage.fault_of(e, self.folder)    # before the half file goes and frees its space
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)
            self._refused(e, fault)
            return
        self._index[name] = list(tokens)
        self._sizes[name] = self._size(name)
        self.stats.writes += 1
        self._evict_over_cap()
        if self._write_index():
            storage.health.succeeded(storage.Component.PROMPT_CACHE)

    def _refused(self, error: BaseException, fault: storage.Fault | None = None) -> None:
        self.stats.spill_failures += 1
        storage.health.failed(storage.Component.PROMPT_CACHE, fault or storage.fault_of(error, self.folder),
                              f"a spill for {self.folder.name}: {error}")

    def longest_prefix(self, tokens: list[int]) -> tuple[str, int] | None:
        """(file, tokens it shares with `tokens`) of the entry sharing the most, or None."""
        best = max(((name, _common_prefix(stored, tokens)) for name, stored in self._index.items()),
                   key=lambda item: item[1], default=None)
        return best if best and best[1] > 0 else None

    def load(self, name: str) -> tuple[list[int], list[Any]] | None:
        """(tokens, cache) of one file; a file that does not load or belongs elsewhere is deleted."""
        path = self.folder / name
        try:
            cache, metadata = load_prompt_cache(str(path), return_metadata=True)
            if metadata.get("fingerprint") != self.fingerprint:
                raise ValueError("written for other weights")
            tokens = json.loads(metadata["tokens"])
        except Exception as e:  # noqa: BLE001 - any unreadable file is a miss, never a client error
            log.warning("dropping prompt cache file %s: %s", path, e)
            self.stats.errors += 1
            self._forget(name)
            return None
        _touch(path)
        self.stats.hits += 1
        return tokens, cache

    def _evict_over_cap(self) -> None:
        by_age = sorted(self._index, key=lambda name: self._mtime(name))
        total = self.nbytes
        while by_age and total > self.max_bytes:
            name = by_age.pop(0)
            total -= self._sizes.get(name, 0)
            self._forget(name, write=False)

    def _forget(self, name: str, *, write: bool = True) -> None:
        self._index.pop(name, None)
        self._sizes.pop(name, None)
        with contextlib.suppress(OSError):   # a read-only folder: forgotten all the same
            (self.folder / name).unlink(missing_ok=True)
        if write:
            self._write_index()

    def _write_index(self) -> bool:
        tmp = self.folder / "index.json.tmp"
        try:
            tmp.write_text(json.dumps({"fingerprint": self.fingerprint, "entries": self._index}))
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
