"""Fill-in-the-middle tokens of a model folder's tokenizer, read from its files (no MLX): the
prefix, suffix and middle markers a code model was trained with, or None when it has none."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

# (prefix, suffix, middle), as the families spell them: Qwen2.5-Coder and DeepSeek's "|" forms,
# StarCoder's and SmolLM's plain ones, CodeLlama's
FAMILIES = (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
            ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
            ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
            ("▁<PRE>", "▁<SUF>", "▁<MID>"))


def fim_tokens(folder: Path) -> tuple[str, str, str] | None:
    try:
        stamp = os.stat(folder / "tokenizer.json").st_mtime_ns
    except OSError:
        stamp = None
    return _read(str(folder), stamp)


@functools.lru_cache(maxsize=256)
def _read(folder: str, stamp: int | None) -> tuple[str, str, str] | None:
    if stamp is None:
        return None
    try:
        data = json.loads((Path(folder) / "tokenizer.json").read_text())
    except (OSError, ValueError):
        return None
    known = {t.get("content") for t in data.get("added_tokens", []) if isinstance(t, dict)}
    known |= set((data.get("model") or {}).get("vocab") or {})
    return next((family for family in FAMILIES if all(token in known for token in family)), None)


def fill_in_the_middle(tokens: tuple[str, str, str], prefix: str, suffix: str) -> str:
    """The prompt in prefix-suffix-middle order (the order these families were trained on)."""
    pre, suf, mid = tokens
    return f"{pre}{prefix}{suf}{suffix}{mid}"
