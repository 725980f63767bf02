"""The router: the API's one way into the models. It owns the names clients use (ids and aliases),
the per-model settings (pins, TTLs, aliases, defaults: the ModelSettings rows), and picks the host a
request goes to. Today there is one host, this process (pool/host/local.py); a host serves model ids
and never sees a name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .catalog.kinds import Kind
from .catalog.names import resolve_name
from .errors import ModelNotFound
from .host.protocol import Host, ModelRecord
from .serving.specs import CompletionSpec, EmbeddingSpec, scoped

if TYPE_CHECKING:
    from .serving.completion import Completion
    from .serving.embedding import Embeddings


@dataclass(frozen=True)
class Target:
    host: Host
    model: ModelRecord

    @property
    def model_id(self) -> str:
        return self.model.id


class Router:
    def __init__(self, hosts: list[Host]):
        self.hosts = hosts
        self.model_settings: dict[str, dict[str, Any]] = {}    # model id -> its ModelSettings values

    @property
    def local(self) -> Host:
        return self.hosts[0]

    # ---- names -----------------------------------------------------------------------------------

    def alias(self, model_id: str) -> str | None:
        return self.model_settings.get(model_id, {}).get("alias") or None

    def hidden(self, model_id: str) -> bool:
        return bool(self.model_settings.get(model_id, {}).get("is_hidden"))

    def models(self) -> list[ModelRecord]:
        """Every model of every host, by id (the first host to list an id serves it)."""
        found: dict[str, ModelRecord] = {}
        for host in self.hosts:
            for model in host.models():
                found.setdefault(model.id, model)
        return [found[model_id] for model_id in sorted(found)]

    def visible_names(self) -> list[str]:
        return sorted(self.alias(m.id) or m.id for m in self.models() if not self.hidden(m.id))

    def resolve(self, name: str) -> Target:
        models = self.models()
        model_id = resolve_name(name, ((m.id, self.alias(m.id)) for m in models))
        if model_id is None:
            raise ModelNotFound(name, self.visible_names())
        return self._pick(model_id)

    def _pick(self, model_id: str) -> Target:
        """The host a request for this model goes to: today, the first that has it."""
        for host in self.hosts:
            for model in host.models():
                if model.id == model_id:
                    return Target(host, model)
        raise ModelNotFound(model_id, self.visible_names())

    # ---- requests --------------------------------------------------------------------------------

    async def generate(self, spec: CompletionSpec) -> "Completion":
        target = self.resolve(spec.model)
        return await target.host.generate(target.model_id, scoped(spec))   # the request's prompt cache scope

    async def count_tokens(self, spec: CompletionSpec) -> int:
        target = self.resolve(spec.model)
        return await target.host.count_tokens(target.model_id, spec)

    async def embed(self, spec: EmbeddingSpec) -> "Embeddings":
        target = self.resolve(spec.model)
        return await target.host.embed(target.model_id, spec)

    def lease(self, name: str, kind: Kind, *, keep_alive: float | None = None):
        target = self.resolve(name)
        return target.host.lease(target.model_id, kind, keep_alive=keep_alive)

    # ---- operators' verbs ------------------------------------------------------------------------

    async def load(self, name: str) -> ModelRecord:
        target = self.resolve(name)
        return await target.host.load(target.model_id)

    async def unload(self, name: str, *, force: bool = False) -> ModelRecord:
        target = self.resolve(name)
        return await target.host.unload(target.model_id, force=force)

    def plan(self, name: str):
        target = self.resolve(name)
        return target.model_id, target.host.plan(target.model_id)

    def apply_model_settings(self, model_id: str, values: dict[str, Any]) -> None:
        """A ModelSettings row changed (admin, API, CLI), or was read at start: names and every host
        take it at once."""
        self.model_settings[model_id] = dict(values)
        for host in self.hosts:
            host.apply_model_settings(model_id, values)

    def rediscover(self) -> None:
        for host in self.hosts:
            host.rediscover()
            for model in host.models():
                if model.id in self.model_settings:
                    host.apply_model_settings(model.id, self.model_settings[model.id])
