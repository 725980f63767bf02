"""Process-level MLX housekeeping shared by every engine thread."""

import ctypes
import ctypes.util
import gc
import sys
import threading

import mlx.core as mx


def _glibc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


_LIBC = _glibc()


# MLX's active memory is one counter for the whole process. An unload measures what it freed as the
# counter's fall across its release, so a load filling its weights meanwhile must not move it: both
# take this lock (a load per group of weights, an unload for its measured release).
ACCOUNTING = threading.Lock()


def trim_native_heap() -> None:
    """Hand freed heap pages back to the OS. On Linux the CPU backend frees into glibc's heap,
    so resident memory only falls after malloc_trim (measured: 185 MB -> 142 MB)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def release_memory() -> None:
    """What every unload and every reclaim does, on the thread that owns the arrays."""
    gc.collect()
    mx.clear_cache()
    trim_native_heap()


def reclaim_cache() -> None:
    """The cheap reclaim: MLX's buffer cache (process-wide) and glibc's free pages; no gc pass."""
    mx.clear_cache()
    trim_native_heap()
