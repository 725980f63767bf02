"""An optimized BLAS for MLX's CPU backend, loaded before MLX is imported.

The `mlx-cpu` wheel bundles netlib's reference BLAS: a float32 matmul runs at about 6 GFLOPS on a
2-core Xeon. libmlx imports only `cblas_sgemm`/`dgemm`/`cgemm` (and some LAPACK), so a library that
exports plain `cblas_*` symbols, loaded with RTLD_GLOBAL before `import mlx`, takes those calls
(about 300 GFLOPS). On macOS (Metal, Accelerate) and with an MLX CUDA wheel nothing is done.

`preload()` runs from `omlx_site.process.setup_process()`, which every entry point calls first;
it imports nothing but the standard library and `pool.conf`/`pool.backend` (no MLX, no Django),
and it runs once per process.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import sysconfig
from pathlib import Path

from pool.backend import cpu_backend

log = logging.getLogger(__name__)


def debian_openblas() -> str:
    """Where Debian's and Ubuntu's libopenblas0-pthread puts the library."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or "x86_64-linux-gnu"
    return f"/usr/lib/{multiarch}/openblas-pthread/libopenblas.so.0"


def _openblas() -> list[list[str]]:
    return [[debian_openblas()],
            ["libopenblas.so.0"]]      # elsewhere on the loader's path


def _mkl() -> list[list[str]]:
    # PyPI `mkl` + `intel-openmp` put their libraries in <prefix>/lib; MKL's default threading layer
    # needs Intel's OpenMP runtime loaded globally first.
    lib = Path(sys.prefix) / "lib"
    found = []
    for rt in ("libmkl_rt.so.3", "libmkl_rt.so.2"):
        found.append([str(lib / "libiomp5.so"), str(lib / rt)])
        found.append(["libiomp5.so", rt])
    return found


CANDIDATES = {"openblas": _openblas, "mkl": _mkl}
AUTO_ORDER = ("openblas", "mkl")

# What happened in this process: None before preload(), then a dict the serve command can print.
state: dict | None = None


def _load(chain: list[str]) -> str | None:
    """Load each library of the chain globally; the path of the last, when it exports cblas_sgemm."""
    try:
        libs = [ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL) for name in chain]
    except OSError:
        return None
    return chain[-1] if hasattr(libs[-1], "cblas_sgemm") else None


def preload() -> dict:
    """Load the BLAS `OMLX_BLAS` asks for (auto: OpenBLAS, then MKL), once; never raises."""
    global state
    if state is not None:
        return state
    from pool.conf import ImproperlyConfigured, read_setting

    try:
        wanted = read_setting("OMLX_BLAS")
    except ImproperlyConfigured as e:
        log.warning("%s; using auto", e)
        wanted = "auto"
    if wanted == "off" or not cpu_backend():
        state = {"blas": "bundled", "path": None, "reason": "off" if wanted == "off" else "not the CPU backend"}
        return state
    if "mlx.core" in sys.modules:
        # libmlx's symbols are bound when it is loaded (Python dlopens with RTLD_NOW): too late
        state = {"blas": "bundled", "path": None, "reason": "mlx was imported first"}
        log.warning("optimized BLAS not loaded: mlx was imported before omlx_site.process.setup_process()")
        return state
    for name in AUTO_ORDER if wanted == "auto" else (wanted,):
        for chain in CANDIDATES[name]():
            path = _load(chain)
            if path is not None:
                state = {"blas": name, "path": path, "reason": ""}
                log.debug("BLAS for MLX's CPU backend: %s (%s)", name, path)
                return state
    state = {"blas": "bundled", "path": None, "reason": f"{wanted}: no library found"}
    log.warning("no optimized BLAS found (OMLX_BLAS=%s): MLX's float32 matmuls use the bundled reference "
                "BLAS, about 50x slower; install Debian's libopenblas0-pthread (make does) or set "
                "OMLX_BLAS=off to silence this", wanted)
    return state
