"""Decision table for pool.policy.dequantize: when a quantized model is served as float32."""

from __future__ import annotations

import pytest

from pool.policy.dequantize import dequantize_budget, should_dequantize
from pool.policy.load_plan import auto_model_budget

from .tables import gib


@pytest.mark.parametrize(
    "mode, cpu, dense, budget, expected",
    [
        ("auto", True, gib(2), gib(4), True),
        ("auto", True, gib(4), gib(4), True),
        ("auto", True, gib(4) + 1, gib(4), False),
        ("auto", True, None, gib(4), False),
        ("auto", False, gib(1), gib(4), False),
        ("on", True, gib(8), gib(4), True),
        ("on", True, None, gib(4), False),
        ("on", False, gib(1), gib(4), False),
        ("off", True, gib(1), gib(4), False),
        ("off", False, gib(1), gib(4), False),
    ],
    ids=[
        "auto-fits",
        "auto-exactly-the-budget",
        "auto-one-byte-over",
        "auto-not-quantized",
        "auto-metal-or-cuda",
        "on-over-the-budget",
        "on-not-quantized",
        "on-metal-or-cuda",
        "off",
        "off-metal-or-cuda",
    ],
)
def test_should_dequantize(mode, cpu, dense, budget, expected):
    assert should_dequantize(mode, cpu_backend=cpu, dense_bytes=dense, budget=budget) is expected


@pytest.mark.parametrize(
    "max_model_memory, capacity, expected",
    [
        (gib(3), gib(64), gib(3)),
        ("auto", gib(24), auto_model_budget(gib(24))),
        ("off", gib(24), auto_model_budget(gib(24))),   # an unbounded pool still bounds the dense size
    ],
    ids=["a-size", "auto", "off-uses-the-auto-budget"],
)
def test_dequantize_budget(max_model_memory, capacity, expected):
    assert dequantize_budget(max_model_memory, capacity) == expected
