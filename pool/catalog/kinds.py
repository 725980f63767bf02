"""The kinds of model this server runs, in one table: how a folder of each kind is recognised, the
engine that serves it, the protocol that engine speaks, what clients can ask of it, and whether it
keeps KV. Discovery, the pool, the serving door, /v1/models and the snapshot read this table; a new
kind of model is one more entry here (and its engine), not a branch in each of them.

Engines are named as "module:Class" and imported only when a model is loaded, so nothing that reads
the table imports MLX."""

from __future__ import annotations

import functools
import importlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

GENERATE, ENCODE = "generate", "encode"      # the protocols of pool/engines/protocol.py

# Encoder-only architectures: they make vectors, never text.
ENCODER_TYPES = frozenset({"bert", "roberta", "xlm-roberta", "distilbert", "mpnet", "modernbert", "nomic_bert"})
# where configs give the positions a model was built for, most common first (VLMs nest text_config)
# Vision-language model_types mlx-vlm serves whose configs carry no `vision_config` (the others all do:
# a gemma3 or qwen3_5 config without one is a text checkpoint, which mlx-lm serves)
VISION_TYPES = frozenset({"phi3_v", "moondream2", "florence2"})
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


@dataclass(frozen=True)
class Kind:
    name: str
    noun: str                                   # how a message names one: "an embedding model"
    detects: Callable[[Path, dict], bool]       # (folder, its config.json) -> a model of this kind
    engine: str                                 # "module:Class" of its engine
    protocol: str                               # GENERATE (TextGenerator) or ENCODE (Encoder)
    capabilities: tuple[str, ...]               # what /v1/models says it can do
    keeps_kv: bool                              # a prompt cache, per-request KV, load headroom
    context_length: Callable[[Path, dict], int | None]
    serves: tuple[str, ...] = ()                # other kinds whose requests it takes (a VLM: chat)

    def takes(self, wanted: "Kind") -> bool:
        """Whether a request for a model of `wanted` kind can be served by a model of this one."""
        return self == wanted or wanted.name in self.serves

    def make_engine(self, model_id: str, path: Path, **options: Any) -> Any:
        module, _, name = self.engine.partition(":")
        return getattr(importlib.import_module(module), name)(model_id, path, **options)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"Kind({self.name!r})"


def _is_encoder(folder: Path, config: dict) -> bool:
    return (folder / "modules.json").is_file() or config.get("model_type") in ENCODER_TYPES


def _is_vision(folder: Path, config: dict) -> bool:
    """A model with a vision tower: mlx-vlm's configs nest it as `vision_config` (some only name the type)."""
    vision = config.get("vision_config")
    return (isinstance(vision, dict) and bool(vision)) or config.get("model_type") in VISION_TYPES


def config_context_length(config: dict) -> int | None:
    """The positions a model was built for, from its config.json (a VLM's nests it in text_config)."""
    return _first_length(config) or _first_length(config.get("text_config"))


def _encoder_context_length(folder: Path, config: dict) -> int | None:
    """An embedding model's is sentence-transformers' `max_seq_length` when given and shorter (what
    its engine enforces)."""
    found = config_context_length(config)
    limit = _positive(read_json(folder / "sentence_bert_config.json").get("max_seq_length"))
    return min(filter(None, (found, limit)), default=None)


CHAT = Kind("chat", "a chat model", detects=lambda folder, config: True,
            engine="pool.engines.generator:TextEngine", protocol=GENERATE,
            # every chat model takes tools: through its chat template's own format, else the fallback
            capabilities=("chat", "completions", "tools", "structured_output"), keeps_kv=True,
            context_length=lambda folder, config: config_context_length(config))
EMBEDDINGS = Kind("embeddings", "an embedding model", detects=_is_encoder,
                  engine="pool.engines.encoder:EmbeddingEngine", protocol=ENCODE,
                  capabilities=("embeddings",), keeps_kv=False, context_length=_encoder_context_length)

# a vision-language model on mlx-vlm: images and text, chat requests of either
VISION = Kind("vision", "a vision model", detects=_is_vision, engine="pool.engines.vision:VisionEngine",
              protocol=GENERATE, capabilities=("chat", "completions", "tools", "structured_output", "vision"),
              keeps_kv=True, context_length=lambda folder, config: config_context_length(config), serves=("chat",))

# a LoRA / DoRA adapter over a chat model (catalog/adapters.py): the base's weights, shared, and its own;
# its card (context length) is read from its base's folder
ADAPTER = Kind("adapter", "an adapter", detects=lambda folder, config: (folder / "adapter_config.json").is_file(),
               engine="pool.engines.adapter:AdapterEngine", protocol=GENERATE, capabilities=CHAT.capabilities,
               keeps_kv=True, context_length=lambda folder, config: config_context_length(config), serves=("chat",))

# In the order folders are tried: the most particular first; chat takes any other model folder.
KINDS: dict[str, Kind] = {kind.name: kind for kind in (ADAPTER, EMBEDDINGS, VISION, CHAT)}


def folder_kind(folder: Path) -> Kind:
    config = read_json(folder / "config.json")
    return next(kind for kind in KINDS.values() if kind.detects(folder, config))


def model_card(path: Path, kind: Kind) -> dict:
    """What /v1/models says of a model folder, without loading it: {"capabilities", "context_length"}."""
    try:
        stamp = os.stat(path / "config.json").st_mtime_ns
    except OSError:
        stamp = None
    return {"capabilities": list(kind.capabilities), "context_length": _context_length(str(path), kind.name, stamp)}


@functools.lru_cache(maxsize=1024)   # per folder and config.json version: read once, not per listing
def _context_length(path: str, kind: str, stamp: int | None) -> int | None:
    if stamp is None:
        return None
    folder = Path(path)
    return KINDS[kind].context_length(folder, read_json(folder / "config.json"))


def read_json(file: Path) -> dict:
    try:
        value = json.loads(file.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _first_length(config: Any) -> int | None:
    if not isinstance(config, dict):
        return None
    return next(filter(None, (_positive(config.get(key)) for key in CONTEXT_KEYS)), None)


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
