"""Quantized models served as float32 on the CPU backend, when the pool has decided so
(pool.policy.dequantize decides; the engine is told through LoadOptions.dequantize).

Runs right after mlx-lm's lazy `load_model`: the quantized layers become plain ones whose weights are
lazy `mx.dequantize(...).astype(float32)` graphs, so the loader's one-tensor-at-a-time evaluation
reads each quantized tensor and keeps only its dense result (no second copy of the model).
"""

from __future__ import annotations

import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm.utils import dequantize_model


def _float32(array: mx.array) -> mx.array:
    # x86 has no fast float16/bfloat16 path in MLX (5-8 GFLOPS, never BLAS): everything float32
    return array.astype(mx.float32) if mx.issubdtype(array.dtype, mx.floating) and array.dtype != mx.float32 else array


def dequantize_for_cpu(model, config: dict):
    """(model, config), dequantized to float32 (lazily: nothing is computed here)."""
    # mlx-lm's dequantize_model keeps the scales' dtype (float16 in most published 4-bit models)
    dequantize_model(model)
    model.update(tree_map(_float32, model.parameters()))
    return model, {**config, "torch_dtype": "float32", "dequantized": True}
