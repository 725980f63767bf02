"""The decode bandwidth bound: every decode step reads all the weights once, so one stream cannot
decode faster than (device copy rate / weight bytes) tokens per second, and a batch of B streams not
faster than B times that. The copy rate is measured here with MLX on its default device."""

from __future__ import annotations

import time
from pathlib import Path


def copy_bandwidth(gigabytes: float = 1.0, repeats: int = 5) -> float:
    """Bytes per second MLX moves on its default device copying a float32 array of `gigabytes`:
    (bytes read + bytes written) / the best time of `repeats`."""
    import mlx.core as mx

    a = mx.random.uniform(shape=(int(gigabytes * 1e9 / 4),))
    mx.eval(a)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        b = a + 1                      # + 1, not + 0: one read and one write the graph cannot skip
        mx.eval(b)
        best = min(best, time.perf_counter() - started)
        del b
    nbytes = a.nbytes
    del a
    mx.clear_cache()
    return 2 * nbytes / best


def weight_bytes(model: Path) -> int:
    """The model's weight bytes: the size of its safetensors files."""
    return sum(p.stat().st_size for p in Path(model).glob("*.safetensors"))


class Bound:
    """Decode tokens/s against the bandwidth bound of one model on this device."""

    def __init__(self, model: Path, bandwidth: float | None = None):
        self.weights = weight_bytes(model)
        self.bandwidth = bandwidth or copy_bandwidth()

    @property
    def steps_per_second(self) -> float:
        return self.bandwidth / self.weights

    def share(self, tokens_per_second: float, streams: int = 1) -> float:
        """The fraction of the bound a decode rate reaches, `streams` tokens per step."""
        return tokens_per_second / streams / self.steps_per_second

    def describe(self) -> str:
        return (f"weights {self.weights / 1e9:.2f} GB; device copy rate {self.bandwidth / 1e9:.1f} GB/s; "
                f"bound {self.steps_per_second:.1f} decode steps/s (one stream's tok/s; B streams: B x)")
