# Before anything imports MLX: an optimized BLAS for its CPU backend (tests and benchmarks get it too).
from .blas import preload as _preload_blas

_preload_blas()
