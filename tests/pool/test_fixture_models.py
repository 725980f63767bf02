"""Random-weight llama fixtures: their size on disk, in MLX memory, and that they generate."""

import gc
import json
from io import StringIO

import pytest

from pool.catalog.fixture_models import make_fixture_model, plan, planned_bytes

VOCAB = 49152  # SmolLM2's tokenizer


def weight_bytes(folder):
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


@pytest.mark.parametrize("size_mb", [5, 10, 13, 20, 30, 200, 1000])
def test_plan_lands_on_the_target_size(size_mb):
    shape = plan(size_mb * 1e6, VOCAB)
    assert planned_bytes(shape, VOCAB) == pytest.approx(size_mb * 1e6, rel=0.005)
    assert 1 <= shape["num_hidden_layers"] <= 24
    assert shape["num_attention_heads"] * shape["head_dim"] == shape["hidden_size"]


def test_plan_refuses_a_target_below_the_embedding():
    with pytest.raises(ValueError, match="too small"):
        plan(2e6, VOCAB)  # 49152 tokens x 16 x 4 bytes is already 3.1 MB


@pytest.fixture(scope="module")
def fixture_20mb(smollm2_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("fixtures") / "fixture-20mb"
    make_fixture_model(out, 20, tokenizer_from=smollm2_dir)
    return out


def test_fixture_folder_is_complete_and_about_20mb(fixture_20mb):
    assert weight_bytes(fixture_20mb) == pytest.approx(20e6, rel=0.03)
    names = {p.name for p in fixture_20mb.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= names
    assert [p.name for p in fixture_20mb.parent.iterdir()] == ["fixture-20mb"]  # no temp folder left
    cfg = json.loads((fixture_20mb / "config.json").read_text())
    assert (cfg["model_type"], cfg["vocab_size"], cfg["eos_token_id"]) == ("llama", VOCAB, 2)


def test_fixture_loads_at_its_file_size_and_generates(fixture_20mb):
    import mlx.core as mx
    import mlx_lm
    from mlx_lm.generate import generate_step

    gc.collect()
    mx.clear_cache()
    before = mx.get_active_memory()
    model, tokenizer = mlx_lm.load(str(fixture_20mb))
    grown = mx.get_active_memory() - before
    assert grown == pytest.approx(weight_bytes(fixture_20mb), rel=0.02)

    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    tokens = [int(t) for t, _ in generate_step(mx.array(prompt), model, max_tokens=8)]
    assert len(tokens) == 8 and all(0 <= t < VOCAB for t in tokens)
    assert isinstance(tokenizer.decode(tokens), str)


def test_small_fixture_is_reproducible(smollm2_dir, tmp_path):
    for name in ("a", "b"):
        make_fixture_model(tmp_path / name, 5, tokenizer_from=smollm2_dir, seed=7)
    assert weight_bytes(tmp_path / "a") == pytest.approx(5e6, rel=0.03)
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()


def test_make_fixture_model_command(omlx_home, smollm2_dir):
    from django.core.management import CommandError, call_command

    out = StringIO()
    call_command("make_fixture_model", "tiny", "--size-mb", "6", "--tokenizer-from", str(smollm2_dir), stdout=out)
    folder = omlx_home / "models" / "tiny"
    assert weight_bytes(folder) == pytest.approx(6e6, rel=0.03)
    assert str(folder) in out.getvalue()

    call_command("make_fixture_model", "tiny-q4", "--size-mb", "8", "--bits", "4",
                 "--tokenizer-from", str(smollm2_dir), stdout=out)
    folder = omlx_home / "models" / "tiny-q4"
    assert json.loads((folder / "config.json").read_text())["quantization"]["bits"] == 4
    assert weight_bytes(folder) == pytest.approx(8e6, rel=0.03)

    # another architecture, as its real checkpoints ship (the text model under text_config); tiny by default
    call_command("make_fixture_model", "hybrid", "--arch", "qwen3_5", "--tokenizer-from", str(smollm2_dir), stdout=out)
    cfg = json.loads((omlx_home / "models" / "hybrid" / "config.json").read_text())
    assert cfg["model_type"] == "qwen3_5" and cfg["text_config"]["model_type"] == "qwen3_5_text"
    assert "qwen3_5: hidden_size=64" in out.getvalue()
    with pytest.raises(CommandError):
        call_command("make_fixture_model", "nope", "--arch", "no-such-arch", "--tokenizer-from", str(smollm2_dir))

    with pytest.raises(CommandError, match="prepare_demo"):  # default tokenizer: the demo model, absent here
        call_command("make_fixture_model", "other", "--size-mb", "6")


# gpt_oss in float32: MLX's CPU backend gathers experts' matrices in float32 only (GatherMM)
@pytest.mark.parametrize("arch, size_mb, dtype, bits", [
    ("gemma3", 30, "bfloat16", None), ("qwen3_5", 40, "float32", None), ("deepseek_v3", 30, "bfloat16", 4),
    ("gpt_oss", 30, "float32", None)])
def test_other_architectures_land_on_their_target_size_and_generate(smollm2_dir, tmp_path, arch, size_mb, dtype, bits):
    import mlx.core as mx
    import mlx_lm
    from mlx_lm.generate import generate_step

    make_fixture_model(tmp_path / arch, size_mb, tokenizer_from=smollm2_dir, dtype=dtype, bits=bits, arch=arch)
    assert weight_bytes(tmp_path / arch) == pytest.approx(size_mb * 1e6, rel=0.05)
    model, tokenizer = mlx_lm.load(str(tmp_path / arch))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    tokens = [int(t) for t, _ in generate_step(mx.array(prompt), model, max_tokens=4)]
    assert len(tokens) == 4 and all(0 <= t < VOCAB for t in tokens)


@pytest.mark.parametrize("size_mb,itemsize,bits", [(30, 4, 4), (35, 2, 4), (100, 4, 8), (1000, 2, 4), (1500, 2, 4)])
def test_quantized_plan_lands_on_the_target_with_group_aligned_widths(size_mb, itemsize, bits):
    shape = plan(size_mb * 1e6, VOCAB, itemsize, bits=bits)
    assert planned_bytes(shape, VOCAB, itemsize, bits=bits) == pytest.approx(size_mb * 1e6, rel=0.02)
    assert shape["hidden_size"] % 64 == shape["intermediate_size"] % 64 == 0 and shape["head_dim"] == 64
    assert shape["num_attention_heads"] * shape["head_dim"] == shape["hidden_size"]


def test_4bit_fixture_quantizes_every_linear_layer_and_is_its_target_size(smollm2_dir, tmp_path):
    import mlx.nn as nn
    import mlx_lm

    cfg = make_fixture_model(tmp_path / "q4", 30, tokenizer_from=smollm2_dir, bits=4)
    assert cfg["quantization"] == {"group_size": 64, "bits": 4, "mode": "affine"}
    assert weight_bytes(tmp_path / "q4") == pytest.approx(30e6, rel=0.03)
    model, _ = mlx_lm.load(str(tmp_path / "q4"))
    modules = [m for _, m in model.named_modules()]
    # mlx's QuantizedLinear and QuantizedEmbedding are not subclasses of Linear and Embedding
    assert [type(m).__name__ for m in modules if isinstance(m, (nn.Linear, nn.Embedding))] == []
    assert sum(isinstance(m, nn.QuantizedLinear) for m in modules) == 7 * cfg["num_hidden_layers"]
