"""Reading a model folder on the engine thread: the tokenizer first, then the weights in groups of
tensors, and the KV shape the prefill guard needs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.generate import generation_stream
from mlx_lm.utils import load_model, load_tokenizer

from .dequantize import dequantize_for_cpu
from .native import ACCOUNTING


EVAL_GROUP_BYTES = 64 * 2**20


def load_weights(path: Path):
    """(model, tokenizer, config) with every weight evaluated."""
    model, tokenizer, config = open_model(path)
    fill_weights(model)
    return model, tokenizer, config


def open_model(path: Path):
    """(model, tokenizer, config) with the weights not yet read: no memory taken but the tokenizer's.
    The kernel is asked to read the weight files ahead meanwhile."""
    eos = json.loads((path / "config.json").read_text()).get("eos_token_id")
    # The tokenizer first, the weights last: the memory arrives at the very end of the load,
    # where the load's wake-up lets the enforcer see it at once.
    tokenizer = load_tokenizer(path, eos_token_ids=eos)
    _read_ahead(path)
    model, config = load_model(path, lazy=True)
    model, config = dequantize_for_cpu(model, config, path)   # float32 on the CPU backend, when it fits
    return model, tokenizer, config


def fill_weights(model) -> int:
    """Evaluate every weight; returns their bytes."""
    # In groups of about EVAL_GROUP_BYTES. An eval holds the GIL while it reads, so one eval of every
    # weight stalls the event loop and the other engines for the whole read (measured: 109 ms gaps
    # for a 1.2 GB model); one tensor at a time pays each eval's fixed cost per tensor (1.3x slower
    # loads on a GPU). Measured on a 640 MB file from the page cache (2 CPU cores): one tensor
    # (16 MB) at a time 705 ms, p99 stall of another thread 3 ms, worst 76 ms; 64 MB groups 325 ms,
    # 17 ms and 24 ms; one eval 397 ms, 36 ms and 42 ms.
    group, size, total = [], 0, 0
    for _, weight in tree_flatten(model.parameters()):
        group.append(weight)
        size += weight.nbytes
        if size >= EVAL_GROUP_BYTES:
            with ACCOUNTING:
                mx.eval(group)
            group, total, size = [], total + size, 0
    with ACCOUNTING:
        mx.eval(group)
    mx.synchronize(generation_stream)
    return total + size


def _read_ahead(path: Path) -> None:
    if not hasattr(os, "posix_fadvise"):
        return
    for file in path.glob("*.safetensors"):
        try:
            fd = os.open(file, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass
        finally:
            os.close(fd)


def model_info(model, config: dict) -> dict:
    args = getattr(model, "args", None)
    layers = getattr(args, "num_hidden_layers", None) or config.get("num_hidden_layers") or len(getattr(model, "layers", []))
    heads = getattr(args, "num_attention_heads", None) or config.get("num_attention_heads") or 1
    kv_heads = getattr(args, "num_key_value_heads", None) or config.get("num_key_value_heads") or heads
    hidden = getattr(args, "hidden_size", None) or config.get("hidden_size") or 0
    head_dim = getattr(args, "head_dim", None) or config.get("head_dim") or (hidden // heads if heads else 0)
    dtype = str(config.get("torch_dtype") or "float32")
    bytes_per_element = 4 if "32" in dtype else 2
    return {"layers": int(layers), "kv_heads": int(kv_heads), "head_dim": int(head_dim),
            "bytes_per_element": bytes_per_element,
            "context_length": config.get("max_position_embeddings"),
            # MLX's CUDA backend has no quantized_matmul for attention over a quantized KV cache
            # (seen on an H200 with mlx 0.32.4): such requests would fail mid-generation
            "quantized_kv": not mx.cuda.is_available()}
