"""Adapter folders in discovery (pool/catalog/adapters.py), one row per rule: the id is `base:name`;
the base is named by absolute path, by a path relative to the adapter's folder, by id, or by a hub
id (whole, or its last part) ignoring case; an adapter that cannot be served is left out, with a
warning saying why. Each row can fail alone: a found row's base is reachable by its rule only, and
a skipped row serves its healthy twin and expects its own reason in the warning."""

from __future__ import annotations

import json
import logging
import struct
from pathlib import Path
from typing import Callable

import pytest

from pool.catalog.discovery import discover
from pool.catalog.kinds import ADAPTER, CHAT, EMBEDDINGS

LORA = {"rank": 8, "scale": 20.0, "dropout": 0.0}


def tensors_file(file: Path, name: str = "w", count: int = 4) -> None:
    """A real safetensors file of one float32 tensor (header length, JSON header, data)."""
    header = json.dumps({name: {"dtype": "F32", "shape": [count], "data_offsets": [0, 4 * count]}}).encode()
    file.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * (4 * count))


def model(folder: Path, *, embedding: bool = False) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    tensors_file(folder / "model.safetensors")
    if embedding:
        (folder / "modules.json").write_text("[]")    # sentence-transformers' layout
    return folder


def peft(folder: Path, base: str) -> Path:
    """Hugging Face PEFT's layout, which mlx-lm does not read."""
    folder.mkdir(parents=True)
    config = {"peft_type": "LORA", "base_model_name_or_path": base, "r": 8, "lora_alpha": 16,
              "target_modules": ["q_proj", "v_proj"]}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    tensors_file(folder / "adapter_model.safetensors", "base_model.model.layers.0.q_proj.lora_A.weight", 16)
    return folder


def adapter(folder: Path, base: str, *, weights: str = "adapters.safetensors", **config) -> Path:
    folder.mkdir(parents=True)
    full = {"model": base, "fine_tune_type": "lora", "num_layers": 4, "lora_parameters": dict(LORA), **config}
    (folder / "adapter_config.json").write_text(json.dumps({k: v for k, v in full.items() if v is not None}))
    tensors_file(folder / weights, "model.layers.0.self_attn.q_proj.lora_a", count=16)
    return folder


# (rule, build(root): the models and one adapter `pirate`, the adapters expected {id: base id}). Each
# row's base is found by its rule alone: a hub cache snapshot's id is not its folder's name, and a
# symlinked folder's id is not its target's; the other models are what a looser rule would pick.
Build = Callable[[Path], None]


def hub_cache(root: Path, repo: str = "Org/Base") -> Path:
    folder = root / f"models--{repo.replace('/', '--')}"
    snapshot = model(folder / "snapshots" / "abc")
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("abc")
    return snapshot


def by_absolute_path(root: Path) -> None:
    adapter(root / "pirate", str(hub_cache(root).resolve()))


def by_absolute_path_of_a_link(root: Path) -> None:
    target = model(root.parent / "store" / "weights-v3")      # where it was trained, linked in as `base`
    (root / "base").symlink_to(target, target_is_directory=True)
    adapter(root / "pirate", str(target))


def by_relative_path(root: Path) -> None:
    hub_cache(root)
    adapter(root / "tuned" / "pirate", "../../models--Org--Base/snapshots/abc")   # from the adapter's folder


def by_id(root: Path) -> None:
    model(root / "Base")
    model(root / "base")         # the same name but for case: the exact id wins
    adapter(root / "pirate", "Base")


def by_hub_id(root: Path) -> None:
    hub_cache(root)
    model(root / "other")
    adapter(root / "pirate", "org/BASE")


def by_hub_id_last_part(root: Path) -> None:
    model(root / "base")
    model(root / "some-org")
    adapter(root / "pirate", "some-org/BASE")            # the hub id's last part, case ignored


def by_hub_id_with_slash(root: Path) -> None:
    model(root / "base")
    adapter(root / "pirate", "some-org/Base/")


def in_an_org_folder(root: Path) -> None:
    model(root / "base")
    adapter(root / "team" / "pirate", "base")           # dir/org/adapter/, as models are organised


FOUND: list[tuple[str, Build, dict[str, str]]] = [
    ("absolute path", by_absolute_path, {"Org/Base:pirate": "Org/Base"}),
    ("absolute path of a linked folder", by_absolute_path_of_a_link, {"base:pirate": "base"}),
    ("path relative to the adapter folder", by_relative_path, {"Org/Base:pirate": "Org/Base"}),
    ("model id", by_id, {"Base:pirate": "Base"}),
    ("hub id, case ignored", by_hub_id, {"Org/Base:pirate": "Org/Base"}),
    ("hub id's last part, case ignored", by_hub_id_last_part, {"base:pirate": "base"}),
    ("hub id with a trailing slash", by_hub_id_with_slash, {"base:pirate": "base"}),
    ("org-folder layout", in_an_org_folder, {"base:pirate": "base"}),
]


