"""Random-weight llama model folders of a chosen size, for tests and benchmarks.

Weights come from MLX's default layer init (seeded), so the model loads and generates valid,
meaningless tokens. The vocabulary comes from a real tokenizer folder (the converted demo model)
so every token id is in range. With 49152 tokens the tied embedding dominates small models
(vocab * hidden * 4 bytes: 12.6 MB at hidden 64), so small targets get narrow hidden sizes and
the feed-forward width absorbs what is left, which lands the file within a fraction of a percent.

With `bits` (4 or 8) every linear layer and the embedding are affine-quantized in groups of 64, so
the hidden, head and feed-forward widths are multiples of 64 (a width that is not would stay dense)
and the plan counts a quantized parameter as bits/8 bytes plus its share of a scale and a bias.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path

from pool.catalog.gguf import replace_dir

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "special_tokens_map.json", "generation_config.json")
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
GROUP_SIZE = 64  # quantization group: every quantized width is a multiple of it


def quantized_param_bytes(bits: int, itemsize: int) -> float:
    """Bytes per quantized weight: the packed bits plus one scale and one bias per group."""
    return bits / 8 + 2 * itemsize / GROUP_SIZE


def plan(target_bytes: float, vocab: int, itemsize: int = 4, max_layers: int = 24, bits: int | None = None) -> dict:
    """Shape for a tied-embedding llama of about target_bytes: the smallest hidden size that needs
    <= max_layers, or the widest that fits; then the FFN width fills the rest."""
    if bits is not None:
        return _plan_quantized(target_bytes, vocab, itemsize, max_layers, bits)
    params = target_bytes / itemsize
    best = None
    for hidden in [*range(16, 256, 16), *range(256, 16385, 64)]:
        rest = params - vocab * hidden - hidden  # embedding (also the output head) + final norm
        attention = 4 * hidden * hidden + 2 * hidden  # q, k, v, o + two norms per layer
        if rest < attention + 3 * hidden:  # not even one layer with a 1-wide FFN
            break
        inter = 16 * max(1, round(hidden * 8 / 3 / 16))
        best = hidden, max(1, round(rest / (attention + 3 * hidden * inter)))
        if best[1] <= max_layers:
            break
    if best is None:
        raise ValueError(f"{target_bytes / 1e6:.1f} MB is too small for a {vocab}-token vocabulary")
    hidden, layers = best[0], min(best[1], max_layers)
    rest = params - vocab * hidden - hidden
    inter = max(1, round((rest / layers - 4 * hidden * hidden - 2 * hidden) / (3 * hidden)))
    head_dim = math.gcd(hidden, 64)
    return {"hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
            "num_attention_heads": hidden // head_dim, "num_key_value_heads": hidden // head_dim,
            "head_dim": head_dim}


def _plan_quantized(target_bytes: float, vocab: int, itemsize: int, max_layers: int, bits: int) -> dict:
    """plan() with every width a multiple of GROUP_SIZE and quantized weights (norms stay dense)."""
    q, g = quantized_param_bytes(bits, itemsize), GROUP_SIZE
    best = None
    for hidden in range(g, 16385, g):
        rest = target_bytes - q * vocab * hidden - itemsize * hidden
        inter = g * max(1, round(hidden * 8 / 3 / g))
        layer = q * (4 * hidden * hidden + 3 * hidden * inter) + itemsize * 2 * hidden
        if rest < q * (4 * hidden * hidden + 3 * hidden * g) + itemsize * 2 * hidden:
            break  # not even one layer with the narrowest FFN
        best = hidden, max(1, round(rest / layer))
        if best[1] <= max_layers:
            break
    if best is None:
        raise ValueError(f"{target_bytes / 1e6:.1f} MB is too small for a {vocab}-token vocabulary at {bits} bits")
    hidden, layers = best[0], min(best[1], max_layers)
    rest = target_bytes - q * vocab * hidden - itemsize * hidden
    per_layer_ffn = (rest / layers - itemsize * 2 * hidden) / q - 4 * hidden * hidden
    inter = g * max(1, round(per_layer_ffn / (3 * hidden) / g))
    return {"hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
            "num_attention_heads": hidden // g, "num_key_value_heads": hidden // g, "head_dim": g}


def planned_bytes(shape: dict, vocab: int, itemsize: int = 4, bits: int | None = None) -> int:
    h, i, n = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    if bits is None:
        return itemsize * (vocab * h + h + n * (4 * h * h + 3 * h * i + 2 * h))
    quantized = vocab * h + n * (4 * h * h + 3 * h * i)
    return round(quantized_param_bytes(bits, itemsize) * quantized + itemsize * (h + n * 2 * h))


def make_fixture_model(out_dir: str | Path, size_mb: float | None = None, *, tokenizer_from: str | Path,
                       dtype: str = "float32", seed: int = 0, bits: int | None = None, arch: str = "llama") -> dict:
    """Write a random-weight model folder of `arch` (fixture_archs.ARCHS) of about size_mb megabytes
    (10**6 bytes; None: the tiny shape tests use) at out_dir, replacing it, and return its config.
    With bits (4 or 8) every linear layer and the embedding are quantized. Written into a hidden
    sibling temp folder and renamed into place."""
    import mlx.core as mx
    from mlx_lm.utils import quantize_model, save_config, save_model
    from tokenizers import Tokenizer

    from pool.catalog.fixture_archs import ARCHS
    from pool.catalog.fixture_sizing import build_model, shape_for, tiny_shape
    from pool.catalog.fixture_vlms import VISION_ARCHS, make_vision_fixture

    if arch in VISION_ARCHS:    # mlx-vlm's classes, at their tiny shape
        return make_vision_fixture(out_dir, arch, tokenizer_from=tokenizer_from, seed=seed)
    src, out = Path(tokenizer_from), Path(out_dir)
    if not (src / "tokenizer.json").is_file():
        raise FileNotFoundError(f"no tokenizer.json in {src} (convert the demo model first: "
                                f"python manage.py prepare_demo)")
    if dtype not in ITEMSIZE:
        raise ValueError(f"dtype must be one of {', '.join(ITEMSIZE)}, got {dtype!r}")
    if bits not in (None, 4, 8):
        raise ValueError(f"bits must be 4 or 8, got {bits!r}")
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {', '.join(ARCHS)}, got {arch!r}")
    vocab = Tokenizer.from_file(str(src / "tokenizer.json")).get_vocab_size()
    src_cfg = json.loads((src / "config.json").read_text()) if (src / "config.json").is_file() else {}
    special = {k: src_cfg[k] for k in ("bos_token_id", "eos_token_id") if k in src_cfg}
    if arch == "llama" and size_mb is not None:
        config = {**ARCHS["llama"].build(64, 1, 64, vocab), **plan(size_mb * 1e6, vocab, ITEMSIZE[dtype], bits=bits)}
    else:
        shape = tiny_shape(ARCHS[arch]) if size_mb is None else shape_for(
            ARCHS[arch], size_mb * 1e6, vocab, dtype=dtype, bits=bits, group_size=GROUP_SIZE)
        config = ARCHS[arch].build(*shape, vocab)
    config.update(torch_dtype=dtype, **special)
    mx.random.seed(seed)
    model = build_model(config, dtype)
    if bits is not None:
        model, config = quantize_model(model, config, GROUP_SIZE, bits)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    tmp.chmod(0o755)
    try:
        save_model(tmp, model, donate_model=True)
        for name in TOKENIZER_FILES:
            if (src / name).is_file():
                shutil.copy(src / name, tmp / name)
        save_config(config, tmp / "config.json")  # last: a folder with config.json is complete
        replace_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return config
