"""The CPU path: the BLAS omlx_site.blas loads before MLX, OMLX_BLAS and OMLX_CPU_DEQUANTIZE, the pool's
size estimate for a model it will dequantize, and the dequantized demo model's greedy answer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import omlx_site.blas
from pool.backend import cpu_backend
from pool.catalog.discovery import dense_size, discover, weights_size
from pool.conf import ImproperlyConfigured, get_settings, read_setting, reload_settings
from tests.conftest import DEMO, ROOT, as_the_pool_loads
from tests.fakes import FakeProbe, Memory

needs_cpu = pytest.mark.skipif(not cpu_backend(), reason="the CPU backend only")
PROMPT = [{"role": "user", "content": "What is the capital of France?"}]


def loaded_blas() -> str:
    """The file omlx_site.blas loaded in this process (tests/conftest.py sets the process up before MLX too)."""
    path = (omlx_site.blas.state or {}).get("path")
    if not path:
        pytest.skip(f"no optimized BLAS on this machine: {omlx_site.blas.state}")
    return os.path.realpath(path) if os.path.isabs(path) else Path(path).name.split(".so")[0]


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full_env, capture_output=True, text=True,
                          check=True, timeout=120)


MAPS_AFTER_MLX = ("from omlx_site.process import setup_process; setup_process(); import mlx.core as mx; "
                  "mx.eval(mx.ones((4, 4)) @ mx.ones((4, 4))); print(open('/proc/self/maps').read())")


# --- the BLAS preload -------------------------------------------------------------------------

@needs_cpu
def test_a_served_process_has_the_blas_loaded(start_server):
    library = loaded_blas()
    server = start_server()
    maps = Path(f"/proc/{server.proc.pid}/maps").read_text()
    assert "libmlx" in maps and library in maps


@needs_cpu
def test_setting_up_before_mlx_loads_it_and_off_does_not():
    library = loaded_blas()
    assert library in run_python(MAPS_AFTER_MLX).stdout
    assert library not in run_python(MAPS_AFTER_MLX, OMLX_BLAS="off").stdout


@needs_cpu
def test_a_missing_library_logs_once_and_mlx_runs_on_the_bundled_blas():
    code = """
