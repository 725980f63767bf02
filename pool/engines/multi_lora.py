"""Several LoRA adapters of one base model in one batch (issue 36).

mlx-lm's BatchGenerator runs one module tree over every row of a batch, and its LoRA layer holds
one adapter. So the base engine keeps, beside its model, a second tree over the very same arrays
(adapter.shared_copy) whose adapted linear layers are `MultiLoRALinear`s: each holds the LoRA
matrices of every attached adapter stacked (the ranks padded with zeros to the largest), and adds,
row by row, scale_i * (x A_i) B_i for the adapter of that row, which is what mlx-lm's LoRALinear
adds for one adapter; a row of the base model adds that of any adapter times 0.

A batch that mixes adapters runs every row through all the stacked A's at once (one matmul), zeroes
each row's columns of the other adapters (a mask made once per model call) and multiplies by all the
stacked B's: plain matmuls, on every backend and dtype, as few kernels as one adapter's update plus
one multiply. On an H100 the first mixed batch that gathered each row's matrices inside the matmuls
(`mx.gather_mm`) ended the engine with a CUDA "misaligned address", after which every CUDA call of the
process fails: no trial can guard a kernel whose failure ends the process. Where the stacked ranks
grow past half the layer's input width, stacking would cost more than the layer; each row's matrices
are then gathered before the matmuls instead.

Which adapter each row is comes from the batch object calling the model: mlx-lm's
PromptProcessingBatch and GenerationBatch call `self.model(...)` with their rows in `self.uids`
order, so `BatchRows` reads the caller's `uids` (a frame lookup: mlx-lm passes nothing else that
names the rows). A batch of base rows only runs the base model itself, at no cost. A request alone
runs through `Fixed`, the tree with its one adapter for every row.

Only LoRA on linear layers mixes; an adapter with DoRA, experts (SwitchLinear) or an embedding
keeps a module tree of its own (engines/adapter.py).
"""

from __future__ import annotations

import sys
import weakref
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

Layers = dict[str, tuple[mx.array, mx.array, float]]   # module path -> (lora_a, lora_b, scale)


def masked_stack(x: mx.array, a: mx.array, b: mx.array, mask: mx.array) -> mx.array:
    """Each row of x (rows, tokens, in) through every stacked adapter, a (in, S, r) and b (S, r, out),
    its other adapters' columns zeroed by mask (rows, 1, S * r)."""
    width = a.shape[1] * a.shape[2]
    return ((x @ a.reshape(a.shape[0], width)) * mask) @ b.reshape(width, b.shape[2])


def gathered_first(x: mx.array, a: mx.array, b: mx.array, index: mx.array) -> mx.array:
    """The same, each row's matrices gathered before the matmuls: (in, r) and (r, out) a row."""
    return (x @ a[:, index].transpose(1, 0, 2)) @ b[index]


def stacking_pays(width: int, inputs: int) -> bool:
    """Whether a mixed batch goes through every stacked adapter (`width` = adapters x rank) rather
    than gathering each row's: while that adds at most half the work of the layer itself."""
    return 2 * width <= inputs


class Rows:
    """The model call running now: None (no adapter), an int (one adapter, its slot, for every row),
    or a batch that mixes them: (each row's slot, each row's scale, 0 for a row of the base)."""

    def __init__(self):
        self.current: int | tuple[mx.array, mx.array] | None = None
        self.scales: list[float] = []     # each slot's adapter's scale, for the rows of one adapter
        self._typed: dict = {}            # a mixed call's row scales, cast once per dtype

    def forget(self) -> None:
        self._typed = {}

    def mask(self, slots: int, rank: int, dtype) -> mx.array:
        """(rows, 1, slots * rank): 1 in each row's own adapter's columns, 0 elsewhere."""
        assert isinstance(self.current, tuple)
        if (slots, rank, dtype) not in self._typed:
            column_slot = mx.arange(slots * rank) // rank
            own = column_slot[None, :] == self.current[0][:, None].astype(column_slot.dtype)
            self._typed[slots, rank, dtype] = own.astype(dtype)[:, None, :]
        return self._typed[slots, rank, dtype]

    def row_scale(self, dtype) -> mx.array:
        assert isinstance(self.current, tuple)
        if dtype not in self._typed:
            self._typed[dtype] = self.current[1].astype(dtype)
        return self._typed[dtype]


