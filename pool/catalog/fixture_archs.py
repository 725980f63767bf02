"""The architectures random-weight fixtures can take, in one table: for each, the config.json its
real checkpoints ship (nested under `text_config` where they nest it), at a width, a depth and a
feed-forward size that `fixture_models` picks for a target size.

Each entry is what people run in 2026, by the caches mlx-lm makes for it:
  llama, qwen3, phi3        every layer a KVCache
  qwen3_moe                 KVCache, experts in every layer
  gemma3_text, gemma3       KVCache + RotatingKVCache (5 sliding-window layers to 1 global); gemma3 nested
  gpt_oss                   KVCache + RotatingKVCache (alternating), experts, attention sinks
  qwen3_5                   ArraysCache (gated delta-net) + KVCache (3 to 1), nested as Qwen3.5 ships
  deepseek_v3               MLA: one latent and one rope key per token and layer; experts after layer 0
  lfm2                      ArraysCache (short convolutions) + KVCache
  falcon_h1                 CacheList(ArraysCache, KVCache): Mamba-2 beside attention in every layer
Widths are multiples of 64 (quantizable in groups of 64); head_dim is 64 (kept at the real ones' ratio
of query to KV heads), so a tiny fixture keeps the real model's cache layout at a small size."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

HEAD_DIM = 64


@dataclass(frozen=True)
class Arch:
    name: str                       # --arch
    layer_step: int                 # layers come in whole patterns of this many (gemma3: 5 local + 1 global)
    build: Callable[[int, int, int, int], dict]   # (hidden, layers, intermediate, vocab) -> config.json


def _heads(hidden: int, kv_ratio: int) -> dict:
    heads = max(1, hidden // HEAD_DIM)
    kv = max(1, heads // kv_ratio)
    while heads % kv:
        kv -= 1
    return {"num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": HEAD_DIM}


def _llama(h: int, n: int, i: int, vocab: int) -> dict:
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": h,
            "intermediate_size": i, "num_hidden_layers": n, **_heads(h, 1), "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0, "max_position_embeddings": 8192, "vocab_size": vocab,
            "tie_word_embeddings": True}


def _qwen3(h: int, n: int, i: int, vocab: int) -> dict:
    return {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_size": h,
            "intermediate_size": i, "num_hidden_layers": n, **_heads(h, 2), "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0, "max_position_embeddings": 40960, "vocab_size": vocab,
            "tie_word_embeddings": True, "attention_bias": False}


def _qwen3_moe(h: int, n: int, i: int, vocab: int) -> dict:
    return {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": h,
            "intermediate_size": 3 * i, "moe_intermediate_size": i, "num_experts": 8, "num_experts_per_tok": 2,
            "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
            "num_hidden_layers": n, **_heads(h, 4), "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
            "max_position_embeddings": 40960, "vocab_size": vocab, "tie_word_embeddings": False}


def _phi3(h: int, n: int, i: int, vocab: int) -> dict:
    return {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "hidden_size": h,
            "intermediate_size": i, "num_hidden_layers": n, **_heads(h, 1), "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0, "max_position_embeddings": 4096, "original_max_position_embeddings": 4096,
            "vocab_size": vocab, "tie_word_embeddings": False}


def _gemma3_text(h: int, n: int, i: int, vocab: int) -> dict:
    return {"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], **_gemma3_fields(h, n, i),
            "vocab_size": vocab}


def _gemma3_fields(h: int, n: int, i: int) -> dict:
    return {"hidden_size": h, "intermediate_size": i, "num_hidden_layers": n, **_heads(h, 2),
            "query_pre_attn_scalar": HEAD_DIM, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0, "sliding_window": 512, "sliding_window_pattern": 6,
            "max_position_embeddings": 32768}


def _gemma3(h: int, n: int, i: int, vocab: int) -> dict:
    # as Gemma 3 4B-27B ship: the language model's fields nested, the vocabulary at the top
    return {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "vocab_size": vocab,
            "text_config": {"model_type": "gemma3_text", **_gemma3_fields(h, n, i)}}


def _gpt_oss(h: int, n: int, i: int, vocab: int) -> dict:
    return {"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], "hidden_size": h,
            "intermediate_size": i, "num_hidden_layers": n, **_heads(h, 8), "num_local_experts": 8,
            "num_experts_per_tok": 2, "sliding_window": 128, "rope_theta": 150000, "rms_norm_eps": 1e-5,
            "layer_types": ["sliding_attention" if k % 2 == 0 else "full_attention" for k in range(n)],
            "max_position_embeddings": 131072, "vocab_size": vocab}


def _qwen3_5(h: int, n: int, i: int, vocab: int) -> dict:
    # as Qwen3.5 ships: every text field under text_config (three linear-attention layers to one full)
    heads = _heads(h, 4)
    linear = max(1, h // (2 * HEAD_DIM))
    text = {"model_type": "qwen3_5_text", "hidden_size": h, "intermediate_size": i, "num_hidden_layers": n,
            **heads, "full_attention_interval": 4, "linear_num_key_heads": linear,
            "linear_num_value_heads": 2 * linear, "linear_key_head_dim": HEAD_DIM,
            "linear_value_head_dim": HEAD_DIM, "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6,
            "vocab_size": vocab, "tie_word_embeddings": True, "max_position_embeddings": 262144,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                                "mrope_section": [11, 11, 10]}}
    return {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
            "text_config": text, "tie_word_embeddings": True}


def _deepseek_v3(h: int, n: int, i: int, vocab: int) -> dict:
    heads = max(1, h // HEAD_DIM)
    return {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": h,
            "intermediate_size": 3 * i, "moe_intermediate_size": i, "num_hidden_layers": n,
            "num_attention_heads": heads, "num_key_value_heads": heads, "n_shared_experts": 1,
            "n_routed_experts": 8, "num_experts_per_tok": 2, "first_k_dense_replace": 1, "moe_layer_freq": 1,
            "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.5, "kv_lora_rank": 2 * HEAD_DIM,
            "q_lora_rank": 3 * HEAD_DIM, "qk_rope_head_dim": HEAD_DIM // 2, "qk_nope_head_dim": HEAD_DIM,
            "v_head_dim": HEAD_DIM, "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": True,
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 163840,
            "vocab_size": vocab, "tie_word_embeddings": False}


def _lfm2(h: int, n: int, i: int, vocab: int) -> dict:
    # LFM2's pattern: attention at every third layer, short convolutions between
    return {"model_type": "lfm2", "architectures": ["Lfm2ForCausalLM"], "hidden_size": h, "num_hidden_layers": n,
            **{k: v for k, v in _heads(h, 4).items() if k != "head_dim"}, "norm_eps": 1e-5, "conv_bias": False,
            "conv_L_cache": 3, "block_dim": h, "block_ff_dim": i, "block_multiple_of": 64,
            "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": False, "rope_theta": 1000000.0,
            "full_attn_idxs": [k for k in range(n) if k % 3 == 2], "max_position_embeddings": 128000,
            "vocab_size": vocab, "tie_embedding": True}


def _falcon_h1(h: int, n: int, i: int, vocab: int) -> dict:
    heads = _heads(h, 4)
    return {"model_type": "falcon_h1", "architectures": ["FalconH1ForCausalLM"], "hidden_size": h,
            "intermediate_size": i, "num_hidden_layers": n, **heads, "mamba_d_ssm": 2 * h,
            "mamba_n_heads": 2 * h // HEAD_DIM, "mamba_d_head": HEAD_DIM, "mamba_d_state": 64,
            "mamba_d_conv": 4, "mamba_n_groups": 1, "mamba_expand": 2, "mamba_chunk_size": 128,
            "rms_norm_eps": 1e-5, "max_position_embeddings": 131072, "vocab_size": vocab,
            "tie_word_embeddings": True}


ARCHS: dict[str, Arch] = {a.name: a for a in (
    Arch("llama", 1, _llama),
    Arch("qwen3", 1, _qwen3),
    Arch("qwen3_moe", 1, _qwen3_moe),
    Arch("phi3", 1, _phi3),
    Arch("gemma3_text", 6, _gemma3_text),
    Arch("gemma3", 6, _gemma3),
    Arch("gpt_oss", 2, _gpt_oss),
    Arch("qwen3_5", 4, _qwen3_5),
    Arch("deepseek_v3", 2, _deepseek_v3),
    Arch("lfm2", 3, _lfm2),
    Arch("falcon_h1", 1, _falcon_h1),
)}
