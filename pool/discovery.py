"""Find model folders: a folder with config.json and *.safetensors.

Layouts: flat `dir/<name>/`, organised `dir/<org>/<name>/` (id `<name>`), and the Hugging Face
cache `dir/models--Org--Name/snapshots/<rev>/`, resolved through `refs/main` (id `Org/Name`).
Adapter folders (adapter_config.json) are skipped. The first folder found for an id wins.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelFolder:
    id: str
    path: Path
    size_bytes: int


def is_model_folder(path: Path) -> bool:
    return ((path / "config.json").is_file() and not (path / "adapter_config.json").exists()
            and any(path.glob("*.safetensors")))


def weights_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.glob("*.safetensors"))  # stat follows HF's blob links


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
        elif (child / "config.json").is_file():
            yield child.name, child
        else:
            for grandchild in sorted(child.iterdir()):
                if grandchild.is_dir() and not grandchild.name.startswith("."):
                    yield grandchild.name, grandchild


def discover(dirs: list[Path]) -> dict[str, ModelFolder]:
    found: dict[str, ModelFolder] = {}
    for root in dirs:
        if not root.is_dir():
            continue
        for model_id, path in _candidates(root):
            if not is_model_folder(path):
                continue
            if model_id in found:
                log.warning("model id %r found twice; keeping %s, ignoring %s", model_id, found[model_id].path, path)
                continue
            found[model_id] = ModelFolder(model_id, path, weights_size(path))
    return found
