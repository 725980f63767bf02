"""The base model's engine hosting its LoRA adapters' requests (multi_lora.py): an adapter attaches
its matrices here, its requests run in this engine's lanes beside the base's own (one batch, each
row with its adapter), and it detaches when it is unloaded, ending its requests first."""

from __future__ import annotations

from typing import Any

from .multi_lora import AdapterSet, Layers, model_for
from .protocol import RequestAborted


class AdapterHosting:
    _adapter_set: AdapterSet | None
    _model: Any

    async def attach_adapter(self, adapter_id: str, layers: Layers) -> None:
        await self._ask(lambda: self._attach(adapter_id, layers))   # type: ignore[attr-defined]

    async def detach_adapter(self, adapter_id: str, message: str) -> None:
        await self._ask(lambda: self._detach(adapter_id, message))   # type: ignore[attr-defined]

    def _attach(self, adapter_id: str, layers: Layers) -> None:
        if self._adapter_set is None:
            raise RequestAborted(f"the base model of '{adapter_id}' was unloaded", "model_unloaded")
        self._adapter_set.add(adapter_id, layers)

    def _detach(self, adapter_id: str, message: str) -> None:
        if self._adapter_set is None or adapter_id not in self._adapter_set:
            return
        error = RequestAborted(message or f"the adapter '{adapter_id}' was unloaded", "model_unloaded")
        waiting = [req for job in self._prefills for req in job.requests]   # type: ignore[attr-defined]
        for req in list(self._requests.values()) + waiting:                   # type: ignore[attr-defined]
            if req.params.adapter == adapter_id:
                self._remove(req)                                            # type: ignore[attr-defined]
                self._outbox.emit(req, error)                                # type: ignore[attr-defined]
        self._adapter_set.remove(adapter_id)

    def _model_for(self, adapter_id: str | None):
        """The model a request's prompt is read with outside the lanes (a shared prefill)."""
        return model_for(self._model, self._adapter_set, adapter_id)
