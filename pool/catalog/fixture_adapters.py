"""Random-weight adapters for tests and benchmarks: mlx-lm's own LoRA (or DoRA) layers put on a base
model folder (tuner.utils.linear_to_lora_layers, as `mlx_lm.lora` training does) and saved the way
its trainer saves them (adapters.safetensors + adapter_config.json naming the base). `strength`
scales the random lora_b: 0 changes nothing (lora_b starts at zero, as before training); a few
hundredths changes the greedy answer, so an adapter mixed up with another shows."""

from __future__ import annotations

import json
from pathlib import Path


def make_fixture_adapter(out_dir: Path, base: Path, *, rank: int = 8, layers: int = 4, scale: float = 20.0,
                         strength: float = 0.05, seed: int = 0, dora: bool = False) -> dict:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.tuner.utils import linear_to_lora_layers
    from mlx_lm.utils import load_model

    model, _ = load_model(Path(base), lazy=True)
    model.freeze()
    parameters = {"rank": rank, "scale": scale, "dropout": 0.0}
    mx.random.seed(seed)
    linear_to_lora_layers(model, layers, parameters, use_dora=dora)
    weights = {}
    for name, value in tree_flatten(model.trainable_parameters()):
        if name.endswith("lora_b"):
            value = (mx.random.normal(value.shape) * strength).astype(value.dtype)
        weights[name] = value
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out_dir / "adapters.safetensors"), weights)
    config = {"model": str(Path(base).resolve()), "fine_tune_type": "dora" if dora else "lora",
              "num_layers": layers, "lora_parameters": parameters}
    (out_dir / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return config
