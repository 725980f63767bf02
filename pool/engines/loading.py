"""Reading a model folder on the engine thread: the tokenizer first, then the weights in groups of
tensors, and the KV shape the prefill guard needs."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.generate import generation_stream
from mlx_lm.utils import load_model, load_tokenizer

from ..catalog.kinds import config_context_length
from .dequantize import dequantize_for_cpu
from .kv_layout import measure_layout
from .memory_release import ACCOUNTING

DEFAULT_GROUP_BYTES = 64 * 2**20


class LoadProgress:
    """How far `fill_weights` has read: written by the engine thread, read by the event loop (each
    field a plain int or float, read whole under the GIL). `seconds` is the fill's, for the pool's
    measured load rate (bytes made resident per second, without the tokenizer or the wait for room)."""

    def __init__(self) -> None:
        self.bytes_total = 0
        self.bytes_done = 0
        self.seconds: float | None = None
        self._started = 0.0

    def begin(self, total: int) -> None:
        self.bytes_total, self.bytes_done, self.seconds = total, 0, None
        self._started = time.perf_counter()

    def advance(self, nbytes: int) -> None:
        self.bytes_done += nbytes

    def finish(self) -> None:
        self.seconds = time.perf_counter() - self._started


def load_weights(path: Path, *, dequantize: bool = False):
    """(model, tokenizer, config) with every weight evaluated."""
    model, tokenizer, config = open_model(path, dequantize=dequantize)
    fill_weights(model)
    return model, tokenizer, config


def open_model(path: Path, *, dequantize: bool = False):
    """(model, tokenizer, config) with the weights not yet read: no memory taken but the tokenizer's.
    The kernel is asked to read the weight files ahead meanwhile. With `dequantize` (the pool's
    decision), a quantized model's weights become float32 as they are read."""
    eos = json.loads((path / "config.json").read_text()).get("eos_token_id")
    # The tokenizer first, the weights last: the memory arrives at the very end of the load,
    # where the load's wake-up lets the enforcer see it at once.
    tokenizer = tokenizer_for(path, eos)
    _read_ahead(path)
    try:
        model, config = load_model(path, lazy=True)
    except ValueError as e:
        if isinstance(e.__cause__, ImportError):   # mlx-lm's words echo the file's value; clients see this
            raise ValueError("config.json's model_type is not an architecture mlx-lm supports") from e
        raise
    if dequantize:
        model, config = dequantize_for_cpu(model, config)
    return model, tokenizer, config


TOKENIZERS_KEPT = 8
_tokenizers: OrderedDict[str, object] = OrderedDict()
_identities: dict[tuple, str] = {}        # (folder, its files' sizes and mtimes) -> what its tokenizer is built from
_tokenizers_lock = threading.Lock()
# The files AutoTokenizer and mlx-lm's tokenizer loader read (mlx-lm's allow patterns), config.json aside
_TOKENIZER_FILES = ("*.json", "*.py", "tokenizer.model", "*.tiktoken", "*.txt", "*.jsonl", "*.jinja")
_NOT_TOKENIZER = ("config.json", "model.safetensors.index.json")
_LARGEST_HASHED = 64 * 2**20


def tokenizer_for(path: Path, eos):
    """mlx-lm's tokenizer for a model folder, one per distinct tokenizer among the TOKENIZERS_KEPT most
    recently used: a reload after an eviction reuses it while the folder's files are unchanged, and
    folders whose tokenizer files are identical (the 4-bit and 8-bit of one model, say) share one copy,
    with its llguidance tables (tens of MB each).
    Building one holds the GIL inside native code (transformers' AutoTokenizer, json) for up to a few
    hundred ms at a stretch (measured on the 2-core VM: 200-500 ms), which stalls every other model's
    stream whatever the switch interval; the wrapper is safe to share (each request copies its
    detokenizer)."""
    key = _identity(path) + json.dumps(eos)
    with _tokenizers_lock:
        if key in _tokenizers:
            _tokenizers.move_to_end(key)
            return _tokenizers[key]
    tokenizer = load_tokenizer(path, eos_token_ids=eos)
    with _tokenizers_lock:
        tokenizer = _tokenizers.setdefault(key, tokenizer)
        _tokenizers.move_to_end(key)
        while len(_tokenizers) > TOKENIZERS_KEPT:
            _tokenizers.popitem(last=False)
    return tokenizer


