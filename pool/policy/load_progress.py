"""How far a load has got and how long it has left: this host's measured load rate (bytes of weights
made resident per second, over its last loads, kept in memory) and the words clients and the page
read. Pure: the pool records loads and asks; the engine counts the bytes."""

from __future__ import annotations

from collections import deque

from .units import format_bytes

# Before this host has measured a load: a local SSD's page-cache-cold read of safetensors into MLX
# (measured on the 2-core VM: 0.4-0.9 GB/s), rounded down so a first estimate errs long.
DEFAULT_BYTES_PER_SECOND = 400e6
LOADS_KEPT = 8


class LoadRate:
    """Bytes per second over this host's last LOADS_KEPT loads (their weight fills)."""

    def __init__(self, default: float = DEFAULT_BYTES_PER_SECOND):
        self.default = default
        self._loads: deque[tuple[int, float]] = deque(maxlen=LOADS_KEPT)

    def record(self, nbytes: int, seconds: float | None) -> None:
        if nbytes > 0 and seconds and seconds > 0:
            self._loads.append((nbytes, seconds))

    def bytes_per_second(self) -> float:
        seconds = sum(s for _, s in self._loads)
        return sum(b for b, _ in self._loads) / seconds if seconds else self.default

    @property
    def measured(self) -> int:
        return len(self._loads)


def progress(done: int, total: int, rate: float) -> dict:
    """The snapshot's `load_progress` for a loading model."""
    done = max(0, min(done, total))
    eta = (total - done) / rate if rate > 0 else None
    return {"bytes_done": done, "bytes_total": total, "eta_seconds": None if eta is None else round(eta, 1)}


def describe(model: str, load: dict | None) -> str:
    """`loading tiny 45% (1.2 GB of 2.7 GB), ~3 s left`: a stream's progress comment, a refusal's note."""
    if not load:
        return f"waiting for {model}"
    done, total = load["bytes_done"], load["bytes_total"]
    percent = int(100 * done / total) if total else 0
    eta = load.get("eta_seconds")
    left = f", ~{max(1, round(eta))} s left" if eta is not None else ""
    return f"loading {model} {percent}% ({format_bytes(done)} of {format_bytes(total)}){left}"
