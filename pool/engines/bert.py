"""A BERT encoder in MLX and sentence-transformers' pooling, for embedding models such as
all-MiniLM-L6-v2.

mlx-embeddings has a BERT, but it cannot be installed on its own: it requires mlx-vlm, which brings
in mlx-audio, opencv, datasets, pyarrow, scipy, fastapi and more, and its package imports mlx-vlm on
import. This is the same forward (BertModel's: embeddings, post-norm encoder layers with exact GELU)
in about a hundred lines, checked against vectors sentence-transformers computed
(tests/pool/test_embeddings.py).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

SUPPORTED_TYPES = ("bert",)


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"

    @classmethod
    def from_dict(cls, config: dict) -> "BertConfig":
        model_type = config.get("model_type")
        if model_type not in SUPPORTED_TYPES:
            raise ValueError(f"config.json's model_type is not an embedding architecture this server supports "
                             f"({', '.join(SUPPORTED_TYPES)})")
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError("config.json's position_embedding_type is not supported (only `absolute` is)")
        if config.get("hidden_act", "gelu") not in _ACTIVATIONS:
            raise ValueError(f"config.json's hidden_act is not supported ({', '.join(_ACTIVATIONS)})")
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in config.items() if k in names})


_ACTIVATIONS = {"gelu": nn.gelu, "gelu_new": nn.gelu_approx, "gelu_pytorch_tanh": nn.gelu_approx, "relu": nn.relu}


class Embeddings(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def __call__(self, input_ids: mx.array) -> mx.array:
        positions = mx.arange(input_ids.shape[1])[None]
        # one segment: every token has type 0, as sentence-transformers sends single texts
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions) + self.token_type_embeddings.weight[0]
        return self.LayerNorm(x)


class Layer(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.heads = c.num_attention_heads
        self.query = nn.Linear(c.hidden_size, c.hidden_size)
        self.key = nn.Linear(c.hidden_size, c.hidden_size)
        self.value = nn.Linear(c.hidden_size, c.hidden_size)
        self.attention_out = nn.Linear(c.hidden_size, c.hidden_size)
        self.attention_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.intermediate = nn.Linear(c.hidden_size, c.intermediate_size)
        self.output = nn.Linear(c.intermediate_size, c.hidden_size)
        self.output_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.act = _ACTIVATIONS[c.hidden_act]

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        b, n, d = x.shape

        def split(t):
            return t.reshape(b, n, self.heads, d // self.heads).transpose(0, 2, 1, 3)
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        # written out: on the CPU backend mx.fast.scaled_dot_product_attention with a mask falls back
        # to a path about 4x slower than these three ops (measured at 16 x 252 tokens)
        scores = (q * (1 / math.sqrt(d // self.heads))) @ k.transpose(0, 1, 3, 2) + mask
        context = mx.softmax(scores, axis=-1, precise=True) @ v
        x = self.attention_norm(x + self.attention_out(context.transpose(0, 2, 1, 3).reshape(b, n, d)))
        return self.output_norm(x + self.output(self.act(self.intermediate(x))))


class Bert(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = [Layer(config) for _ in range(config.num_hidden_layers)]

    def __call__(self, input_ids: mx.array, attention_mask: mx.array) -> mx.array:
        """Last hidden states (batch, tokens, hidden); `attention_mask` is 1 for tokens, 0 for padding."""
        x = self.embeddings(input_ids)
        # additive: padding keys get a large negative score (every row has a real token, [CLS])
        mask = ((1 - attention_mask.astype(x.dtype)) * -1e9)[:, None, None, :]
        for layer in self.layers:
            x = layer(x, mask)
        return x


# Hugging Face's names -> ours (BertModel checkpoints; "bert." prefixed ones from task heads too)
_RENAMES = (("encoder.layer.", "layers."), (".attention.self.", "."), (".attention.output.dense.", ".attention_out."),
            (".attention.output.LayerNorm.", ".attention_norm."), (".intermediate.dense.", ".intermediate."),
            (".output.dense.", ".output."), (".output.LayerNorm.", ".output_norm."))


def rename_weight(name: str) -> str | None:
    """Our parameter name for a checkpoint's tensor; None for what the encoder does not use
    (the pooler, task heads, the position_ids buffer)."""
    name = name.removeprefix("bert.")
    if not name.startswith(("embeddings.", "encoder.")) or name.endswith("position_ids"):
        return None
    for old, new in _RENAMES:
        name = name.replace(old, new)
    return name


def open_bert(path: Path) -> Bert:
    """The encoder with its weights bound lazily (read when evaluated)."""
    config = BertConfig.from_dict(json.loads((path / "config.json").read_text()))
    model = Bert(config)
    weights = {}
    for file in sorted(path.glob("*.safetensors")):
        for name, array in mx.load(str(file)).items():
            if (ours := rename_weight(name)) is not None:
                weights[ours] = array.astype(mx.float32) if array.dtype != mx.float32 else array
    model.load_weights(list(weights.items()), strict=True)
    model.eval()
    return model


# ---- pooling, as the folder's sentence-transformers modules say -----------------------------------

@dataclass(frozen=True)
class Pooling:
    mode: str = "mean"          # "mean" | "cls" | "max"
    normalize: bool = True
    max_tokens: int | None = None   # sentence_bert_config.json's max_seq_length, when given


POOLING_MODES = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls",
                 "pooling_mode_max_tokens": "max"}


def pooling_from(modules: list[dict] | None, pooling_config: dict | None, bert_config: dict | None) -> Pooling:
    """How token states become one vector. A folder without sentence-transformers' files gets mean
    pooling and L2 normalisation, what all-MiniLM-L6-v2 and most BERT sentence encoders use."""
    modes = [mode for key, mode in POOLING_MODES.items() if (pooling_config or {}).get(key)]
    if len(modes) > 1:
        raise ValueError(f"pooling with several modes at once is not supported: {modes}")
    if (pooling_config or {}).get("pooling_mode_mean_sqrt_len_tokens"):
        raise ValueError("pooling_mode_mean_sqrt_len_tokens is not supported")
    normalize = True if modules is None else any(m.get("type", "").endswith("Normalize") for m in modules)
    max_tokens = (bert_config or {}).get("max_seq_length")
    return Pooling(mode=modes[0] if modes else "mean", normalize=normalize,
                   max_tokens=int(max_tokens) if max_tokens else None)


def read_pooling(path: Path) -> Pooling:
    def read(name):
        file = path / name
        return json.loads(file.read_text()) if file.is_file() else None
    modules = read("modules.json")
    pooling_dir = next((m.get("path") for m in modules or () if m.get("type", "").endswith("Pooling")), "1_Pooling")
    return pooling_from(modules, read(f"{pooling_dir}/config.json"), read("sentence_bert_config.json"))


def pool_states(states: mx.array, attention_mask: mx.array, pooling: Pooling) -> mx.array:
    """(batch, tokens, hidden) -> (batch, hidden), as sentence-transformers' Pooling and Normalize."""
    mask = attention_mask.astype(states.dtype)[..., None]
    if pooling.mode == "cls":
        vectors = states[:, 0]
    elif pooling.mode == "max":
        vectors = mx.where(mask > 0, states, -1e9).max(axis=1)
    else:
        vectors = (states * mask).sum(axis=1) / mx.maximum(mask.sum(axis=1), 1e-9)
    if pooling.normalize:
        vectors = vectors / mx.maximum(mx.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
    return vectors
