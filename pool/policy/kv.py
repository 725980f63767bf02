"""Per-request KV cache limits: the fields, their rules, and what a request's KV will weigh.

One definition for the API's body fields, the per-model defaults in ModelSettings and the prefill
guard's estimate."""

from __future__ import annotations

import math
from dataclasses import dataclass

KV_BITS = (4, 8)
KV_GROUP_SIZES = (32, 64, 128)
MIN_KV_SIZE = 64          # a rotating window smaller than this is no context at all
MAX_INT = 2**31 - 1
FIELDS = ("max_kv_size", "kv_bits", "kv_group_size", "quantized_kv_start")


@dataclass(frozen=True)
class KVConfig:
    """The KV cache a request asked for; requests with equal configs can share a batch."""
    max_kv_size: int | None = None     # a rotating cache of this many tokens
    kv_bits: int | None = None         # 4 or 8: quantized KV (decodes alone: no batched quantized cache)
    kv_group_size: int = 64
    quantized_kv_start: int = 0        # tokens kept unquantized at the start

    @property
    def default(self) -> bool:
        return self.max_kv_size is None and self.kv_bits is None

    @property
    def batches(self) -> bool:
        return self.kv_bits is None


class KVFieldError(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(f"'{field}' {message}")
        self.field = field


def field_problem(name: str, value) -> str | None:
    """Why one field's value is refused, or None. Used by the API and by ModelSettings."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        return "must be an integer"
    if name == "max_kv_size" and not MIN_KV_SIZE <= value <= MAX_INT:
        return f"must be between {MIN_KV_SIZE} and {MAX_INT}"
    if name == "kv_bits" and value not in KV_BITS:
        return "must be 4 or 8"
    if name == "kv_group_size" and value not in KV_GROUP_SIZES:
        return "must be 32, 64 or 128"
    if name == "quantized_kv_start" and not 0 <= value <= MAX_INT:
        return f"must be between 0 and {MAX_INT}"
    return None


def kv_config(requested: dict, defaults: dict | None = None, *, layout: KVLayout | None = None,
              quantized_kv: bool = True) -> KVConfig:
    """The request's fields over the model's defaults -> a KVConfig; KVFieldError names a bad one.
    The model's cache must take each limit (`layout`: a rotating window where every layer is a plain
    KVCache; kv_bits where mlx-lm quantizes every layer that keeps every token). Quantized KV groups
    a head's elements: the group size must divide the model's head_dim; and the backend must have a
    kernel for it (`quantized_kv`)."""
    values = {}
    for name in FIELDS:
        value = requested.get(name)
        if value is None and defaults:
            value = defaults.get(name)
        problem = field_problem(name, value)
        if problem:
            raise KVFieldError(name, problem)
        values[name] = value
    if values["max_kv_size"] is not None and values["kv_bits"] is not None:
        raise KVFieldError("kv_bits", "cannot be combined with max_kv_size: mlx-lm does not quantize a rotating cache")
    config = KVConfig(max_kv_size=values["max_kv_size"], kv_bits=values["kv_bits"],
                      kv_group_size=values["kv_group_size"] or 64, quantized_kv_start=values["quantized_kv_start"] or 0)
    if layout is not None:
        _check_layout(config, layout)
    head_dim = layout.head_dim if layout is not None else None
    if config.kv_bits is not None and not quantized_kv:
        raise KVFieldError("kv_bits", "is not supported on this backend: MLX's CUDA backend has no kernel for "
                                      "attention over a quantized KV cache")
    if config.kv_bits is not None and head_dim and head_dim % config.kv_group_size:
        fits = ", ".join(str(g) for g in KV_GROUP_SIZES if head_dim % g == 0) or "none"
        raise KVFieldError("kv_group_size", f"must divide the model's head_dim ({head_dim}): {config.kv_group_size} "
                                            f"does not (sizes that do: {fits})")
    return config


def _check_layout(config: KVConfig, layout: KVLayout) -> None:
    layers = ", ".join(_kind(g) for g in layout.layers)
    if config.max_kv_size is not None and not layout.takes_max_kv_size:
        raise KVFieldError("max_kv_size", f"is not supported by this model: its cache ({layers}) is made by the "
                                          "model itself, and mlx-lm gives it no rotating window of another size")
    if config.kv_bits is not None and not layout.takes_kv_bits:
        raise KVFieldError("kv_bits", f"is not supported by this model: mlx-lm cannot quantize its cache ({layers})")


@dataclass(frozen=True)
class KVLayers:
    """Layers of one model whose caches weigh alike (engines/kv_layout.py reads them off the caches
    mlx-lm makes for the model)."""
    count: int
    elements_per_token: int = 0    # keys' and values' elements one token adds to one layer (0: a state layer)
    itemsize: int = 2              # bytes per element: the dtype the cache really has
    window: int | None = None      # a rotating layer keeps at most this many tokens (a sliding window)
    fixed_bytes: int = 0           # bytes one sequence holds whatever its length (a recurrent state)
    growing: bool = False          # a plain KVCache: it keeps every token; max_kv_size and kv_bits apply to it
    step: int = 1                  # it allocates this many tokens at a time (mlx-lm's KVCache: 256)


@dataclass(frozen=True)
class KVLayout:
    """What one request's caches weigh, layer by layer; and which KV limits the model can take."""
    layers: tuple[KVLayers, ...]
    takes_max_kv_size: bool = True
    takes_kv_bits: bool = True
    head_dim: int | None = None    # of the layers kv_bits quantizes: its groups must divide it
    trimmable: bool = True         # every layer can be cut back to any shorter prefix (a plain KVCache);
                                   # otherwise the prompt cache keeps checkpoints at exact boundaries

    @property
    def bytes_per_token(self) -> int:
        """What each token adds to the layers that keep every token."""
        return sum(g.count * g.elements_per_token * g.itemsize for g in self.layers if g.window is None)

    @property
    def fixed_bytes(self) -> int:
        return sum(g.count * g.fixed_bytes for g in self.layers)

    def summary(self) -> dict:
        """The snapshot's words for it."""
        windows = sorted({g.window for g in self.layers if g.window is not None and g.elements_per_token})
        return {"kv_bytes_per_token": self.bytes_per_token, "kv_fixed_bytes": self.fixed_bytes,
                "kv_windows": windows, "kv_layer_kinds": [_kind(g) for g in self.layers]}


