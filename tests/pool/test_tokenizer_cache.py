"""A reload after an eviction reuses the model's tokenizer (building one stalls every other model's
stream: pool/engines/loading.py), but never one built from files that have changed since."""

import os
import shutil

from pool.engines import loading


def _tokenizer_folder(src, dst):
    dst.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, dst / f.name)
    return dst


def test_a_reload_reuses_the_tokenizer_until_its_files_change(demo_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(loading, "_tokenizers", type(loading._tokenizers)())
    folder = _tokenizer_folder(demo_model_dir, tmp_path / "m")
    first = loading.tokenizer_for(folder, 2)
    assert loading.tokenizer_for(folder, 2) is first
    assert loading.tokenizer_for(folder, [2]) is not first            # other EOS ids: another wrapper
    config = folder / "tokenizer_config.json"
    os.utime(config, ns=(config.stat().st_atime_ns, config.stat().st_mtime_ns + 10**9))
    rebuilt = loading.tokenizer_for(folder, 2)
    assert rebuilt is not first and rebuilt.encode("hello") == first.encode("hello")


def test_only_the_most_recent_folders_are_kept(demo_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(loading, "_tokenizers", type(loading._tokenizers)())
    monkeypatch.setattr(loading, "TOKENIZERS_KEPT", 2)
    a, b, c = (_tokenizer_folder(demo_model_dir, tmp_path / name) for name in "abc")
    ta = loading.tokenizer_for(a, 2)
    loading.tokenizer_for(b, 2)
    assert loading.tokenizer_for(a, 2) is ta        # a is now the most recent
    loading.tokenizer_for(c, 2)                       # b goes
    assert len(loading._tokenizers) == 2
    assert loading.tokenizer_for(a, 2) is ta
    assert [key[0] for key in loading._tokenizers] == [str(c.resolve()), str(a.resolve())]
