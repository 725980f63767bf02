"""What the pool decides for an engine before it loads: whether a quantized model is served as
float32, its prompt cache's caps and folder, how its weights are read. The engine obeys; it reads no
settings of its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ..backend import cpu_backend
from ..catalog.discovery import ModelFolder, dense_size, weights_size
from ..catalog.model_ids import safe_name
from ..engines.disk_tier import DiskTier, tier_at
from ..engines.protocol import LoadOptions, PromptCacheOptions
from ..policy.dequantize import dequantize_budget, should_dequantize
from ..policy.load_plan import auto_model_budget
from .entries import Entry


def wants_dequantize(conf, folder: ModelFolder, capacity: int) -> bool:
    """Whether the CPU backend serves this quantized model as float32 (OMLX_CPU_DEQUANTIZE)."""
    mode = conf.cpu_dequantize
    if folder.dense_bytes is None or mode == "off" or not cpu_backend():
        return False
    budget = dequantize_budget(conf.max_model_memory, capacity)
    return should_dequantize(mode, cpu_backend=True, dense_bytes=folder.dense_bytes, budget=budget)


def warm_shapes(conf) -> dict[str, Any]:
    """What a language model runs after its load (OMLX_WARMUP): one prompt of a lone request's prefill
    step, and batches of 2, 4, ... up to OMLX_MAX_CONCURRENT; nothing on the CPU backend under `auto`."""
    if conf.warmup == "off" or (conf.warmup == "auto" and cpu_backend()):
        return {}
    most = conf.max_concurrent or 16
    batches = sorted({2 ** k for k in range(1, most.bit_length()) if 2 ** k < most} | ({most} if most > 1 else set()))
    return {"warm_batches": tuple(batches), "warm_prompt": conf.prefill_step_alone}


def load_options_for(conf, path: Path, capacity: int) -> LoadOptions:
    """What the pool decides for the model folder at `path`, for code that makes an engine or loads
    weights itself (benchmarks, tests)."""
    folder = ModelFolder(path.name, path, weights_size(path), dense_size(path))
    return LoadOptions(group_bytes=conf.load_group_bytes, dequantize=wants_dequantize(conf, folder, capacity),
                       **warm_shapes(conf))


def prompt_cache_cap(conf, budget: int | None, capacity: int) -> int:
    """Each model's prompt cache cap as configured (0 = off), before pressure walks it: `auto` is a
    tenth of the model budget."""
    value = conf.prompt_cache_bytes
    if value == "off" or not conf.prompt_cache_entries:
        return 0
    if value == "auto":
        return (budget if budget is not None else auto_model_budget(capacity)) // 10
    return int(value)


def engine_options(conf, entry: Entry, *, prompt_cache_bytes: int,
                   on_kv_growth: Callable[[int], None]) -> dict[str, Any]:
    """The keyword arguments of the entry's engine: LoadOptions for every kind; the prompt cache and
    the KV growth report for kinds that keep KV."""
    warm = warm_shapes(conf) if entry.kind.keeps_kv else {}
    options: dict[str, Any] = {"load": LoadOptions(group_bytes=conf.load_group_bytes, dequantize=entry.dequantize,
                                                   **warm)}
    if entry.kind.keeps_kv:
        disk = conf.prompt_cache_disk_bytes
        options["prompt_cache"] = PromptCacheOptions(
            max_bytes=prompt_cache_bytes, max_entries=conf.prompt_cache_entries,
            folder=prompt_cache_root(conf) / safe_name(entry.id),
            disk_bytes=0 if disk == "off" else int(disk), disk_total_bytes=disk_total(conf))
        options["on_kv_growth"] = on_kv_growth
    return options


def prompt_cache_root(conf) -> Path:
    """Where every model's disk tier lives: one folder each, named by catalog.model_ids.safe_name."""
    return conf.home / "prompt-cache"


def disk_total(conf) -> int | None:
    """The disk tier's total across models (OMLX_PROMPT_CACHE_DISK_TOTAL); None is `auto`."""
    value = conf.prompt_cache_disk_total
    return None if value == "auto" else int(value)


def disk_tier(conf) -> DiskTier | None:
    """The process's disk tier (its total, for the snapshot), or None when it is off."""
    if conf.prompt_cache_disk_bytes == "off" or conf.prompt_cache_bytes == "off" or not conf.prompt_cache_entries:
        return None
    return tier_at(prompt_cache_root(conf), disk_total(conf))
