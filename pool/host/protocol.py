"""What a host is to the router: a machine's models and what can be asked of them.

Today's one host is this process (local.py: the engine pool, the request gate, the serving door and
the memory enforcer). The router (pool/router.py) owns names, aliases and model settings and picks
the host a request goes to; a host serves model ids only."""

from __future__ import annotations

from pathlib import Path
from typing import Any, AsyncContextManager, Iterable, Protocol

from ..catalog.kinds import Kind
from ..memory import MemoryReading
from ..policy.load_plan import LoadPlan
from ..policy.vocabulary import ModelState


class ModelRecord(Protocol):
    """One model a host can serve, as the router and the listings see it."""
    id: str
    kind: Kind
    path: Path
    size_bytes: int
    state: ModelState
    measured_bytes: int | None
    load_seconds: float | None
    load_note: str
    failure: str | None


class Host(Protocol):
    host_id: str

    def models(self) -> Iterable[ModelRecord]: ...
    def apply_model_settings(self, model_id: str, values: dict[str, Any]) -> None: ...
    def rediscover(self) -> None: ...
    async def load(self, model_id: str) -> ModelRecord: ...
    async def unload(self, model_id: str, *, force: bool = False) -> ModelRecord: ...
    def plan(self, model_id: str) -> LoadPlan: ...
    def lease(self, model_id: str, kind: Kind, *, keep_alive: float | None = None) -> AsyncContextManager[Any]: ...
    async def generate(self, model_id: str, spec: Any) -> Any: ...       # a serving.completion.Completion
    async def count_tokens(self, model_id: str, spec: Any) -> int: ...
    async def embed(self, model_id: str, spec: Any) -> Any: ...          # serving.embedding.Embeddings
    def memory(self) -> MemoryReading: ...
    def state(self) -> dict[str, Any]: ...
