"""Decision tables for pool.policy.kv: the KV fields' rules and a request's KV estimate. Pure."""

from __future__ import annotations

import pytest

from pool.policy.kv import KVConfig, KVFieldError, kv_config, kv_estimate
from pool.policy.units import GIB

EIGHT_B = dict(layers=32, kv_heads=8, head_dim=128, bytes_per_element=2)


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
    assert kv_estimate(**EIGHT_B, tokens=tokens, config=config) == expected


def test_quantized_kv_is_what_the_issue_promises():
    full = kv_estimate(**EIGHT_B, tokens=4000)
    assert kv_estimate(**EIGHT_B, tokens=4000, config=KVConfig(kv_bits=8)) <= 0.55 * full
    assert kv_estimate(**EIGHT_B, tokens=4000, config=KVConfig(kv_bits=4)) <= 0.3 * full


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


def test_the_group_size_must_divide_the_models_head_dim():
    assert kv_config({"kv_bits": 4, "kv_group_size": 32}, head_dim=32) == KVConfig(kv_bits=4, kv_group_size=32)
    with pytest.raises(KVFieldError, match=r"head_dim \(32\).*sizes that do: 32") as refused:
        kv_config({"kv_bits": 4}, head_dim=32)
    assert refused.value.field == "kv_group_size"
    assert kv_config({"max_kv_size": 256}, head_dim=32) == KVConfig(max_kv_size=256)   # no groups without kv_bits


def test_a_backend_without_quantized_kv_refuses_kv_bits_but_not_the_rest():
    with pytest.raises(KVFieldError, match="not supported on this backend") as refused:
        kv_config({"kv_bits": 8}, quantized_kv=False)
    assert refused.value.field == "kv_bits"
    assert kv_config({"max_kv_size": 512}, quantized_kv=False) == KVConfig(max_kv_size=512)