def _kind(g: KVLayers) -> str:
    if g.window is not None:
        return f"{g.count} x window {g.window}"
    if g.elements_per_token:
        return f"{g.count} x every token"
    return f"{g.count} x state"


def llama_layout(*, layers: int, kv_heads: int, head_dim: int, bytes_per_element: int) -> KVLayout:
    """Every layer a KVCache of kv_heads x head_dim keys and values (a llama-shaped model)."""
    return KVLayout((KVLayers(layers, 2 * kv_heads * head_dim, bytes_per_element, growing=True),), head_dim=head_dim)


def kv_estimate(layout: KVLayout, *, tokens: int, config: KVConfig = KVConfig(), prefill_chunk: int = 0) -> int:
    """Bytes of KV one request holds after `tokens`. A layer that keeps every token holds them (in
    its allocation steps); a rotating one at most its window, and while a prompt is read in
    chunks of `prefill_chunk`, its window and a chunk (mlx-lm trims it back at the next decode step);
    a state layer its fixed bytes. max_kv_size makes the growing layers rotating; kv_bits packs
    them in kv_bits per element plus a scale and a bias (in the cache's dtype) per group, for the
    tokens past quantized_kv_start."""
    if tokens <= 0:
        return 0
    total = 0
    for g in layout.layers:
        window = config.max_kv_size if g.growing and config.max_kv_size is not None else g.window
        held = -(-tokens // g.step) * g.step if window is None else _rotating_peak(tokens, window, prefill_chunk)
        per_token = g.elements_per_token * g.itemsize
        if g.growing and config.kv_bits is not None:
            plain = min(held, config.quantized_kv_start)
            packed = held - plain
            groups = math.ceil(g.elements_per_token / config.kv_group_size)
            per_layer = per_token * plain + (g.elements_per_token * config.kv_bits // 8
                                             + 2 * groups * g.itemsize) * packed
        else:
            per_layer = per_token * held
        total += g.count * (per_layer + g.fixed_bytes)
    return total


def _rotating_peak(tokens: int, window: int, chunk: int) -> int:
    """The most a rotating cache holds while `tokens` are read `chunk` at a time (0: one at a time).
    Its first chunk is kept whole; each later one is appended to the last window - 1 tokens."""
    if chunk <= 1 or tokens <= chunk:
        return min(tokens, window) if chunk <= 1 else tokens
    kept = min(chunk, window - 1)
    full, last = divmod(tokens, chunk)
    return max(chunk, kept + chunk if full >= 2 else 0, kept + last if last else 0)
