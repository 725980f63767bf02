import os as _os

# Before anything imports MLX: an optimized BLAS for its CPU backend (tests and benchmarks get it too).
from .blas import preload as _preload_blas

_preload_blas()
# mlx-lm imports transformers for its tokenizers, which warns on every start that PyTorch (which
# the server never uses) is missing
_os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