class MultiLoRALinear(nn.Module):
    def __init__(self, linear: nn.Module, rows: Rows):
        super().__init__()
        self.linear = linear
        object.__setattr__(self, "_rows", rows)
        object.__setattr__(self, "_stack", None)   # (A: (in, S, r), B: (S, r, out)): not parameters

    def set_stack(self, a: mx.array, b: mx.array) -> None:
        object.__setattr__(self, "_stack", (a, b))

    @property
    def stack(self) -> tuple[mx.array, mx.array]:
        return self._stack

    def __call__(self, x):
        y = self.linear(x)
        rows = self._rows.current
        if rows is None:
            return y
        a, b = self._stack
        if isinstance(rows, int):       # what mlx-lm's LoRALinear computes, to the bit
            z = (x @ a[:, rows]) @ b[rows]
            return y + (self._rows.scales[rows] * z).astype(x.dtype)
        flat = x.reshape(x.shape[0], -1, x.shape[-1])
        inputs, slots, rank = a.shape
        if stacking_pays(slots * rank, inputs):
            z = masked_stack(flat, a, b, self._rows.mask(slots, rank, flat.dtype))
        else:
            z = gathered_first(flat, a, b, rows[0])
        return y + (self._rows.row_scale(z.dtype)[:, None, None] * z).reshape(*y.shape).astype(x.dtype)


class AdapterSet:
    """The LoRA adapters attached to one base model. Changed and called on the base engine's thread only."""

    def __init__(self, base: nn.Module):
        self.base = base
        self.rows = Rows()
        self._tree: nn.Module | None = None
        self._layers: dict[str, MultiLoRALinear] = {}
        self._order: list[str] = []          # adapter ids; slot i + 1 is self._order[i]
        self._scales = self.rows.scales      # each one's scale, slot i + 1's at i (the list the layers read)

    def __contains__(self, adapter_id: str) -> bool:
        return adapter_id in self._order

    def __len__(self) -> int:
        return len(self._order)

    def slot(self, adapter_id: str | None) -> int:
        return 0 if adapter_id is None else self._order.index(adapter_id) + 1

    def add(self, adapter_id: str, layers: Layers) -> None:
        """Attach an adapter's LoRA matrices (from `lora_layers`). Its scale is one per adapter (mlx-lm's
        config has one); a layer of another scale (PEFT's per-module alphas) has it folded into its B."""
        if adapter_id in self._order:
            self.remove(adapter_id)
        tree = self._tree_with(layers)
        scale = next((own for _, _, own in layers.values() if own), 0.0)   # a scale of 0 divides nothing
        for path, layer in self._layers.items():
            a, b = layer.stack
            if path in layers:
                new_a, new_b, own = layers[path]
                new_b = new_b if own == scale else (new_b * (own / scale)).astype(new_b.dtype)
            else:
                new_a, new_b = mx.zeros((a.shape[0], 1), a.dtype), mx.zeros((1, b.shape[2]), b.dtype)
            rank = max(a.shape[2], new_a.shape[1])
            a = mx.concatenate([_pad(a, 2, rank), _pad(new_a, 1, rank)[:, None].astype(a.dtype)], axis=1)
            b = mx.concatenate([_pad(b, 1, rank), _pad(new_b, 0, rank)[None].astype(b.dtype)])
            layer.set_stack(a, b)
        self._order.append(adapter_id)
        self._scales.append(scale)
        self._tree = tree
        mx.eval([t for layer in self._layers.values() for t in layer.stack])

    def remove(self, adapter_id: str) -> None:
        if adapter_id not in self._order:
            return
        at = self._order.index(adapter_id)
        keep = mx.array([i for i in range(len(self._order)) if i != at], mx.int32)
        for layer in self._layers.values():
            a, b = layer.stack
            layer.set_stack(a[:, keep], b[keep])
        del self._order[at], self._scales[at]
        mx.eval([t for layer in self._layers.values() for t in layer.stack])

    def _tree_with(self, layers: Layers) -> nn.Module:
        """The mixing tree, its MultiLoRALinear put in at every path of `layers` it lacks (stacks of zeros)."""
        from .adapter import shared_copy

        tree = self._tree if self._tree is not None else shared_copy(self.base)
        modules = dict(tree.named_modules())
        new = {}
        for path, (lora_a, lora_b, _) in layers.items():
            if path in self._layers:
                continue
            layer = MultiLoRALinear(modules[path], self.rows)
            slots = len(self._order)
            layer.set_stack(mx.zeros((lora_a.shape[0], slots, 1), lora_a.dtype),
                            mx.zeros((slots, 1, lora_b.shape[1]), lora_b.dtype))
            new[path] = layer
        if new:
            tree.update_modules(tree_unflatten(list(new.items())))
            self._layers.update(new)
        return tree

    def run(self, slots: list[int], inputs, **kwargs):
        if not any(slots) or self._tree is None:
            return self.base(inputs, **kwargs)
        rows = self.rows
        if all(s == slots[0] for s in slots):
            rows.current = slots[0] - 1
        else:
            rows.current = (mx.array([max(s - 1, 0) for s in slots], mx.uint32),
                            mx.array([self._scales[s - 1] if s else 0.0 for s in slots], mx.float32))
        try:
            return self._tree(inputs, **kwargs)
        finally:
            rows.current = None
            rows.forget()

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for layer in self._layers.values() for t in layer.stack)


