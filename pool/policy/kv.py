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


def kv_config(requested: dict, defaults: dict | None = None, *, head_dim: int | None = None,
              quantized_kv: bool = True) -> KVConfig:
    """The request's fields over the model's defaults -> a KVConfig; KVFieldError names a bad one.
    Quantized KV groups a head's elements: the group size must divide the model's head_dim; and the
    backend must have a kernel for it (`quantized_kv`)."""
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
    if config.kv_bits is not None and not quantized_kv:
        raise KVFieldError("kv_bits", "is not supported on this backend: MLX's CUDA backend has no kernel for "
                                      "attention over a quantized KV cache")
    if config.kv_bits is not None and head_dim and head_dim % config.kv_group_size:
        fits = ", ".join(str(g) for g in KV_GROUP_SIZES if head_dim % g == 0) or "none"
        raise KVFieldError("kv_group_size", f"must divide the model's head_dim ({head_dim}): {config.kv_group_size} "
                                            f"does not (sizes that do: {fits})")
    return config


def kv_estimate(*, layers: int, kv_heads: int, head_dim: int, bytes_per_element: int, tokens: int,
                config: KVConfig = KVConfig()) -> int:
    """Bytes of KV one request holds after `tokens`: keys and values for every layer and head; a
    rotating cache holds at most its window; quantized KV holds kv_bits per element plus a scale and
    a bias (in the model's dtype) per group, for the tokens past quantized_kv_start."""
    if config.max_kv_size is not None:
        tokens = min(tokens, config.max_kv_size)
    per_token = layers * kv_heads * head_dim * 2
    if config.kv_bits is None:
        return per_token * bytes_per_element * tokens
    plain = min(tokens, config.quantized_kv_start)
    packed = tokens - plain
    groups = math.ceil(head_dim / config.kv_group_size) * layers * kv_heads * 2
    quantized = per_token * config.kv_bits // 8 * packed + groups * 2 * bytes_per_element * packed
    return per_token * bytes_per_element * plain + quantized
