"""What a process serving models sets up before anything imports MLX: `setup_process()`, called
explicitly and first by every entry point (manage.py, omlx_site/asgi.py, tests/conftest.py, the
benchmarks). Importing `pool` does none of it. Standard library and ctypes only (the BLAS choice
reads OMLX_BLAS through pool.conf and glibc comes from pool.libc, which are too); cheap, and a
second call does nothing."""

from __future__ import annotations

import os

from pool.libc import glibc

from . import blas

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8

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
    _keep_kernels()


def _keep_kernels() -> None:
    """MLX's CUDA kernels, compiled at first use (NVRTC's PTX, then the driver's machine code), are
    kept in $OMLX_HOME/kernels rather than /tmp and the driver's small default cache, so a restart
    does not compile them again (measured: a 4-bit model's first 8 streams took 56 s on an H200).
    Read by MLX and the driver when they start: before MLX is imported. Nothing on other backends."""
    from pool.conf import ImproperlyConfigured, read_setting

    try:
        kernels = read_setting("OMLX_HOME") / "kernels"
    except ImproperlyConfigured:
        return
    os.environ.setdefault("MLX_PTX_CACHE_DIR", str(kernels / "ptx"))
    os.environ.setdefault("CUDA_CACHE_PATH", str(kernels / "cuda"))
    os.environ.setdefault("CUDA_CACHE_MAXSIZE", str(2**31))


def _tune_malloc() -> None:
    """glibc's malloc settings for engine threads (a no-op elsewhere)."""
    libc = glibc()
    if libc is None or not hasattr(libc, "mallopt"):
        return
    # glibc gives each thread an arena and raises its mmap threshold after the first large free, so
    # freed weight buffers stay in arenas malloc_trim cannot hand back (30 loads of a 60 MB model:
    # 985 MB resident; with a fixed 1 MiB threshold, 88 MB). Two arenas keep the event loop and the
    # engine threads off one lock (one arena cost ~8% of decode speed) and bound the creep.
    libc.mallopt(M_MMAP_THRESHOLD, 2**20)
    # A set mmap threshold also pins the trim threshold at 128 KiB: each decode step's freed buffers
    # went back to the system and faulted in again. Twice the mmap threshold, as glibc pairs them.
    libc.mallopt(M_TRIM_THRESHOLD, 2 * 2**20)
    libc.mallopt(M_ARENA_MAX, 2)
