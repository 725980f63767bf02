"""The prompt cache's disk tier (oMLX's SSD cache): entries pushed out of memory are written with
mlx-lm's save_prompt_cache under $OMLX_HOME/prompt-cache/<model>/, least recently used files go when
the folder passes its byte cap, and a later request (after an unload, a reload, a restart) reads its
prefix back instead of prefilling it again.

Every file carries its tokens and the model's fingerprint (config and weight files' names, sizes
and times) in its safetensors metadata: a changed model folder invalidates its entries. Files are
written to a temporary name and renamed, so a kill during a spill never leaves a half file under a
served name; a file that does not load (truncated, corrupt) is deleted and counted as a miss."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache

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
        for orphan in self.folder.glob(f"*{PARTIAL}"):
            orphan.unlink(missing_ok=True)   # a spill that a kill cut short

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
            os.utime(self.folder / name)     # already there: now the most recently used
            return
        partial = self.folder / (stem + PARTIAL)
        try:
            save_prompt_cache(str(partial), cache, metadata={"tokens": json.dumps(tokens),
                                                             "fingerprint": self.fingerprint})
            os.replace(partial, self.folder / name)
        except (OSError, RuntimeError) as e:   # a full or read-only disk: the entry is only lost
            log.warning("could not spill a prompt cache entry to %s: %s", self.folder, e)
            partial.unlink(missing_ok=True)
            return
        self._index[name] = list(tokens)
        self._sizes[name] = self._size(name)
        self.stats.writes += 1
        self._evict_over_cap()
        self._write_index()

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
        os.utime(path)
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
        (self.folder / name).unlink(missing_ok=True)
        if write:
            self._write_index()

    def _write_index(self) -> None:
        tmp = self.folder / "index.json.tmp"
        try:
            tmp.write_text(json.dumps({"fingerprint": self.fingerprint, "entries": self._index}))
            os.replace(tmp, self.folder / "index.json")
        except OSError as e:
            log.warning("could not write the prompt cache index in %s: %s", self.folder, e)

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