def forget_tokenizers() -> None:
    """Drop the kept tokenizers (with their llguidance tables, tens of MB each): the enforcer's
    first rung frees them with MLX's buffer cache. A loaded model's engine still holds its own."""
    with _tokenizers_lock:
        _tokenizers.clear()
        _identities.clear()


def _identity(path: Path) -> str:
    """A digest of what the folder's tokenizer is built from: the tokenizer files' bytes, and the two
    fields of config.json that choose its class (model_type, tokenizer_class). Hashed once per
    version of the folder (its files' sizes and mtimes)."""
    stamp = (str(path.resolve()), _stamp(path))
    with _tokenizers_lock:
        if stamp in _identities:
            return _identities[stamp]
    digest = hashlib.sha256()
    files = sorted({f for pattern in _TOKENIZER_FILES for f in path.glob(pattern)
                    if f.is_file() and f.name not in _NOT_TOKENIZER})
    sizes = {f: f.stat().st_size for f in files}
    if max(sizes.values(), default=0) > _LARGEST_HASHED:
        digest.update(repr(stamp).encode())    # not a tokenizer's file: this folder's own tokenizer
    for f in files:
        digest.update(f"{f.name}\0{sizes[f]}\0".encode())
        if sizes[f] <= _LARGEST_HASHED:
            digest.update(f.read_bytes())
    config = json.loads((path / "config.json").read_text())
    digest.update(json.dumps([config.get("model_type"), config.get("tokenizer_class")]).encode())
    with _tokenizers_lock:
        if len(_identities) >= 4 * TOKENIZERS_KEPT:
            _identities.clear()
        _identities[stamp] = identity = digest.hexdigest()
    return identity


def _stamp(path: Path) -> tuple:
    """Every file of the folder but the weights, by size and mtime."""
    return tuple(sorted((f.name, st.st_size, st.st_mtime_ns) for f in path.iterdir()
                        if f.suffix != ".safetensors" and f.is_file() and (st := f.stat())))


def fill_weights(model, group_bytes: int = DEFAULT_GROUP_BYTES, progress: LoadProgress | None = None) -> int:
    """Evaluate every weight, `group_bytes` of them at a time; returns their bytes. `progress` counts
    the bytes made resident as each group is evaluated (lazy weights know their size unread)."""
    # In groups of about OMLX_LOAD_GROUP_BYTES. An eval holds the GIL while it reads, so one eval of every
    # weight stalls the event loop and the other engines for the whole read (measured: 109 ms gaps
    # for a 1.2 GB model); one tensor at a time pays each eval's fixed cost per tensor (1.3x slower
    # loads on a GPU). Measured on a 640 MB file from the page cache (2 CPU cores): one tensor
    # (16 MB) at a time 705 ms, p99 stall of another thread 3 ms, worst 76 ms; 64 MB groups 325 ms,
    # 17 ms and 24 ms; one eval 397 ms, 36 ms and 42 ms.
    progress = progress or LoadProgress()
    weights = [w for _, w in tree_flatten(model.parameters())]
    progress.begin(sum(w.nbytes for w in weights))
    group, size, total = [], 0, 0
    for weight in weights:
        group.append(weight)
        size += weight.nbytes
        if size >= group_bytes:
            with ACCOUNTING:
                mx.eval(group)
            progress.advance(size)
            group, total, size = [], total + size, 0
    with ACCOUNTING:
        mx.eval(group)
    mx.synchronize(generation_stream)
    progress.advance(size)
    progress.finish()
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
    """What the pool and the door read of a loaded language model: its context, the weight of its
    KV cache (kv_layout.py, read off the caches mlx-lm makes for it) and whether quantized KV runs."""
    return {"context_length": config_context_length(config),
            "kv_layout": measure_layout(model),
            # MLX's CUDA backend has no quantized_matmul for attention over a quantized KV cache
            # (seen on an H200 with mlx 0.32.4): such requests would fail mid-generation
            "quantized_kv": not mx.cuda.is_available()}