import os
os.environ["OMLX_BLAS"] = "off"
import omlx_site.blas as b
b.state = None
b.CANDIDATES["openblas"] = lambda: [["/nonexistent/libopenblas.so.0"]]
os.environ["OMLX_BLAS"] = "openblas"
print(b.preload()["blas"], b.preload()["blas"])
import mlx.core as mx
print(mx.sum(mx.ones((64, 64)) @ mx.ones((64, 64))).item())
"""
    done = run_python(code)
    assert done.stdout.split() == ["bundled", "bundled", "262144.0"]
    assert done.stderr.count("no optimized BLAS found") == 1


def test_mlx_imported_first_is_too_late():
    done = run_python("import mlx.core, omlx_site.blas as b; b.preload(); print(b.state['reason'])")
    expected = "mlx was imported first" if cpu_backend() else "not the CPU backend"
    assert done.stdout.strip() == expected


# --- settings --------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "name, raw, expected",
    [
        ("OMLX_CPU_DEQUANTIZE", None, "auto"),
        ("OMLX_CPU_DEQUANTIZE", "auto", "auto"),
        ("OMLX_CPU_DEQUANTIZE", "ON", "on"),
        ("OMLX_CPU_DEQUANTIZE", " off ", "off"),
        ("OMLX_CPU_DEQUANTIZE", "yes", ImproperlyConfigured),
        ("OMLX_CPU_DEQUANTIZE", "", ImproperlyConfigured),
        ("OMLX_BLAS", None, "auto"),
        ("OMLX_BLAS", "openblas", "openblas"),
        ("OMLX_BLAS", "MKL", "mkl"),
        ("OMLX_BLAS", "off", "off"),
        ("OMLX_BLAS", "accelerate", ImproperlyConfigured),
        # the CPU backend's attention makes one long chunk slower than several short ones
        ("OMLX_PREFILL_STEP_ALONE", None, 256 if cpu_backend() else 2048),
        ("OMLX_PREFILL_STEP_ALONE", " Auto ", 256 if cpu_backend() else 2048),
        ("OMLX_PREFILL_STEP_ALONE", "1024", 1024),
        ("OMLX_PREFILL_STEP_ALONE", "0", ImproperlyConfigured),
        ("OMLX_PREFILL_STEP_ALONE", "long", ImproperlyConfigured),
    ],
)
def test_parsing(monkeypatch, name, raw, expected):
    if raw is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, raw)
    if expected is ImproperlyConfigured:
        with pytest.raises(ImproperlyConfigured, match=name):
            read_setting(name)
    else:
        assert read_setting(name) == expected


# --- the size the pool plans with -------------------------------------------------------------

def pool_over(models: Path, **values):
    from pool.host.engine_pool import EnginePool

    conf = get_settings().with_values(model_dirs=(models,), **values)
    engines = EnginePool(conf, FakeProbe(Memory(total=24 * 2**30)))
    engines.rediscover()
    return engines.entries[DEMO].size_bytes


@pytest.fixture
def demo_models(tmp_path, demo_model_dir) -> Path:
    (tmp_path / DEMO).symlink_to(demo_model_dir, target_is_directory=True)
    return tmp_path


@needs_cpu
@pytest.mark.parametrize(
    "mode, budget, dense",
    [("on", "off", True), ("on", 100 * 10**6, True), ("auto", "auto", True), ("auto", "off", True),
     ("auto", 600 * 10**6, True), ("auto", 500 * 10**6, False), ("off", "auto", False)],
)
def test_the_estimate_is_the_dense_size_when_the_pool_will_dequantize(demo_models, demo_model_dir, mode, budget,
                                                                       dense):
    expected = dense_size(demo_model_dir) if dense else weights_size(demo_model_dir)
    assert pool_over(demo_models, cpu_dequantize=mode, max_model_memory=budget) == expected


def test_dense_size_reads_headers_only(demo_model_dir, tmp_path):
    # 4-bit layers, an 8-bit embedding (a per-layer override), float32 norms: 538 MB for 115 MB of files
    assert dense_size(demo_model_dir) == 538_060_032
    assert discover([demo_model_dir.parent])[DEMO].dense_bytes == 538_060_032
    (tmp_path / "dense").mkdir()
    (tmp_path / "dense" / "config.json").write_text("{}")
    (tmp_path / "dense" / "model.safetensors").write_bytes(b"not read")
    assert dense_size(tmp_path / "dense") is None


# --- the dequantized model ---------------------------------------------------------------------

def load(path: Path, mode: str):
    from pool.engines.loading import load_weights

    old = os.environ.get("OMLX_CPU_DEQUANTIZE")
    os.environ["OMLX_CPU_DEQUANTIZE"] = mode
    try:
        reload_settings()
        return load_weights(path, dequantize=as_the_pool_loads(path).dequantize)
    finally:
        if old is None:
            os.environ.pop("OMLX_CPU_DEQUANTIZE")
        else:
            os.environ["OMLX_CPU_DEQUANTIZE"] = old
        reload_settings()


def greedy(model, tokenizer, n: int) -> tuple[list[int], list[float]]:
    """n greedy tokens for PROMPT (end of turn included), and the gap between the top two logits at each step."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    x = mx.array(tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True))[None]
    tokens, gaps = [], []
    for _ in range(n):
        logits = model(x, cache=cache)[0, -1].astype(mx.float32)
        top = mx.sort(logits)[-2:].tolist()
        tokens.append(int(mx.argmax(logits).item()))
        gaps.append(top[1] - top[0])
        x = mx.array([[tokens[-1]]])   # on past the end of the answer: more tokens to compare
    return tokens, gaps


@needs_cpu
def test_the_dequantized_demo_answers_as_the_quantized_one(demo_model_dir):
    import mlx.core as mx
    from mlx.utils import tree_flatten

    quantized, tokenizer, config = load(demo_model_dir, "off")
    q_tokens, q_gaps = greedy(quantized, tokenizer, 24)
    del quantized
    dense, tokenizer, config = load(demo_model_dir, "on")
    assert config["dequantized"] and config["torch_dtype"] == "float32"
    params = tree_flatten(dense.parameters())
    assert {p.dtype for _, p in params} == {mx.float32}
    assert sum(p.nbytes for _, p in params) == dense_size(demo_model_dir)   # the pool's estimate, exactly
    d_tokens, _ = greedy(dense, tokenizer, 24)
    assert tokenizer.decode(d_tokens).startswith("The capital of France is Paris.")
    if d_tokens != q_tokens:
        # only where the quantized model's top two logits (nearly) tie may the two differ
        first = next(i for i, (a, b) in enumerate(zip(q_tokens, d_tokens)) if a != b)
        assert q_gaps[first] < 0.05, (first, q_gaps[first], tokenizer.decode(q_tokens), tokenizer.decode(d_tokens))


def test_float16_scales_still_give_float32(monkeypatch):
    # Most published 4-bit models carry float16 scales; mlx-lm's dequantize_model keeps that dtype,
    # which on x86 never reaches BLAS (about 30x slower than float32).
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama

    from pool.engines import dequantize

    args = llama.ModelArgs(model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                           num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-5, vocab_size=256)
    model = llama.Model(args)
    model.set_dtype(mx.float16)
    nn.quantize(model, group_size=32, bits=4)
    tokens = mx.array([[1, 2, 3, 4]])
    expected = model(tokens).astype(mx.float32)
    model, config = dequantize.dequantize_for_cpu(model, {"torch_dtype": "float16"})
    assert config == {"torch_dtype": "float32", "dequantized": True}
    assert {p.dtype for _, p in tree_flatten(model.parameters())} == {mx.float32}
    assert mx.allclose(model(tokens), expected, atol=0.05).item()
