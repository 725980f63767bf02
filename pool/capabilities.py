"""What /v1/models says a model can do (`capabilities`) and how long a prompt it takes
(`context_length`), from its kind and its folder's config files, without loading it."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

from .discovery import CHAT, EMBEDDINGS

# every chat model takes tools: through its chat template's own format, else the server's fallback
CAPABILITIES = {CHAT: ("chat", "completions", "tools", "structured_output"),
                EMBEDDINGS: ("embeddings",)}
# where configs give the positions a model was built for, most common first (VLMs nest text_config)
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


def capabilities(kind: str) -> list[str]:
    return list(CAPABILITIES.get(kind, ()))


def context_length(kind: str, config: dict, sentence_config: dict | None = None) -> int | None:
    """The model's context length from config.json; an embedding model's is sentence-transformers'
    `max_seq_length` when given and shorter (what its engine enforces)."""
    found = _first_length(config) or _first_length(config.get("text_config"))
    if kind == EMBEDDINGS:
        limit = _positive((sentence_config or {}).get("max_seq_length"))
        found = min(filter(None, (found, limit)), default=None)
    return found


def _first_length(config) -> int | None:
    if not isinstance(config, dict):
        return None
    return next(filter(None, (_positive(config.get(key)) for key in CONTEXT_KEYS)), None)


def _positive(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def model_card(path: Path, kind: str) -> dict:
    """The /v1/models fields of a model folder: {"capabilities", "context_length"}."""
    try:
        stamp = os.stat(path / "config.json").st_mtime_ns
    except OSError:
        stamp = None
    return {"capabilities": capabilities(kind), "context_length": _folder_context_length(str(path), kind, stamp)}


@functools.lru_cache(maxsize=1024)   # per folder and config.json version: read once, not per listing
def _folder_context_length(path: str, kind: str, stamp: int | None) -> int | None:
    if stamp is None:
        return None
    config = _read_json(Path(path) / "config.json") or {}
    sentence = _read_json(Path(path) / "sentence_bert_config.json") if kind == EMBEDDINGS else None
    return context_length(kind, config, sentence)


def _read_json(file: Path) -> dict | None:
    try:
        value = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None
