"""Which MLX backend this process will get, found without importing MLX."""

from __future__ import annotations

import sys
from importlib import metadata

CUDA_DISTRIBUTIONS = ("mlx-cuda-12", "mlx-cuda-13")


def cpu_backend() -> bool:
    """True where MLX will run on its CPU backend: Linux without an MLX CUDA wheel (found from the
    installed distributions, so that MLX is not imported to ask)."""
    if not sys.platform.startswith("linux"):
        return False
    for name in CUDA_DISTRIBUTIONS:
        try:
            metadata.distribution(name)
            return False
        except metadata.PackageNotFoundError:
            continue
    return True
