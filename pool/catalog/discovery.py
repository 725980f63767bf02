"""Find model folders: a folder with config.json and *.safetensors.

Layouts: flat `dir/<name>/`, organised `dir/<org>/<name>/` (id `<name>`), and the Hugging Face
cache `dir/models--Org--Name/snapshots/<rev>/`, resolved through `refs/main` (id `Org/Name`).
An adapter folder (adapter_config.json, catalog/adapters.py) is the model `<base id>:<folder name>` when
its base is found, else skipped with a warning. The first folder found for an id wins. A folder
whose id is not a usable name (model_ids.id_problem: empty, `.`, `..`, control characters) is
skipped with a warning: no client could name it, and paths derived from ids must stay sane.
Each folder is of one kind of model (pool/catalog/kinds.py: a chat model or an embedding model).
"""

from __future__ import annotations

import json
import logging
import math
import struct
from dataclasses import dataclass
from pathlib import Path

from .adapters import ADAPTER_WEIGHTS, adapter_problem, find_base, is_adapter_folder
from .kinds import ADAPTER, CHAT, Kind, folder_kind
from .model_ids import id_problem

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelFolder:
    id: str
    path: Path
    size_bytes: int
    dense_bytes: int | None = None   # float32 size once dequantized; None when not quantized
    kind: Kind = CHAT
    base: str | None = None          # an adapter's base model id
    base_path: Path | None = None    # ... and its folder (what the adapter's card reads)


def is_model_folder(path: Path) -> bool:
    return ((path / "config.json").is_file() and not (path / "adapter_config.json").exists()
            and any(path.glob("*.safetensors")))


def weights_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.glob("*.safetensors"))  # stat follows HF's blob links


def _safetensors_header(file: Path) -> dict:
    with file.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        if length > file.stat().st_size - 8:    # a garbage header: not a length to allocate
            raise ValueError(f"{file.name}: its header length {length} exceeds the file")
        return json.loads(f.read(length))


def dense_size(path: Path) -> int | None:
    """Bytes of the folder's weights dequantized, every float tensor as float32 (what
    pool.engines.dequantize loads), from config.json's `quantization` and the safetensors headers,
    without reading a weight. None when the folder is not quantized or cannot be read."""
    try:
        config = json.loads((path / "config.json").read_text())
        quant = config.get("quantization") if isinstance(config, dict) else None
        if not isinstance(quant, dict):
            return None
        tensors = {}
        for file in sorted(path.glob("*.safetensors")):
            tensors.update(_safetensors_header(file))
    except (OSError, ValueError, struct.error) as e:
        log.warning("cannot size %s dequantized: %s", path, e)
        return None
    tensors.pop("__metadata__", None)
    total = 0
    for name, info in tensors.items():
        module, _, kind = name.rpartition(".")
        shape = info["shape"]
        if f"{module}.scales" in tensors:
            if kind in ("scales", "biases"):
                continue   # folded into the dense weight
            if kind == "weight":
                layer = quant.get(module)
                bits = (layer if isinstance(layer, dict) else quant).get("bits", 4)
                total += 4 * math.prod(shape[:-1]) * shape[-1] * 32 // bits   # uint32 words -> elements
                continue
        itemsize = 4 if info["dtype"] in ("F16", "BF16", "F32", "F64") else _ITEMSIZE.get(info["dtype"], 4)
        total += itemsize * math.prod(shape)
    return total


_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2,
             "I32": 4, "U32": 4, "I64": 8, "U64": 8}


def _hf_snapshot(repo_dir: Path) -> Path | None:
    snapshots = repo_dir / "snapshots"
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        candidate = snapshots / ref.read_text().strip()
        if candidate.is_dir():
            return candidate
    revisions = sorted((p for p in snapshots.glob("*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
    return revisions[-1] if revisions else None


def _candidates(root: Path):
    for child in sorted(root.iterdir()):
        if child.name.startswith(".") or not child.is_dir():
            continue
        if child.name.startswith("models--"):
            snapshot = _hf_snapshot(child)
            if snapshot is not None:
                yield "/".join(child.name.removeprefix("models--").split("--", 1)), snapshot
        elif (child / "config.json").is_file() or is_adapter_folder(child):
            yield child.name, child
        else:
            for grandchild in sorted(child.iterdir()):
                if grandchild.is_dir() and not grandchild.name.startswith("."):
                    yield grandchild.name, grandchild


def discover(dirs: list[Path]) -> dict[str, ModelFolder]:
    found: dict[str, ModelFolder] = {}
    adapters: list[tuple[str, Path]] = []
    for root in dirs:
        if not root.is_dir():
            continue
        for model_id, path in _candidates(root):
            if is_adapter_folder(path):
                adapters.append((model_id, path))
                continue
            if not is_model_folder(path):
                continue
            if _usable(model_id, path, found):
                found[model_id] = ModelFolder(model_id, path, weights_size(path), dense_size(path), folder_kind(path))
    for name, path in adapters:       # once every base is known, wherever it lives
        _add_adapter(name, path, found)
    return found


def _add_adapter(name: str, path: Path, found: dict[str, ModelFolder]) -> None:
    if (problem := adapter_problem(path)) is not None:
        log.warning("skipping adapter folder %s: %s", path, problem)
        return
    bases = {model_id: folder.path for model_id, folder in found.items() if folder.kind == CHAT}
    base = find_base(path, bases)
    if base is None:
        log.warning("skipping adapter folder %s: its base model is not among the chat models found", path)
        return
    model_id = f"{base}:{name}"
    if _usable(model_id, path, found):
        found[model_id] = ModelFolder(model_id, path, (path / ADAPTER_WEIGHTS).stat().st_size, None, ADAPTER,
                                      base=base, base_path=found[base].path)


def _usable(model_id: str, path: Path, found: dict[str, ModelFolder]) -> bool:
    if (problem := id_problem(model_id)) is not None:
        log.warning("skipping model folder %s: its id %r is not usable (%s)", path, model_id, problem)
        return False
    if model_id in found:
        log.warning("model id %r found twice; keeping %s, ignoring %s", model_id, found[model_id].path, path)
        return False
    return True
