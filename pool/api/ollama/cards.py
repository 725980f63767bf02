"""What Ollama's clients read about a model, from its folder and without loading it: the digest,
`details` (format, family, parameter size, quantization), `modified_at`, `model_info` (architecture,
context length, sizes), the chat template and the stop strings. Read once per version of the folder's
files (their names, sizes and modification times), not per listing."""

from __future__ import annotations

import functools
import hashlib
import json
import math
import struct
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ...catalog.kinds import read_json

FORMAT = "safetensors"      # MLX folders: safetensors weights (Ollama says "gguf" for its own)
STAMPED = ("config.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
LICENSES = ("LICENSE", "LICENSE.md", "LICENSE.txt")
LICENSE_LIMIT = 64 * 1024
DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
# config.json's names -> the suffix of Ollama's `<architecture>.<name>` keys in model_info
MODEL_INFO = {"hidden_size": "embedding_length", "num_hidden_layers": "block_count",
              "num_attention_heads": "attention.head_count", "num_key_value_heads": "attention.head_count_kv",
              "intermediate_size": "feed_forward_length", "vocab_size": "vocab_size",
              "rope_theta": "rope.freq_base", "rms_norm_eps": "attention.layer_norm_rms_epsilon",
              "layer_norm_eps": "attention.layer_norm_epsilon"}


@dataclass(frozen=True)
class Card:
    digest: str                       # sha256 of config.json and the weights' safetensors headers
    modified_at: str                  # RFC 3339: the newest of the config and weight files
    disk_bytes: int                   # the weight files' bytes on disk
    family: str                       # config.json's model_type ("llama", "bert"), or ""
    parameters: int | None            # parameter count, from the safetensors headers
    quantization: str                 # "Q4" (MLX affine, 4 bits), "F32", ... or ""
    config: dict = field(default_factory=dict, compare=False)
    template: str = ""                # the tokenizer's chat template (Jinja), or ""
    stop: tuple[str, ...] = ()        # the tokenizer's end-of-turn token
    generation: dict = field(default_factory=dict, compare=False)   # generation_config.json's sampling
    license: str = ""

    def details(self) -> dict[str, Any]:
        """Ollama's `details` object."""
        return {"parent_model": "", "format": FORMAT, "family": self.family,
                "families": [self.family] if self.family else None,
                "parameter_size": human_number(self.parameters) if self.parameters else "",
                "quantization_level": self.quantization}

    def model_info(self, context_length: int | None) -> dict[str, Any]:
        """Ollama's `model_info`: `general.*` and `<architecture>.*` keys (Continue reads
        `<architecture>.context_length`)."""
        arch = self.family or "unknown"
        info: dict[str, Any] = {"general.architecture": arch, "general.format": FORMAT}
        if self.parameters:
            info["general.parameter_count"] = self.parameters
        if context_length:
            info[f"{arch}.context_length"] = context_length
        for name, key in MODEL_INFO.items():
            value = self.config.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                info[f"{arch}.{key}"] = value
        return info


def card(path: Path) -> Card:
    return _card(str(path), _stamp(path))


def model_facts(model) -> Card:
    """A pool entry's card. An adapter's is its base's (family, template, context) with its own
    digest, size and date: clients tell models apart by digest."""
    facts = card(model.card_folder)
    if model.base is None:
        return facts
    own = card(model.path)
    return replace(facts, digest=_adapter_digest(str(model.path), _stamp(model.path)), modified_at=own.modified_at,
                   disk_bytes=own.disk_bytes)


@functools.lru_cache(maxsize=256)
def _adapter_digest(path_text: str, stamp: tuple) -> str:
    """An adapter's weights are small (MBs) and alike in shape: its digest hashes their bytes."""
    digest = hashlib.sha256()
    for name in ("adapter_config.json", "adapters.safetensors"):
        try:
            digest.update((Path(path_text) / name).read_bytes())
        except OSError:
            pass
    return digest.hexdigest()


def human_number(n: int) -> str:
    """Ollama's format.HumanNumber: 135M as "134.52M", 8.03e9 as "8.0B"."""
    for size, unit, decimals in ((1_000_000_000, "B", 1), (1_000_000, "M", 2)):
        if n >= size:
            number = n / size
            return f"{number:.0f}{unit}" if number == math.floor(number) else f"{number:.{decimals}f}{unit}"
    return f"{n / 1000:.0f}K" if n >= 1000 else str(n)


def rfc3339(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, timezone.utc).isoformat()


def _stamp(path: Path) -> tuple:
    """The files a card reads, as (name, size, mtime): a new version of any makes a new card."""
    files = [path / name for name in STAMPED] + sorted(path.glob("*.safetensors"))
    stamp = []
    for file in files:
        try:
            stat = file.stat()
        except OSError:
            continue
        stamp.append((file.name, stat.st_size, stat.st_mtime_ns))
    return tuple(stamp)


@functools.lru_cache(maxsize=256)
def _card(path_text: str, stamp: tuple) -> Card:
    path = Path(path_text)
    config = read_json(path / "config.json")
    digest = hashlib.sha256()
    try:
        digest.update((path / "config.json").read_bytes())
    except OSError:
        pass
    tensors: dict[str, Any] = {}
    for file in sorted(path.glob("*.safetensors")):
        header = _header_bytes(file)
        digest.update(file.name.encode() + b"\0" + header)
        try:
            found = json.loads(header) if header else {}
        except ValueError:
            found = {}
        tensors.update(found if isinstance(found, dict) else {})
    tensors.pop("__metadata__", None)
    newest = max((mtime for _, _, mtime in stamp), default=0) / 1e9
    family = config.get("model_type") if isinstance(config.get("model_type"), str) else ""
    weights = sum(size for name, size, _ in stamp if name.endswith(".safetensors"))
    return Card(digest=digest.hexdigest(), modified_at=rfc3339(newest), disk_bytes=weights, family=family,
                parameters=_parameter_count(tensors, config), quantization=_quantization(config, tensors),
                config=config, template=_chat_template(path), stop=_stop(path),
                generation=read_json(path / "generation_config.json"), license=_license(path))


def _header_bytes(file: Path) -> bytes:
    """A safetensors file's JSON header (the names, dtypes, shapes and offsets of its tensors)."""
    try:
        with file.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > file.stat().st_size - 8:
                return b""
            return f.read(length)
    except (OSError, struct.error):
        return b""


def _quant(config: dict) -> dict:
    quant = config.get("quantization") or config.get("quantization_config")
    return quant if isinstance(quant, dict) else {}


def _parameter_count(tensors: dict[str, Any], config: dict) -> int | None:
    """Elements of every tensor; an MLX quantized weight (uint32 words beside its `scales`) holds
    32 / bits of them per word, and its scales and biases are not parameters."""
    if not tensors:
        return None
    quant, total = _quant(config), 0
    for name, info in tensors.items():
        module, _, kind = name.rpartition(".")
        shape = info.get("shape") if isinstance(info, dict) else None
        if not isinstance(shape, list):
            continue
        count = math.prod(shape)
        if f"{module}.scales" in tensors:
            if kind in ("scales", "biases"):
                continue
            if kind == "weight":
                layer = quant.get(module)
                bits = (layer if isinstance(layer, dict) else quant).get("bits", 4)
                count = count * 32 // bits
        total += count
    return total


def _quantization(config: dict, tensors: dict[str, Any]) -> str:
    bits = _quant(config).get("bits")
    if isinstance(bits, int):
        return f"Q{bits}"
    dtype = config.get("torch_dtype") or config.get("dtype")
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    elements: dict[str, int] = {}     # else the dtype that holds most of the weights
    for info in tensors.values():
        if isinstance(info, dict) and isinstance(info.get("dtype"), str) and isinstance(info.get("shape"), list):
            elements[info["dtype"]] = elements.get(info["dtype"], 0) + math.prod(info["shape"])
    return max(elements, key=elements.__getitem__) if elements else ""


def _chat_template(path: Path) -> str:
    """chat_template.jinja, else tokenizer_config.json's `chat_template` (a string, or a list of
    named templates: the "default" one)."""
    try:
        return (path / "chat_template.jinja").read_text()
    except (OSError, UnicodeDecodeError):
        pass
    template = read_json(path / "tokenizer_config.json").get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) else ""


def _stop(path: Path) -> tuple[str, ...]:
    eos = read_json(path / "tokenizer_config.json").get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    return (eos,) if isinstance(eos, str) and eos else ()


def _license(path: Path) -> str:
    for name in LICENSES:
        try:
            with (path / name).open(errors="replace") as f:
                return f.read(LICENSE_LIMIT)
        except OSError:
            continue
    return ""
