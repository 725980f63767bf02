"""Like for like on the CPU (issue 22, item 4): every side of a benchmark on the same float32 copy
of a model folder, with the same BLAS.

As shipped, omlx-site dequantizes a quantized model to float32 and preloads OpenBLAS
(omlx_site/blas.py), while mlx_lm.server runs the 4-bit weights on MLX's bundled reference BLAS: the
comparison then measures the CPU path, not the serving. Here the model is written once as float32
(the same dequantization the pool applies, pool/engines/dequantize.py) and the benchmark's own
process re-executes itself with LD_PRELOAD naming Debian's OpenBLAS, so every process it starts
(omlx-site, mlx_lm.server) and the raw side in it load the same library before MLX."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from _models import CACHE

from omlx_site.blas import debian_openblas

OPENBLAS = debian_openblas()


def preloaded() -> bool:
    return OPENBLAS in os.environ.get("LD_PRELOAD", "").split(":")


def reexec_with_openblas() -> None:
    """Run this script again with OpenBLAS in LD_PRELOAD (inherited by every process it starts);
    returns only when it is there already."""
    if preloaded():
        return
    if not Path(OPENBLAS).exists():
        sys.exit(f"like for like needs {OPENBLAS} (Debian's libopenblas0-pthread; `make blas` installs it)")
    env = dict(os.environ)
    env["LD_PRELOAD"] = ":".join(p for p in (OPENBLAS, env.get("LD_PRELOAD", "")) if p)
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def float32_copy(model: Path) -> Path:
    """A float32 copy of `model` (dequantized as the pool does), written once beside the
    benchmarks' other models; a model with no quantization is copied as float32 too."""
    out = CACHE / "float32" / model.name
    if (out / "config.json").exists():
        return out
    import mlx.core as mx
    from mlx_lm.utils import load_model, save_model

    from pool.engines.dequantize import dequantize_for_cpu

    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    weights, config = load_model(model, lazy=True)
    weights, _ = dequantize_for_cpu(weights, config)
    mx.eval(weights.parameters())
    save_model(tmp, weights)
    config = json.loads((model / "config.json").read_text())
    for key in ("quantization", "quantization_config"):
        config.pop(key, None)
    config["torch_dtype"] = "float32"
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    for f in model.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name not in ("config.json", "model.safetensors.index.json"):
            shutil.copy2(f, tmp / f.name)
    tmp.rename(out)
    return out
