"""An unload's history row: what the device got back, as MLX (active memory and its buffer cache)
and, on a discrete GPU, its driver (NVML's used memory, what nvidia-smi shows) measured it."""

from __future__ import annotations

import logging

from ..policy.units import format_bytes

log = logging.getLogger("pool.host.engine_pool")


def unload_fields(*, model_id: str, expected: int, release, before, after, quiet: bool) -> dict:
    """The row's measured fields. `quiet`: no other model loaded or served across the release, so
    a fall short of the weights (or weights something still held) is a leak worth a warning."""
    detail = ""
    if before.device_used is not None and after.device_used is not None:
        detail = f" (device {format_bytes(before.device_used)} -> {format_bytes(after.device_used)})"
    kept = getattr(release, "kept_bytes", 0)
    warning = bool(kept) or (quiet and release.freed_bytes < 0.9 * expected)
    if warning:
        log.warning("unloading %s released %d of %d bytes measured at load (%d still held)", model_id,
                    release.freed_bytes, expected, kept)
        detail += (f" (weights of {format_bytes(kept)} still held after the release)" if kept
                   else " (released less than 90% of the measured size)")
    return {"freed_bytes": release.freed_bytes, "rss_freed_bytes": release.rss_before - release.rss_after,
            "bytes_before": before.usage, "bytes_after": after.usage, "warning": warning, "detail_suffix": detail}