@pytest.mark.parametrize("rule, build, expected", FOUND, ids=[row[0] for row in FOUND])
def test_an_adapter_is_found_over_its_base(tmp_path, rule, build, expected):
    root = tmp_path / "models"
    root.mkdir()
    build(root)
    found = discover([root])
    adapters = {model_id: folder.base for model_id, folder in found.items() if folder.kind == ADAPTER}
    assert adapters == expected, rule
    for model_id, base in expected.items():
        folder = found[model_id]
        assert found[base].kind == CHAT and folder.base_path == found[base].path
        assert folder.path.name == "pirate" and model_id == f"{base}:pirate"
        assert folder.size_bytes == (folder.path / "adapters.safetensors").stat().st_size


def test_the_adapter_is_named_by_its_folder_and_its_base_id(tmp_path):
    """`<base id>:<folder name>`, the base's id whatever the config calls it (a hub cache id here)."""
    root = tmp_path / "models"
    snapshot = hub_cache(root)
    adapter(root / "Pirate-v2", "org/base")
    found = discover([root])
    assert found["Org/Base:Pirate-v2"].base == "Org/Base"
    assert found["Org/Base:Pirate-v2"].base_path == snapshot


def test_a_relative_path_is_read_from_the_adapter_folder_not_the_working_directory(tmp_path, monkeypatch):
    """A relative `model` is read from the adapter's folder, wherever the server runs: `../abc` here is
    models/abc, even from a directory where `../abc` is another model (a hub cache snapshot)."""
    root, elsewhere = tmp_path / "models", tmp_path / "elsewhere"
    model(root / "abc")
    adapter(root / "pirate", "../abc")
    snapshot = hub_cache(elsewhere, "Org/Other")
    monkeypatch.chdir(snapshot)                 # from here, ../abc is Org/Other's snapshot
    found = discover([root, elsewhere])
    assert found["Org/Other"].path == snapshot
    assert {model_id for model_id, folder in found.items() if folder.kind == ADAPTER} == {"abc:pirate"}


def test_an_adapter_over_a_model_in_another_folder(tmp_path):
    """Every base is known before adapters are matched, whichever folder (or order) they come in."""
    model(tmp_path / "b" / "base")
    adapter(tmp_path / "a" / "pirate", "base")
    assert discover([tmp_path / "a", tmp_path / "b"])["base:pirate"].base == "base"


# (rule, build(root) -> one adapter named pirate over root/base with one defect, the warning's words)
SKIPPED: list[tuple[str, Build, str]] = [
    ("base not found", lambda root: adapter(root / "pirate", "org/missing"), "base model is not among"),
    ("base path not found", lambda root: adapter(root / "pirate", str(root / "gone")), "base model is not among"),
    ("PEFT layout", lambda root: peft(root / "pirate", "base"), "PEFT"),
    ("PEFT weights beside mlx-lm's config", lambda root: adapter(root / "pirate", "base",
                                                                 weights="adapter_model.safetensors"), "PEFT"),
    ("no weights", lambda root: adapter(root / "pirate", "base", weights="other.safetensors"),
     "no adapters.safetensors"),
    ("fine_tune_type full", lambda root: adapter(root / "pirate", "base", fine_tune_type="full"), "'full'"),
    ("rank missing", lambda root: adapter(root / "pirate", "base", lora_parameters={"scale": 20.0}),
     "rank or scale"),
    ("scale missing", lambda root: adapter(root / "pirate", "base", lora_parameters={"rank": 8, "alpha": 16}),
     "rank or scale"),
    ("lora_parameters missing", lambda root: adapter(root / "pirate", "base", lora_parameters=None),
     "rank or scale"),
    ("num_layers missing", lambda root: adapter(root / "pirate", "base", num_layers=None), "num_layers"),
    ("no base named", lambda root: adapter(root / "pirate", ""), "names no base"),
    ("base is an embedding model", lambda root: adapter(root / "pirate", "minilm"), "base model is not among"),
    ("base is an embedding model, by path", lambda root: adapter(root / "pirate", str(root / "minilm")),
     "base model is not among"),
    ("base is another adapter", lambda root: adapter(root / "pirate", "base:healthy"), "base model is not among"),
]


@pytest.mark.parametrize("rule, build, reason", SKIPPED, ids=[row[0] for row in SKIPPED])
def test_an_adapter_that_cannot_be_served_is_left_out_with_a_warning(tmp_path, caplog, rule, build, reason):
    root = tmp_path / "models"
    model(root / "base")
    model(root / "minilm", embedding=True)
    adapter(root / "healthy", "base")           # its healthy twin: the rule leaves out only the defect
    build(root)
    with caplog.at_level(logging.WARNING, logger="pool.catalog.discovery"):
        found = discover([root])
    assert found["minilm"].kind == EMBEDDINGS
    assert {model_id for model_id, folder in found.items() if folder.kind == ADAPTER} == {"base:healthy"}, rule
    warnings = [r.getMessage() for r in caplog.records if "pirate" in r.getMessage()]
    assert len(warnings) == 1 and reason in warnings[0], warnings
