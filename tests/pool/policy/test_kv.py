"""Decision tables for pool.policy.kv: the KV fields' rules and a request's KV estimate. Pure."""

from __future__ import annotations

import pytest

from pool.policy.kv import KVConfig, KVFieldError, KVLayers, KVLayout, kv_config, kv_estimate, llama_layout
from pool.policy.units import GIB

EIGHT_B = llama_layout(layers=32, kv_heads=8, head_dim=128, bytes_per_element=2)


@pytest.mark.parametrize(
    "tokens, config, expected",
    [
        (1, KVConfig(), 131072),
        (8192, KVConfig(), GIB),
        (0, KVConfig(), 0),
        (8192, KVConfig(max_kv_size=1024), GIB // 8),
        (512, KVConfig(max_kv_size=1024), GIB // 16),
        (8192, KVConfig(kv_bits=8), GIB // 2 + 8192 * 32 * 8 * 2 * 2 * 2 * 2),
        (8192, KVConfig(kv_bits=4), GIB // 4 + 8192 * 32 * 8 * 2 * 2 * 2 * 2),
        (8192, KVConfig(kv_bits=4, kv_group_size=128), GIB // 4 + 8192 * 32 * 8 * 2 * 2 * 2),
        (8192, KVConfig(kv_bits=8, quantized_kv_start=8192), GIB),
    ],
    ids=["one-token-of-an-8b-model", "8k-tokens-is-1GiB", "no-tokens", "rotating-holds-its-window",
         "rotating-under-its-window", "8-bit-half-plus-scales", "4-bit-quarter-plus-scales",
         "bigger-groups-fewer-scales", "nothing-quantized-yet"],
)
def test_kv_estimate(tokens, config, expected):
    assert kv_estimate(EIGHT_B, tokens=tokens, config=config) == expected


def test_quantized_kv_is_what_the_issue_promises():
    full = kv_estimate(EIGHT_B, tokens=4000)
    assert kv_estimate(EIGHT_B, tokens=4000, config=KVConfig(kv_bits=8)) <= 0.55 * full
    assert kv_estimate(EIGHT_B, tokens=4000, config=KVConfig(kv_bits=4)) <= 0.3 * full


@pytest.mark.parametrize(
    "requested, defaults, expected",
    [
        ({}, None, KVConfig()),
        ({"max_kv_size": 1024}, None, KVConfig(max_kv_size=1024)),
        ({"kv_bits": 4, "kv_group_size": 32}, None, KVConfig(kv_bits=4, kv_group_size=32)),
        ({}, {"kv_bits": 8, "quantized_kv_start": 256}, KVConfig(kv_bits=8, quantized_kv_start=256)),
        ({"kv_bits": 4}, {"kv_bits": 8}, KVConfig(kv_bits=4)),
        ({"max_kv_size": None}, {"max_kv_size": 2048}, KVConfig(max_kv_size=2048)),
    ],
    ids=["default", "rotating", "quantized", "the-models-defaults", "the-request-wins", "null-takes-the-default"],
)
def test_kv_config(requested, defaults, expected):
    assert kv_config(requested, defaults) == expected


@pytest.mark.parametrize(
    "requested, field",
    [
        ({"kv_bits": 3}, "kv_bits"),
        ({"kv_bits": "8"}, "kv_bits"),
        ({"kv_bits": True}, "kv_bits"),
        ({"kv_group_size": 48}, "kv_group_size"),
        ({"max_kv_size": 10}, "max_kv_size"),
        ({"max_kv_size": 2**40}, "max_kv_size"),
        ({"max_kv_size": 1.5}, "max_kv_size"),
        ({"quantized_kv_start": -1}, "quantized_kv_start"),
        ({"max_kv_size": 1024, "kv_bits": 8}, "kv_bits"),
    ],
)
def test_bad_kv_fields_name_the_field(requested, field):
    with pytest.raises(KVFieldError) as refused:
        kv_config(requested)
    assert refused.value.field == field and str(refused.value).startswith(f"'{field}' ")


HEAD_DIM_32 = llama_layout(layers=2, kv_heads=1, head_dim=32, bytes_per_element=2)


def test_the_group_size_must_divide_the_models_head_dim():
    assert kv_config({"kv_bits": 4, "kv_group_size": 32}, layout=HEAD_DIM_32) == KVConfig(kv_bits=4, kv_group_size=32)
    with pytest.raises(KVFieldError, match=r"head_dim \(32\).*sizes that do: 32") as refused:
        kv_config({"kv_bits": 4}, layout=HEAD_DIM_32)
    assert refused.value.field == "kv_group_size"
    # no groups without kv_bits
    assert kv_config({"max_kv_size": 256}, layout=HEAD_DIM_32) == KVConfig(max_kv_size=256)


def test_a_backend_without_quantized_kv_refuses_kv_bits_but_not_the_rest():
    with pytest.raises(KVFieldError, match="not supported on this backend") as refused:
        kv_config({"kv_bits": 8}, quantized_kv=False)
    assert refused.value.field == "kv_bits"
    assert kv_config({"max_kv_size": 512}, quantized_kv=False) == KVConfig(max_kv_size=512)


# A hybrid model's layers: 6 linear-attention layers of fixed state, 2 full-attention ones allocating
# 256 tokens at a time (Qwen3.5's shape); a sliding-window one: 5 layers of window 512, 1 growing.
HYBRID = KVLayout((KVLayers(6, fixed_bytes=10_000), KVLayers(2, 256, 2, growing=True, step=256)),
                  takes_max_kv_size=False, trimmable=False)
SLIDING = KVLayout((KVLayers(5, 256, 2, window=512), KVLayers(1, 256, 2, growing=True)), takes_max_kv_size=False,
                   head_dim=64)
MLA = KVLayout((KVLayers(4, 96, 4, growing=True),))     # one latent of 96 elements per token, float32


@pytest.mark.parametrize(
    "layout, tokens, chunk, expected",
    [
        (HYBRID, 1, 0, 6 * 10_000 + 2 * 256 * 512),
        (HYBRID, 256, 0, 6 * 10_000 + 2 * 256 * 512),
        (HYBRID, 257, 0, 6 * 10_000 + 2 * 512 * 512),
        (HYBRID, 0, 0, 0),
        (SLIDING, 100, 0, 6 * 100 * 512),
        (SLIDING, 8192, 0, 5 * 512 * 512 + 8192 * 512),
        (SLIDING, 8192, 2048, 5 * (511 + 2048) * 512 + 8192 * 512),
        (SLIDING, 1000, 2048, 6 * 1000 * 512),
        (SLIDING, 2500, 2048, 5 * 2048 * 512 + 2500 * 512),
        (MLA, 1000, 0, 4 * 1000 * 96 * 4),
    ],
    ids=["state-plus-one-step", "a-full-step", "a-second-step", "nothing", "under-the-window", "window-after-decode",
         "window-and-a-chunk-while-reading", "one-chunk-kept-whole", "a-short-last-chunk", "mla-latent-in-its-dtype"],
)
def test_kv_estimate_of_layouts_beside_llama(layout, tokens, chunk, expected):
    assert kv_estimate(layout, tokens=tokens, prefill_chunk=chunk) == expected


def test_max_kv_size_turns_only_growing_layers_into_windows():
    llama_window = KVLayout((KVLayers(1, 256, 2, growing=True),))
    assert kv_estimate(llama_window, tokens=8192, config=KVConfig(max_kv_size=1024)) == 1024 * 512
    assert kv_estimate(SLIDING, tokens=8192, config=KVConfig(max_kv_size=1024)) == (5 * 512 + 1024) * 512


def test_the_summary_names_what_each_layer_keeps():
    assert HYBRID.summary() == {"kv_bytes_per_token": 1024, "kv_fixed_bytes": 60_000, "kv_windows": [],
                                "kv_layer_kinds": ["6 x state", "2 x every token"]}
    assert SLIDING.summary()["kv_windows"] == [512]
    assert SLIDING.bytes_per_token == 512       # the window layers do not grow with the context


@pytest.mark.parametrize(
    "requested, layout, field, words",
    [
        ({"max_kv_size": 1024}, HYBRID, "max_kv_size", r"not supported by this model: its cache \(6 x state"),
        ({"max_kv_size": 1024}, SLIDING, "max_kv_size", "window 512"),
        ({"kv_bits": 8}, KVLayout(HYBRID.layers, takes_kv_bits=False), "kv_bits", "cannot quantize its cache"),
    ],
    ids=["hybrid-has-no-window", "sliding-keeps-its-own-windows", "no-quantized-state"],
)
def test_limits_a_models_cache_cannot_take_are_refused(requested, layout, field, words):
    with pytest.raises(KVFieldError, match=words) as refused:
        kv_config(requested, layout=layout)
    assert refused.value.field == field


def test_limits_a_models_cache_can_take_pass():
    assert kv_config({"kv_bits": 8}, layout=HYBRID) == KVConfig(kv_bits=8)
    assert kv_config({"max_kv_size": 512}, layout=MLA) == KVConfig(max_kv_size=512)
