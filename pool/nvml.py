"""This process's memory on NVIDIA GPUs, as the driver counts it (NVML, the library nvidia-smi reads).

MLX counts only its own buffers (active and cached). The process holds more on the card: the CUDA
context, cuBLAS and cuDNN workspaces, the kernels it has loaded. Measured on an H100 after a 20 GB
model was loaded and unloaded: 2,495 MiB held against 527 MiB before any load, with MLX at 0 active
and 0 cached. The memory probe adds that floor to what the budget counts (pool/memory.py).

Read through ctypes from the driver's own libnvidia-ml.so.1 (no Python package). Anything missing
(no library, no NVIDIA card, a PID namespace in which the driver's PIDs are not ours) answers None,
and a failure is not retried."""

from __future__ import annotations

import ctypes
import threading

MAX_PROCESSES = 64
NOT_AVAILABLE = 2**64 - 1     # NVML's usedGpuMemory where the driver does not say


class _ProcessInfo(ctypes.Structure):   # nvmlProcessInfo_t (the _v2/_v3 calls' layout)
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class _Nvml:
    def __init__(self):
        self._lib = None
        self._handles: list[ctypes.c_void_p] = []
        self._broken = False
        self._lock = threading.Lock()

    def _open(self) -> bool:
        if self._lib is not None or self._broken:
            return not self._broken
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != 0:
                raise OSError("nvmlInit_v2 failed")
            count = ctypes.c_uint()
            if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
                raise OSError("nvmlDeviceGetCount_v2 failed")
            for i in range(count.value):
                handle = ctypes.c_void_p()
                if lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) == 0:
                    self._handles.append(handle)
            self._query = getattr(lib, "nvmlDeviceGetComputeRunningProcesses_v3", None) or \
                lib.nvmlDeviceGetComputeRunningProcesses_v2
        except (OSError, AttributeError):
            self._broken = True
            return False
        self._lib = lib
        return True

    def process_bytes(self, pid: int) -> int | None:
        """Device memory `pid` holds on every NVIDIA GPU together; None where it cannot be read."""
        with self._lock:
            if not self._open():
                return None
            found, total = False, 0
            for handle in self._handles:
                infos = (_ProcessInfo * MAX_PROCESSES)()
                count = ctypes.c_uint(MAX_PROCESSES)
                if self._query(handle, ctypes.byref(count), infos) != 0:
                    continue
                for info in infos[:count.value]:
                    if info.pid == pid and info.usedGpuMemory != NOT_AVAILABLE:
                        found, total = True, total + int(info.usedGpuMemory)
            return total if found else None


_NVML = _Nvml()


def process_device_bytes(pid: int) -> int | None:
    return _NVML.process_bytes(pid)
