"""MemoryProbe: one reading of MLX, process and system memory. A fake, driven by a JSON file,
lets tests give the enforcer and the admission policy exact numbers."""

from __future__ import annotations

import ctypes
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from .backend import discrete_gpu
from .nvml import process_device_bytes
from .policy.pressure import Lines, auto_ceiling, pressure_lines


@dataclass(frozen=True)
class MemoryReading:
    active: int           # MLX active memory
    cache: int            # MLX buffer cache (reclaimable)
    peak: int             # MLX peak memory
    rss: int              # process resident memory (phys_footprint on macOS where available)
    total: int            # system RAM
    available: int        # system available memory
    device_total: int | None = None   # discrete GPU memory, where MLX reports one
    device_limit: int | None = None   # working-set limit (Metal's recommended size), where one exists
    discrete_gpu: bool = False
    prompt_cache: int = 0
    device_free: int | None = None    # what the driver reports free on a discrete GPU (NVML: nvidia-smi's)
    device_process: int | None = None  # what this process holds on that GPU as the driver counts it (pool/nvml.py)

    @property
    def usage(self) -> int:
        """Bytes counted against the ceiling. Unified memory and the CPU backend: whichever is
        larger of what the process holds and what MLX holds. A discrete GPU: MLX's own bytes and
        the process's floor beside them."""
        mlx = self.active + self.cache
        return mlx + (self.device_floor or 0) if self.discrete_gpu else max(self.rss, mlx)

    @property
    def device_floor(self) -> int | None:
        """What this process holds on its discrete GPU beyond MLX's buffers: the CUDA context, the
        libraries' workspaces, loaded kernels. None where the driver does not say."""
        if not self.discrete_gpu or self.device_process is None:
            return None
        return max(0, self.device_process - self.active - self.cache)

    @property
    def capacity(self) -> int:
        """The memory the usage is measured against: the GPU's on a discrete GPU, else RAM."""
        return self.device_total if self.discrete_gpu and self.device_total else self.total

    @property
    def device_used(self) -> int | None:
        """The discrete GPU's memory in use as its driver counts it (every process, MLX's cache too)."""
        if self.device_total is None or self.device_free is None:
            return None
        return self.device_total - self.device_free

    @property
    def reclaimable(self) -> int:
        return self.cache + self.prompt_cache

    def as_dict(self) -> dict:
        return {**asdict(self), "usage": self.usage, "reclaimable": self.reclaimable, "device_used": self.device_used,
                "device_floor": self.device_floor}


class _RusageInfoV2(ctypes.Structure):
    # <sys/resource.h> rusage_info_v2: a 16-byte uuid, then 64-bit counters
    _fields_ = [("ri_uuid", ctypes.c_uint8 * 16)] + [(name, ctypes.c_uint64) for name in (
        "ri_user_time", "ri_system_time", "ri_pkg_idle_wkups", "ri_interrupt_wkups", "ri_pageins",
        "ri_wired_size", "ri_resident_size", "ri_phys_footprint", "ri_proc_start_abstime",
        "ri_proc_exit_abstime", "ri_child_user_time", "ri_child_system_time", "ri_child_pkg_idle_wkups",
        "ri_child_interrupt_wkups", "ri_child_pageins", "ri_child_elapsed_abstime", "ri_diskio_bytesread",
        "ri_diskio_byteswritten")]


def _phys_footprint() -> int | None:
    """macOS's per-process ledger (what Activity Monitor shows and jetsam acts on), via libproc."""
    if sys.platform != "darwin":
        return None
    try:
        libproc = ctypes.CDLL("/usr/lib/libproc.dylib")
        info = _RusageInfoV2()
        if libproc.proc_pid_rusage(os.getpid(), 2, ctypes.byref(info)) != 0:  # 2 = RUSAGE_INFO_V2
            return None
        return int(info.ri_phys_footprint)
    except (OSError, AttributeError):
        return None


def _device() -> tuple[int | None, int | None, bool]:
    import mlx.core as mx
    try:
        info = mx.device_info()
    except Exception:  # noqa: BLE001 - older mlx or no device
        return None, None, False
    total = info.get("memory_size") or info.get("total_memory")
    limit = info.get("max_recommended_working_set_size")
    discrete = bool(total) and discrete_gpu()
    return (int(total) if total else None, int(limit) if limit else None, discrete)


def _device_free() -> int | None:
    """The driver's free memory, read fresh (mlx asks NVML, else cudaMemGetInfo)."""
    import mlx.core as mx
    try:
        free = mx.device_info().get("free_memory")
    except Exception:  # noqa: BLE001 - older mlx
        return None
    return int(free) if free is not None else None


class RealProbe:
    def __init__(self):
        self._device = None
        self.prompt_cache_bytes = lambda: 0

    def read(self) -> MemoryReading:
        import mlx.core as mx
        if self._device is None:
            self._device = _device()
        vm = psutil.virtual_memory()
        rss = _phys_footprint() or psutil.Process().memory_info().rss
        total, limit, discrete = self._device
        return MemoryReading(active=mx.get_active_memory(), cache=mx.get_cache_memory(),
                             peak=mx.get_peak_memory(), rss=rss, total=vm.total, available=vm.available,
                             device_total=total, device_limit=limit, discrete_gpu=discrete,
                             prompt_cache=self.prompt_cache_bytes(), device_free=_device_free() if discrete else None,
                             device_process=process_device_bytes(os.getpid()) if discrete else None)


class FakeProbe:
    """Reads `$OMLX_HOME/fake_probe.json` on every call, e.g. {"rss": 1e9, "total": 8e9}.
    Missing keys come from the real probe, so a test can pin only what it cares about;
    `"extra_rss"` adds to the real resident size."""

    def __init__(self, path: Path):
        self.path = path
        self.real = RealProbe()

    @property
    def prompt_cache_bytes(self):
        return self.real.prompt_cache_bytes

    @prompt_cache_bytes.setter
    def prompt_cache_bytes(self, fn):
        self.real.prompt_cache_bytes = fn

    def read(self) -> MemoryReading:
        real = self.real.read()
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            data = {}
        fields = asdict(real)
        fields["rss"] += int(data.pop("extra_rss", 0))
        fields.update({k: (int(v) if isinstance(v, (int, float)) else v) for k, v in data.items() if k in fields})
        return MemoryReading(**fields)


def make_probe(settings) -> RealProbe | FakeProbe:
    if settings.memory_probe == "fake":
        return FakeProbe(Path(os.fspath(settings.home)) / "fake_probe.json")
    return RealProbe()


def memory_lines(settings, reading: MemoryReading) -> Lines | None:
    """The enforcer's ceiling and its soft and hard lines for this reading; None when it is off."""
    value = settings.memory_ceiling
    if value == "off":
        return None
    if value == "auto":
        ceiling = auto_ceiling(reading.capacity, settings.memory_guard, reading.device_limit)
    else:
        ceiling = int(value)
    return pressure_lines(ceiling, settings.soft_fraction, settings.hard_fraction)
