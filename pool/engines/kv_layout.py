"""What a model's KV cache weighs, read off the caches mlx-lm makes for it (policy.kv.KVLayout).

The model reads one token into a fresh `make_prompt_cache(model)` without evaluating anything: MLX
arrays know their shapes and dtypes before they are computed, so each cache shows what a token adds
(keys and values of a KVCache or a RotatingKVCache, its window) or what a sequence holds whatever
its length (an ArraysCache's recurrent state), at the dtype the model really computes in, and
nothing is allocated. The same dry runs tell which KV limits the model can take: max_kv_size where
every layer is a plain KVCache that a rotating one can replace, kv_bits where mlx-lm's
`maybe_quantize_kv_cache` quantizes every layer that keeps every token and the model reads the
result."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import (
    ArraysCache,
    CacheList,
    ChunkedKVCache,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
    make_prompt_cache,
)

from ..policy.kv import KVLayers, KVLayout

log = logging.getLogger(__name__)
TRIAL_WINDOW = 64


def measure_layout(model) -> KVLayout:
    caches = make_prompt_cache(model)
    model(mx.array([[0]]), cache=caches)        # not evaluated: shapes only
    groups = Counter(g for c in caches for g in _layers(c))
    layers = tuple(KVLayers(count, *key) for key, count in groups.items())
    plain = trims_back(caches)
    head_dims = {c.keys.shape[-1] for c in caches if type(c) is KVCache and c.keys is not None}
    return KVLayout(layers, takes_max_kv_size=plain and _runs(model, _rotating(caches)),
                    takes_kv_bits=_takes_kv_bits(model, caches),
                    head_dim=min(head_dims) if head_dims else None, trimmable=plain)


def trims_back(caches: list) -> bool:
    """Whether these caches can always be cut back to a shorter prefix: only plain KVCaches (a
    RotatingKVCache can until it wraps, a recurrent state never)."""
    return all(type(c) is KVCache for c in caches)


def _layers(c) -> list[tuple]:
    """(elements_per_token, itemsize, window, fixed_bytes, growing, step) of each layer `c` stands for."""
    if isinstance(c, CacheList):
        return [g for inner in c.caches for g in _layers(inner)]
    if isinstance(c, ArraysCache):
        return [(0, 2, None, sum(a.nbytes for a in c.cache if a is not None), False, 1)]
    keys, values = getattr(c, "keys", None), getattr(c, "values", None)
    if isinstance(keys, mx.array) and isinstance(values, mx.array) and keys.ndim == 4:
        elements = keys.shape[1] * keys.shape[3] + values.shape[1] * values.shape[3]
        if isinstance(c, RotatingKVCache):
            return [(elements, keys.itemsize, c.max_size, 0, False, 1)]
        if isinstance(c, ChunkedKVCache):
            return [(elements, keys.itemsize, c.chunk_size, 0, False, 1)]
        return [(elements, keys.itemsize, None, 0, type(c) is KVCache, getattr(c, "step", 1))]
    # a cache type this code does not know: what it holds after one token, as a fixed cost
    log.warning("unknown cache type %s: its KV is counted as fixed bytes", type(c).__name__)
    return [(0, 2, None, int(getattr(c, "nbytes", 0) or 0), False, 1)]


def _rotating(caches: list) -> list:
    return [RotatingKVCache(max_size=TRIAL_WINDOW, keep=4) for _ in caches]


def _runs(model, caches: list, *, quantize: bool = False) -> bool:
    """Whether the model reads a prompt and then decodes over these caches (dry runs: shapes only)."""
    try:
        model(mx.array([[0, 1]]), cache=caches)
        if quantize:
            for i, c in enumerate(caches):
                if hasattr(c, "to_quantized"):
                    caches[i] = c.to_quantized(group_size=32, bits=8)
        model(mx.array([[2]]), cache=caches)
        return True
    except Exception as e:  # noqa: BLE001 - any failure means the model cannot take it
        log.debug("a dry run failed: %s", e)
        return False


def _takes_kv_bits(model, caches: list) -> bool:
    """mlx-lm quantizes each cache that has `to_quantized`; a RotatingKVCache's raises, a CacheList
    or a state has none (kv_bits would do nothing). Every layer that keeps every token must be
    quantized, at least one, and the model must read the quantized caches."""
    growing = [c for c in caches if type(c) is KVCache]
    others = [c for c in caches if type(c) is not KVCache]
    if not growing or any(hasattr(c, "to_quantized") or isinstance(c, CacheList) for c in others):
        return False
    if any(c.keys is not None and c.keys.shape[-1] % 32 for c in growing):
        return False
    trial = make_prompt_cache(model)
    return _runs(model, trial, quantize=True) and all(
        isinstance(c, QuantizedKVCache) for c in trial if not isinstance(c, ArraysCache))


def held_bytes(model, prompt: mx.array, step: int = 2048) -> int:
    """What mlx-lm's caches hold once `prompt` is read into them, `step` tokens at a time (as its
    generate reads a prompt): for the benchmark and the tests that compare it with the estimate."""
    caches: list[Any] = make_prompt_cache(model)
    for start in range(0, prompt.size, step):
        model(prompt[start:start + step][None], cache=caches)
        mx.eval([c.state for c in caches])
    return sum(c.nbytes for c in caches)