def _pad(x: mx.array, axis: int, size: int) -> mx.array:
    """`x` padded with zeros along `axis` to `size` (a LoRA rank)."""
    if x.shape[axis] == size:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return mx.pad(x, widths)


class _ModelLike:
    """Stands where mlx-lm expects the model: its attributes (layers, make_cache, args) are the base's."""
    adapters: AdapterSet

    def __getattr__(self, name: str) -> Any:
        return getattr(self.adapters.base, name)


class Fixed(_ModelLike):
    """The model with one adapter (or none) for every row: a request decoding alone."""

    def __init__(self, adapters: AdapterSet, adapter_id: str | None):
        self.adapters, self.adapter_id = adapters, adapter_id

    def __call__(self, inputs, **kwargs):
        return self.adapters.run([self.adapters.slot(self.adapter_id)] * inputs.shape[0], inputs, **kwargs)


def model_for(model, adapters: AdapterSet | None, adapter_id: str | None):
    """What runs a request of `adapter_id` alone: the base `model` itself, or the mixing tree with that adapter."""
    if adapter_id is None or adapters is None:
        return model
    return Fixed(adapters, adapter_id)


class BatchRows(_ModelLike):
    """The model a BatchGenerator calls: each row with its request's adapter (`adapter_of` a generator uid)."""

    def __init__(self, adapters: AdapterSet, adapter_of: Callable[[int], str | None]):
        # weakly: the lane that owns this (through its generator) is `adapter_of`'s; a strong reference
        # would make a cycle, and a closed lane would hold the model until the cyclic collector ran
        self.adapters, self._adapter_of = adapters, weakref.WeakMethod(adapter_of)  # type: ignore[arg-type]

    def __call__(self, inputs, **kwargs):
        if not self.adapters:
            return self.adapters.base(inputs, **kwargs)
        batch = sys._getframe(1).f_locals.get("self")
        uids = getattr(batch, "uids", None)
        adapter_of = self._adapter_of()
        if uids is None or len(uids) != inputs.shape[0] or adapter_of is None:
            raise RuntimeError("a batch of mixed adapters was called without its rows (mlx-lm changed?)")
        return self.adapters.run([self.adapters.slot(adapter_of(u)) for u in uids], inputs, **kwargs)


def lora_layers(model: nn.Module) -> Layers | None:
    """The LoRA matrices of an adapter's model (adapter.over_base), or None where any adapted layer
    is not a plain LoRALinear (DoRA, experts, an embedding): such an adapter cannot mix."""
    from mlx_lm.tuner.dora import DoRAEmbedding, DoRALinear
    from mlx_lm.tuner.lora import LoRAEmbedding, LoRALinear, LoRASwitchLinear

    layers: Layers = {}
    for path, module in model.named_modules():
        if isinstance(module, (DoRALinear, DoRAEmbedding, LoRAEmbedding, LoRASwitchLinear)):
            return None
        if isinstance(module, LoRALinear):
            layers[path] = (module.lora_a, module.lora_b, float(module.scale))
    return layers or None
