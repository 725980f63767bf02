"""Which MLX backend this process runs on: `cpu_backend` finds it without importing MLX (settings
read it before MLX may load); `discrete_gpu` asks MLX."""

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


def discrete_gpu() -> bool:
    """True where MLX's default device is a GPU with memory of its own (MLX's CUDA backend): arrays
    live on the device, and reading their bytes from the host copies them there."""
    import mlx.core as mx
    return not mx.metal.is_available() and mx.default_device().type == mx.gpu
