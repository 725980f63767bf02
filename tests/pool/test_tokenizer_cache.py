"""A reload after an eviction reuses the model's tokenizer (building one stalls every other model's
stream: pool/engines/loading.py), folders with the same tokenizer files share one, and a tokenizer
built from other files (or for another model type, or other EOS ids) is never handed out."""

import json
import os
import shutil

import pytest

from pool.engines import loading


@pytest.fixture(autouse=True)
def empty_cache(monkeypatch):
    monkeypatch.setattr(loading, "_tokenizers", type(loading._tokenizers)())
    monkeypatch.setattr(loading, "_identities", {})


def _tokenizer_folder(src, dst, *, tokenizer_config=None, config=None):
    """A copy of the model folder's files but its weights, with some JSON fields changed."""
    dst.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, dst / f.name)
    for name, changes in (("tokenizer_config.json", tokenizer_config), ("config.json", config)):
        if changes:
            data = json.loads((dst / name).read_text())
            (dst / name).write_text(json.dumps({**data, **changes}))
    return dst


def test_a_reload_reuses_the_tokenizer_until_its_files_change(demo_model_dir, tmp_path):
    folder = _tokenizer_folder(demo_model_dir, tmp_path / "m")
    first = loading.tokenizer_for(folder, 2)
    assert loading.tokenizer_for(folder, 2) is first
    assert loading.tokenizer_for(folder, [2]) is not first            # other EOS ids: another wrapper
    config = folder / "tokenizer_config.json"
    os.utime(config, ns=(config.stat().st_atime_ns, config.stat().st_mtime_ns + 10**9))
    assert loading.tokenizer_for(folder, 2) is first                  # touched, the same bytes
    data = json.loads(config.read_text())
    config.write_text(json.dumps({**data, "model_max_length": 123}))
    rebuilt = loading.tokenizer_for(folder, 2)
    assert rebuilt is not first and rebuilt.encode("hello") == first.encode("hello")
    assert rebuilt.model_max_length == 123


@pytest.mark.parametrize("changes, shared", [
    ({}, True),                                                        # a copy: one tokenizer
    ({"config": {"hidden_size": 128, "num_hidden_layers": 2}}, True),  # another size of the model
    ({"tokenizer_config": {"model_max_length": 77}}, False),          # another tokenizer file
    ({"config": {"model_type": "qwen2"}}, False),                      # chooses the tokenizer's defaults
    ({"config": {"tokenizer_class": "PreTrainedTokenizerFast"}}, False),
])
def test_folders_share_a_tokenizer_only_when_it_is_built_from_the_same_things(
        demo_model_dir, tmp_path, changes, shared):
    a = _tokenizer_folder(demo_model_dir, tmp_path / "a")
    b = _tokenizer_folder(demo_model_dir, tmp_path / "b", **changes)
    assert (loading.tokenizer_for(a, 2) is loading.tokenizer_for(b, 2)) is shared


def test_only_the_most_recent_tokenizers_are_kept(demo_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(loading, "TOKENIZERS_KEPT", 2)
    a, b, c = (_tokenizer_folder(demo_model_dir, tmp_path / name, tokenizer_config={"model_max_length": n})
               for n, name in enumerate("abc", start=100))
    ta = loading.tokenizer_for(a, 2)
    loading.tokenizer_for(b, 2)
    assert loading.tokenizer_for(a, 2) is ta        # a is now the most recent
    tc = loading.tokenizer_for(c, 2)                  # b goes
    assert list(loading._tokenizers.values()) == [ta, tc]
    assert loading.tokenizer_for(a, 2) is ta


def test_forgetting_drops_every_kept_tokenizer(demo_model_dir, tmp_path):
    folder = _tokenizer_folder(demo_model_dir, tmp_path / "m")
    first = loading.tokenizer_for(folder, 2)
    loading.forget_tokenizers()
    assert not loading._tokenizers and not loading._identities
    assert loading.tokenizer_for(folder, 2) is not first
