"""What a process serving models sets up before anything imports MLX: `setup_process()`, called
explicitly and first by every entry point (manage.py, omlx_site/asgi.py, tests/conftest.py, the
benchmarks). Importing `pool` does none of it. Standard library and ctypes only (the BLAS choice
reads OMLX_BLAS through pool.conf, which is too); cheap, and a second call does nothing."""

from __future__ import annotations

import ctypes
import os
import sys

from . import blas

M_MMAP_THRESHOLD, M_ARENA_MAX = -3, -8

_done = False


def setup_process() -> None:
    global _done
    if _done:
        return
    _done = True
    # mlx-lm imports transformers for its tokenizers, which warns on every start that PyTorch (which
    # the server never uses) is missing
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    blas.preload()
    _tune_malloc()


def _tune_malloc() -> None:
    """glibc's malloc settings for engine threads (a no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return   # not glibc
    if not hasattr(libc, "mallopt"):
        return
    # Engines run on their own threads, and glibc gives each thread an arena of its own; its dynamic mmap
    # threshold also climbs after the first large free, so later weight buffers land in arenas that
    # malloc_trim cannot hand back. Measured: loading and unloading a 60 MB model 30 times on fresh
    # threads grew RSS to 985 MB; with a fixed 1 MiB threshold (big buffers in their own mappings,
    # returned on free) 88 MB. Through the server, 40 rotations of three models still crept from 325
    # to 416 MB with per-thread arenas, and stayed flat at 351-357 MB with one arena. One arena cost
    # about 8% of decode speed, though: the event loop and the engine threads took turns on its lock.
    # Two keep them apart (the loop in the main arena, engines in the other) and bound the creep.
    libc.mallopt(M_MMAP_THRESHOLD, 2**20)
    libc.mallopt(M_ARENA_MAX, 2)
