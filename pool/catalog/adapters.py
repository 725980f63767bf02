"""Adapter folders: mlx-lm's LoRA and DoRA output (adapter_config.json + adapters.safetensors), each
served as the model `<base id>:<folder name>` over a base model found in the model folders.

The base is what adapter_config.json's `model` names (mlx-lm writes the path or hub id it trained
on): a path to a discovered folder (absolute, or relative to the adapter's folder), else a model id,
else the last part of a hub id (`mlx-community/SmolLM2-135M-Instruct` names a folder
`smollm2-135m-instruct`), ignoring case. A whole fine-tuned model (`fine_tune_type: full`) is a model
folder of its own, not an adapter; PEFT's adapters (adapter_model.safetensors) are not read by
mlx-lm and are skipped with a warning."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from .kinds import read_json

ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapters.safetensors"
ADAPTER_TYPES = ("lora", "dora")


def is_adapter_folder(path: Path) -> bool:
    return (path / ADAPTER_CONFIG).is_file()


def adapter_problem(path: Path) -> str | None:
    """Why the adapter folder at `path` cannot be served, or None."""
    config = read_json(path / ADAPTER_CONFIG)
    if not (path / ADAPTER_WEIGHTS).is_file():
        if (path / "adapter_model.safetensors").is_file():
            return "it is a PEFT adapter, which mlx-lm does not read (convert it with mlx-lm's tools)"
        return f"it has no {ADAPTER_WEIGHTS}"
    kind = config.get("fine_tune_type", "lora")
    if kind not in ADAPTER_TYPES:
        return f"its fine_tune_type {kind!r} is not an adapter over a base ({', '.join(ADAPTER_TYPES)})"
    parameters = config.get("lora_parameters")
    if not isinstance(parameters, dict) or not {"rank", "scale"} <= parameters.keys():
        return "its lora_parameters lack rank or scale"
    if not isinstance(config.get("num_layers"), int):
        return "its num_layers is not a number"
    if not isinstance(config.get("model"), str) or not config["model"]:
        return "its adapter_config.json names no base model (`model`)"
    return None


def find_base(path: Path, models: Mapping[str, Path]) -> str | None:
    """The id, among discovered models (id -> folder), of the base the adapter at `path` names."""
    named = str(read_json(path / ADAPTER_CONFIG).get("model", ""))
    by_folder = {folder.resolve(): model_id for model_id, folder in models.items()}
    try:   # an absolute path as it is, a relative one from the adapter's folder (never the process's cwd)
        found = by_folder.get((path / named).resolve())
    except (OSError, ValueError, RuntimeError):
        found = None
    if found is not None:
        return found
    lowered = {model_id.lower(): model_id for model_id in models}
    for name in (named, named.rstrip("/").rsplit("/", 1)[-1]):
        if name in models:
            return name
        if name.lower() in lowered:
            return lowered[name.lower()]
    return None
