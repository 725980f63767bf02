"""Random-weight vision-language model folders, built with mlx-vlm's own model classes, for tests and
benchmarks; no hub access. Each gets the demo model's tokenizer with the image tokens its processor
needs added as special tokens, a chat template that places them, and the processor configs a real
checkpoint ships (preprocessor_config.json, processor_config.json), written here.

  qwen2_vl   Qwen2-VL: a ViT with 2x2 patch merging, mRoPE (its image tokens depend on the image's size)
  gemma3_vision  Gemma 3: a SigLIP tower pooled to a fixed number of tokens per image, sliding-window layers"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from pool.catalog.gguf import replace_dir

VISION_ARCHS = ("qwen2_vl", "gemma3_vision")   # --arch names (fixture_archs has a text gemma3)
CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]

_QWEN_TEMPLATE = """{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system
You are a helpful assistant.<|im_end|>
{% endif %}<|im_start|>{{ message['role'] }}
{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}\
{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% elif part['type'] == 'text' %}\
{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

_GEMMA_TEMPLATE = """{{ bos_token }}{% for message in messages %}<start_of_turn>\
{{ 'model' if message['role'] == 'assistant' else 'user' }}
{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}\
{% if part['type'] == 'image' %}<start_of_image>{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}\
{% endfor %}{% endif %}<end_of_turn>
{% endfor %}{% if add_generation_prompt %}<start_of_turn>model
{% endif %}"""


def _qwen2_vl(ids: dict, vocab: int) -> tuple[dict, dict, dict, str]:
    h = 64
    config = {"model_type": "qwen2_vl", "architectures": ["Qwen2VLForConditionalGeneration"], "hidden_size": h,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
              "rms_norm_eps": 1e-6, "vocab_size": vocab, "max_position_embeddings": 4096, "rope_theta": 1e6,
              "tie_word_embeddings": True, "rope_scaling": {"type": "mrope", "mrope_section": [8, 12, 12]},
              "image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
              "vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"],
              "vision_config": {"model_type": "qwen2_vl", "depth": 2, "embed_dim": 64, "hidden_size": h,
                                "num_heads": 2, "patch_size": 14, "spatial_patch_size": 14, "spatial_merge_size": 2,
                                "temporal_patch_size": 2, "in_channels": 3, "mlp_ratio": 2}}
    pre = {"image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2VLProcessor",
           "do_resize": True, "do_rescale": True, "do_normalize": True, "image_mean": CLIP_MEAN,
           "image_std": CLIP_STD, "rescale_factor": 1 / 255, "min_pixels": 56 * 56, "max_pixels": 448 * 448,
           "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2}
    return config, pre, {"processor_class": "Qwen2VLProcessor"}, _QWEN_TEMPLATE


def _gemma3(ids: dict, vocab: int) -> tuple[dict, dict, dict, str]:
    tokens = 16    # per image: a 4x4 pooling of the tower's 8x8 patches
    config = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
              "image_token_index": ids["<image_soft_token>"], "boi_token_index": ids["<start_of_image>"],
              "eoi_token_index": ids["<end_of_image>"], "mm_tokens_per_image": tokens, "vocab_size": vocab,
              "text_config": {"model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 128,
                              "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
                              "head_dim": 32, "query_pre_attn_scalar": 32, "vocab_size": vocab, "sliding_window": 256,
                              "sliding_window_pattern": 2, "max_position_embeddings": 4096,
                              "mm_tokens_per_image": tokens},
              "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 64, "intermediate_size": 128,
                                "num_hidden_layers": 2, "num_attention_heads": 2, "patch_size": 14,
                                "image_size": 112}}
    pre = {"image_processor_type": "Gemma3ImageProcessor", "processor_class": "Gemma3Processor",
           "do_resize": True, "do_rescale": True, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5],
           "image_std": [0.5, 0.5, 0.5], "rescale_factor": 1 / 255, "size": {"height": 112, "width": 112},
           "resample": 2, "do_pan_and_scan": False}
    return config, pre, {"processor_class": "Gemma3Processor", "image_seq_length": tokens}, _GEMMA_TEMPLATE


# arch -> (its image special tokens, extra_special_tokens names for the tokenizer, its files)
_ARCHS: dict[str, tuple[tuple[str, ...], dict, Callable]] = {
    "qwen2_vl": (("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"), {}, _qwen2_vl),
    "gemma3_vision": (("<start_of_image>", "<end_of_image>", "<image_soft_token>"),
               {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"},
               _gemma3),
}


def make_vision_fixture(out_dir: str | Path, arch: str, *, tokenizer_from: str | Path, seed: int = 0) -> dict:
    """Write a tiny random-weight VLM folder of `arch` at out_dir (replacing it); returns its config."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.utils import get_model_and_args
    from tokenizers import AddedToken, Tokenizer

    src, out = Path(tokenizer_from), Path(out_dir)
    if arch not in _ARCHS:
        raise ValueError(f"arch must be one of {', '.join(_ARCHS)}, got {arch!r}")
    special, extra, build = _ARCHS[arch]
    tokenizer = Tokenizer.from_file(str(src / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    ids = {t: tokenizer.token_to_id(t) for t in special}
    config, preprocessor, processor, template = build(ids, tokenizer.get_vocab_size())
    src_cfg = json.loads((src / "config.json").read_text())
    config.update({k: src_cfg[k] for k in ("bos_token_id", "eos_token_id") if k in src_cfg})

    module, _ = get_model_and_args(dict(config))
    model_config = module.ModelConfig.from_dict(dict(config))
    model_config.vision_config = module.VisionConfig.from_dict(config["vision_config"])
    model_config.text_config = module.TextConfig.from_dict(config.get("text_config") or config)
    mx.random.seed(seed)
    model = module.Model(model_config)
    weights = dict(tree_flatten(model.parameters()))

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    tmp.chmod(0o755)
    try:
        mx.save_safetensors(str(tmp / "model.safetensors"), weights, metadata={"format": "mlx"})
        tokenizer.save(str(tmp / "tokenizer.json"))
        tok_cfg = json.loads((src / "tokenizer_config.json").read_text())
        tok_cfg.pop("added_tokens_decoder", None)
        tok_cfg.pop("chat_template", None)
        if extra:
            tok_cfg["extra_special_tokens"] = extra
        (tmp / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=1))
        (tmp / "chat_template.jinja").write_text(template)
        (tmp / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=1))
        (tmp / "processor_config.json").write_text(json.dumps(processor, indent=1))
        (tmp / "config.json").write_text(json.dumps(config, indent=1))  # last: a folder with config.json is complete
        replace_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return config
