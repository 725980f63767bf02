"""AdapterEngine: a LoRA or DoRA adapter (pool/catalog/adapters.py) served over its base model.

Its model is a copy of the base's module tree whose arrays are the base's own (no weight is copied),
with mlx-lm's LoRA layers put on it (tuner.utils.linear_to_lora_layers, as mlx-lm's load_adapters
does) and the adapter's weights loaded; the base's model is left as it was, so the base and any
number of its adapters serve side by side. The rest (batching, the prompt cache, the warm-up) is the
TextEngine's; its prompt cache and disk tier are its own, so one adapter's KV never serves another,
nor the base's. The pool keeps the base loaded while an adapter of it is (pool/host/adapter_links.py).

An adapter of plain LoRA layers over a TextEngine then attaches its matrices to the base's engine
(multi_lora.py) and lets its own tree go: its requests run in the base engine's batches, rows of
several adapters and of the base in one batch, each with its own adapter, and their prompt cache
entries scoped to the adapter there. A DoRA adapter, or one with LoRA on experts or the embedding,
keeps its own tree and batches its own requests on its own thread.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from pathlib import Path
from typing import Any, AsyncIterator

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ..catalog.adapters import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from ..catalog.kinds import read_json
from .adapter_hosting import AdapterHosting
from .generator import TextEngine
from .memory_release import Watched
from .multi_lora import Layers, lora_layers
from .protocol import Chunk, LoadAborted, LoadResult, ReleaseResult, SamplingParams

ADAPTER_LEAVES = ("lora_a", "lora_b", "m")     # what mlx-lm's LoRA and DoRA layers add


class AdapterEngine(TextEngine):
    def __init__(self, model_id: str, path: Path, *, base: TextEngine, **options: Any):
        super().__init__(model_id, path, **options)
        self._base = base
        self._layers: Layers | None = None     # read, to attach to the base's engine after the load
        self.mixed = False                     # attached: its requests run in the base engine's batches

    def _read_model(self, memory_free: threading.Event | None) -> tuple[Any, Any, dict, int]:
        base_model, tokenizer, config = self._base.parts()
        if base_model is None:
            raise LoadAborted(f"the base model of '{self.model_id}' was unloaded")
        if memory_free is not None:
            memory_free.wait()
        if self.abort_load:
            raise LoadAborted("load aborted: process memory pressure")
        model, own_bytes = over_base(base_model, self.path)
        if isinstance(self._base, AdapterHosting):
            self._layers = lora_layers(model)
        return model, tokenizer, config, own_bytes

    def _open(self, memory_free: threading.Event | None) -> LoadResult:
        result = super()._open(memory_free)
        if self._layers is not None:
            self._idle_jobs = []          # its requests will run on the base's warmed model
        return result

    async def load(self, *, memory_free: threading.Event | None = None) -> LoadResult:
        result = await super().load(memory_free=memory_free)
        if self._layers is not None:
            layers, self._layers = self._layers, None
            try:
                await self._base.attach_adapter(self.model_id, layers)
            except Exception:  # noqa: BLE001 - the base's engine ended (or refused): this load fails
                await super().stop("its base model was unloaded")
                raise LoadAborted(f"the base model of '{self.model_id}' was unloaded") from None
            self.mixed = True
            await self.call(self._let_go)
        return result

    def _let_go(self) -> None:
        """Attached: the adapter's own tree (its matrices now stacked in the base's) is not needed."""
        self._close_lanes()
        self._model = self._adapter_set = None

    async def generate(self, tokens: list[int], params: SamplingParams) -> AsyncIterator[Chunk]:
        if not self.mixed:
            async for chunk in super().generate(tokens, params):
                yield chunk
            return
        scope = f"{self.model_id}/{params.cache_scope}" if params.cache_scope else self.model_id
        async for chunk in self._base.generate(tokens, dataclasses.replace(params, adapter=self.model_id,
                                                                          cache_scope=scope)):
            yield chunk

    async def stop(self, message: str = "the model was unloaded") -> ReleaseResult:
        if self.mixed:
            self.mixed = False
            try:
                await self._base.detach_adapter(self.model_id, message)
            except Exception:  # noqa: BLE001 - the base's engine has ended: nothing is attached any more
                pass
        return await super().stop(message)

    def _watch(self) -> Watched:
        """The adapter's own arrays: the base's stay, held by the base."""
        return Watched(self._model, own_arrays(self._model).values()) if self._model is not None else Watched()


def over_base(base_model: nn.Module, folder: Path) -> tuple[nn.Module, int]:
    """(the adapter's model over `base_model`'s arrays, the bytes of the adapter's own arrays)."""
    from mlx_lm.tuner.utils import linear_to_lora_layers

    config = read_json(folder / ADAPTER_CONFIG)
    model = shared_copy(base_model)
    parameters = {"dropout": 0.0, **config["lora_parameters"]}
    linear_to_lora_layers(model, config["num_layers"], parameters,
                          use_dora=config.get("fine_tune_type", "lora") == "dora")
    weights = mx.load(str(folder / ADAPTER_WEIGHTS))
    own = own_arrays(model)
    wrong = sorted(misfit for name, value in weights.items() if (misfit := _misfit(name, value, own)))
    if wrong:
        raise ValueError(f"{ADAPTER_WEIGHTS} does not fit its base model (made over another model?): "
                         + "; ".join(wrong[:3]) + (f"; and {len(wrong) - 3} more" if len(wrong) > 3 else ""))
    model.load_weights(list(weights.items()), strict=False)
    model.eval()
    own = own_arrays(model)
    mx.eval(list(own.values()))
    return model, sum(value.nbytes for value in own.values())


def _misfit(name: str, value: mx.array, own: dict[str, mx.array]) -> str | None:
    """How one of the adapter's tensors does not fit the LoRA layers put on the base, or None."""
    if name not in own:
        return f"{name}: no such layer in the base"
    if value.shape != own[name].shape:
        return f"{name}: {tuple(value.shape)} where the base takes {tuple(own[name].shape)}"
    return None


def own_arrays(model: nn.Module) -> dict[str, mx.array]:
    leaves = tree_flatten(model.parameters())
    return {name: value for name, value in leaves if name.rsplit(".", 1)[-1] in ADAPTER_LEAVES}


def shared_copy(model: nn.Module) -> nn.Module:
    """A copy of the module tree whose arrays are the same arrays: deepcopy, told each array is its own copy."""
    memo: dict[int, Any] = {}
    pending: list[Any] = [model]
    while pending:
        value = pending.pop()
        if isinstance(value, mx.array):
            memo[id(value)] = value
        elif isinstance(value, dict):       # an nn.Module is a dict of its children and arrays
            pending.extend(value.values())
            if isinstance(value, nn.Module):
                pending.extend(vars(value).values())
        elif isinstance(value, (list, tuple)):
            pending.extend(value)
    try:
        return copy.deepcopy(model, memo)
    finally:
        memo.clear()      # deepcopy's memo holds the copy too: nothing may keep it past this call
