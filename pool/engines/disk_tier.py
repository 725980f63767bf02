"""The prompt cache's disk tier across models: one total cap over every model's folder under
$OMLX_HOME/prompt-cache/, loaded or not. A model's DiskCache asks `make_room` before it writes, and
the least recently used files go first, whichever model they belong to (an open DiskCache is told,
a folder of a model not loaded just loses the file: its index names only files that exist).

`auto` is a tenth of what the disk under the folder could give the tier when the process first
opens it (its free space plus what the tier already holds). The tier is one per folder and process
(`tier_at`), shared by the engine threads and the writer thread under its lock; it imports no MLX,
so the snapshot can read its total."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import threading
from pathlib import Path
from typing import Callable

ENTRY = re.compile(r"^[0-9a-f]+\.safetensors$")               # an entry's file (disk_cache.py): a hash
PARTIAL = re.compile(r"^[0-9a-f]+\.partial\.safetensors$")     # one being written
AUTO_SHARE = 10          # auto: a tenth of the free disk


def free_disk(path: Path) -> int:
    """Free bytes on the disk that holds `path` (its nearest existing parent)."""
    for candidate in (path, *path.parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return 0


class DiskTier:
    def __init__(self, root: Path, total_bytes: int | None):
        self.root = root
        self.lock = threading.RLock()
        self._files: dict[Path, tuple[int, float]] = {}     # every entry file -> (bytes, last used)
        self._bytes = 0
        self._owners: dict[Path, Callable[[str], None]] = {}  # an open folder -> its DiskCache's forget
        self._scan()
        self.total_bytes = self._total(total_bytes)

    def _total(self, configured: int | None) -> int:
        return configured if configured is not None else (free_disk(self.root) + self._bytes) // AUTO_SHARE

    def configure(self, total_bytes: int | None) -> None:
        with self.lock:
            self.total_bytes = self._total(total_bytes)

    def _scan(self) -> None:
        with contextlib.suppress(OSError):
            for folder in self.root.iterdir():
                if folder.is_dir() and not folder.is_symlink():
                    with contextlib.suppress(OSError):
                        for file in folder.iterdir():
                            if ENTRY.match(file.name):
                                self._record(file)

    def _record(self, file: Path) -> None:
        try:
            stat = file.stat()
        except OSError:
            return
        self.removed(file)
        self._files[file] = (stat.st_size, stat.st_mtime)
        self._bytes += stat.st_size

    @property
    def nbytes(self) -> int:
        return self._bytes

    def attach(self, folder: Path, forget: Callable[[str], None]) -> None:
        """An open DiskCache: the files in `folder` go through `forget` (which calls `removed`)."""
        with self.lock:
            self._owners[folder] = forget
            for file in list(self._files):
                if file.parent == folder:
                    self.removed(file)
            with contextlib.suppress(OSError):
                for file in folder.iterdir():
                    if ENTRY.match(file.name):
                        self._record(file)

    def detach(self, folder: Path, forget: Callable[[str], None]) -> None:
        with self.lock:
            if self._owners.get(folder) == forget:
                del self._owners[folder]

    def added(self, file: Path) -> None:
        with self.lock:
            self._record(file)

    def used(self, file: Path) -> None:
        with self.lock:
            if file in self._files:
                self._files[file] = (self._files[file][0], os.path.getmtime(file) if file.exists() else 0.0)

    def removed(self, file: Path) -> None:
        with self.lock:
            size, _ = self._files.pop(file, (0, 0.0))
            self._bytes -= size

    def make_room(self, nbytes: int) -> bool:
        """Delete the least recently used files (any model's) until `nbytes` more fit under the total;
        False, deleting nothing, when `nbytes` alone is over it."""
        with self.lock:
            if nbytes > self.total_bytes:
                return False
            while self._files and self._bytes + nbytes > self.total_bytes:
                oldest = min(self._files, key=lambda f: self._files[f][1])
                owner = self._owners.get(oldest.parent)
                if owner is not None:
                    owner(oldest.name)
                if oldest in self._files:          # not loaded, or its owner had forgotten it
                    with contextlib.suppress(OSError):
                        oldest.unlink(missing_ok=True)
                    self.removed(oldest)
            return True


_TIERS: dict[Path, DiskTier] = {}
_TIERS_LOCK = threading.Lock()


def tier_at(root: Path, total_bytes: int | None) -> DiskTier:
    """The process's tier over `root` (made, and its folders measured, on first use); `total_bytes`
    None is `auto`."""
    root = Path(root)
    with _TIERS_LOCK:
        tier = _TIERS.get(root)
        if tier is None:
            tier = _TIERS[root] = DiskTier(root, total_bytes)
        elif total_bytes is not None and tier.total_bytes != total_bytes:
            tier.configure(total_bytes)
        return tier
