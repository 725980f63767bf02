"""Quantized models served as float32 on the CPU backend, when pool.policy.dequantize says so.

Runs right after mlx-lm's lazy `load_model`: the quantized layers become plain ones whose weights are
lazy `mx.dequantize(...).astype(float32)` graphs, so the loader's one-tensor-at-a-time evaluation
reads each quantized tensor and keeps only its dense result (no second copy of the model).
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm.utils import dequantize_model

from ..backend import cpu_backend
from ..conf import get_settings
from ..discovery import dense_size
from ..memory import make_probe
from ..policy.dequantize import dequantize_budget, should_dequantize


def wanted(path: Path) -> bool:
    """The pool's own decision (EnginePool._load_size), made again where the weights are loaded."""
    settings = get_settings()
    mode = settings.cpu_dequantize
    cpu = cpu_backend() and not mx.metal.is_available() and not mx.cuda.is_available()
    if mode == "off" or not cpu:
        return False
    dense = dense_size(path)
    if dense is None:
        return False
    limit = settings.max_model_memory
    capacity = 0 if isinstance(limit, int) else make_probe(settings).read().capacity
    return should_dequantize(mode, cpu_backend=True, dense_bytes=dense, budget=dequantize_budget(limit, capacity))


def _float32(array: mx.array) -> mx.array:
    # x86 has no fast float16/bfloat16 path in MLX (5-8 GFLOPS, never BLAS): everything float32
    return array.astype(mx.float32) if mx.issubdtype(array.dtype, mx.floating) and array.dtype != mx.float32 else array


def dequantize_for_cpu(model, config: dict, path: Path):
    """(model, config), dequantized to float32 when wanted (lazily: nothing is computed here)."""
    if not wanted(path):
        return model, config
    # mlx-lm's dequantize_model keeps the scales' dtype (float16 in most published 4-bit models)
    dequantize_model(model)
    model.update(tree_map(_float32, model.parameters()))
    return model, {**config, "torch_dtype": "float32", "dequantized": True}
