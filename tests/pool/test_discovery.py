"""Model discovery over the three folder layouts."""

from pool.catalog.discovery import discover


def model(folder, weights=b"x" * 10):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(weights)
    return folder


def test_flat_organised_and_hf_cache(tmp_path):
    model(tmp_path / "flat")
    model(tmp_path / "org" / "organised", b"x" * 30)
    repo = tmp_path / "models--Org--Name"
    model(repo / "snapshots" / "abc123", b"x" * 7)
    model(repo / "snapshots" / "old")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123\n")
    found = discover([tmp_path])
    assert set(found) == {"flat", "organised", "Org/Name"}
    assert found["organised"].size_bytes == 30
    assert found["Org/Name"].path == repo / "snapshots" / "abc123"
    assert found["Org/Name"].size_bytes == 7


def test_skips_adapters_hidden_and_incomplete(tmp_path):
    (model(tmp_path / "adapter") / "adapter_config.json").write_text("{}")
    model(tmp_path / ".hidden")
    (tmp_path / "no-weights").mkdir()
    (tmp_path / "no-weights" / "config.json").write_text("{}")
    assert discover([tmp_path]) == {}


def test_first_folder_wins_and_missing_dirs_are_fine(tmp_path):
    model(tmp_path / "a" / "same", b"1")
    model(tmp_path / "b" / "same", b"22")
    found = discover([tmp_path / "missing", tmp_path / "a", tmp_path / "b"])
    assert found["same"].size_bytes == 1
