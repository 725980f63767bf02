"""Which host of a fleet serves a request for a model: one pure function over what every host last
published (docs/fleet.md, "Routing").

In order: a host that has the model loaded (the least busy; for a chat whose prefix one of them holds
in its prompt cache, that one unless it is much busier), unless every such host queues requests for
it and another host can load a copy without evicting anything; else a host where it fits without evicting
anything (the most free bytes); else the host whose eviction plan (the pool's own `plan_load`) gives
up the least recently used models; else the host where it would fit once busy models go idle (it
waits there, as one host would); else no room, with each host's reason. Only hosts that have the
model's folder can take it; a host under hard or emergency memory pressure takes no new load."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Iterable, Sequence

from ..policy.load_plan import ModelView, fits_once_idle, plan_load
from ..policy.vocabulary import RESIDENT_STATES, Level, ModelState

# The prefix holder keeps a request unless it is busier than the least busy holder by both of these
# (LocalAI's and vllm-router's load guard: absolute and relative).
BALANCE_ABS = 2
BALANCE_REL = 1.5
NO_NEW_LOADS = frozenset({Level.HARD, Level.EMERGENCY})


class Why(StrEnum):
    LOADED = "loaded"          # already loaded there, the least busy such host
    SPILLS = "spills"          # a second copy: every host that has it loaded queues requests for it
    PREFIX = "prefix"          # loaded there and its prompt cache holds the chat's prefix
    FITS = "fits"              # loads there without evicting anything
    EVICTS = "evicts"          # loads there after evicting its least recently used models
    WAITS = "waits"            # fits there once busy models go idle: the request waits there
    NO_ROOM = "no_room"        # fits nowhere
    NO_HOST = "no_host"        # no live host has the model's folder


@dataclass(frozen=True)
class HostView:
    """A host as the router sees it: what it last published."""
    id: str
    models: tuple[ModelView, ...]             # every model whose folder it has
    budget_bytes: int | None                  # None: no budget
    max_loaded: int = 0
    level: Level = Level.OK
    busy: dict[str, int] = field(default_factory=dict)           # model id -> running + queued
    queued: dict[str, int] = field(default_factory=dict)         # model id -> waiting for a slot
    prefixes: dict[str, frozenset[str]] = field(default_factory=dict)   # model id -> cached prefix keys
    headroom_bytes: int | None = None         # measured: the hard pressure line minus the memory in use

    def model(self, model_id: str) -> ModelView | None:
        return next((m for m in self.models if m.id == model_id), None)

    def free_bytes(self) -> float:
        """What a new model may take here: the budget's room, and no more than the memory measured free."""
        room = float("inf") if self.budget_bytes is None else \
            self.budget_bytes - sum(m.footprint for m in self.models if m.resident)
        return room if self.headroom_bytes is None else min(room, self.headroom_bytes)


@dataclass(frozen=True)
class Placement:
    host: str | None
    why: Why
    evicts: tuple[str, ...] = ()
    refusals: dict[str, str] = field(default_factory=dict)     # host -> why it cannot (NO_ROOM)


def place(model_id: str, hosts: Iterable[HostView], *, prefix_keys: Sequence[str] = (),
          exclude: Iterable[str] = ()) -> Placement:
    """`prefix_keys`: the request's prefix keys, shortest first (prefix.py)."""
    skip = set(exclude)
    having = sorted((h for h in hosts if h.id not in skip and h.model(model_id) is not None), key=lambda h: h.id)
    if not having:
        return Placement(None, Why.NO_HOST)

    loaded = [h for h in having if _model(h, model_id).state in RESIDENT_STATES]
    open_hosts = [h for h in having if h.level not in NO_NEW_LOADS and h not in loaded]
    plans = {h.id: plan_load(list(h.models), model_id, budget=h.budget_bytes, max_loaded=h.max_loaded)
             for h in open_hosts}
    size = _model(having[0], model_id).size_bytes
    free = [h for h in open_hosts if plans[h.id].fits and not plans[h.id].victims and h.free_bytes() >= size]
    roomiest = max(free, key=lambda h: (h.free_bytes(), _reverse(h.id)), default=None)
    if loaded:
        # llama-swap's spillover, by the hosts' own queues: a copy where it fits, evicting nothing
        if roomiest is not None and all(h.queued.get(model_id, 0) > 0 for h in loaded):
            return Placement(roomiest.id, Why.SPILLS)
        return _among_loaded(model_id, loaded, prefix_keys)
    if roomiest is not None:
        return Placement(roomiest.id, Why.FITS)

    evicting = [h for h in open_hosts if plans[h.id].fits]     # (or fits the budget, not the memory measured)
    if evicting:
        best = min(evicting, key=lambda h: _eviction_cost(h, plans[h.id].victim_ids) + (h.id,))
        return Placement(best.id, Why.EVICTS, evicts=plans[best.id].victim_ids)

    waiting = [h for h in open_hosts
               if fits_once_idle(list(h.models), model_id, budget=h.budget_bytes, max_loaded=h.max_loaded)]
    if waiting:
        return Placement(min(waiting, key=lambda h: (_load(h), h.id)).id, Why.WAITS)

    refusals = {h.id: (plans[h.id].message if h.id in plans else f"memory pressure is {h.level}") for h in having}
    return Placement(None, Why.NO_ROOM, refusals=refusals)


def _model(host: HostView, model_id: str) -> ModelView:
    model = host.model(model_id)
    assert model is not None
    return model


def _among_loaded(model_id: str, loaded: list[HostView], prefix_keys: Sequence[str]) -> Placement:
    least = min(loaded, key=lambda h: (h.busy.get(model_id, 0), h.id))
    match = {h.id: _prefix_match(h.prefixes.get(model_id, frozenset()), prefix_keys) for h in loaded}
    holders = [h for h in loaded if match[h.id] > 0]
    if holders:
        holder = max(holders, key=lambda h: (match[h.id], -h.busy.get(model_id, 0), _reverse(h.id)))
        mine, theirs = holder.busy.get(model_id, 0), least.busy.get(model_id, 0)
        if not (mine - theirs > BALANCE_ABS and mine > BALANCE_REL * theirs):
            return Placement(holder.id, Why.PREFIX)
    return Placement(least.id, Why.LOADED)


def _prefix_match(held: frozenset[str], keys: Sequence[str]) -> int:
    """How many of the request's prefix keys (shortest first) the host holds, by the longest one."""
    for depth in range(len(keys), 0, -1):
        if keys[depth - 1] in held:
            return depth
    return 0


def _eviction_cost(host: HostView, victims: tuple[str, ...]) -> tuple[float, int]:
    """Least recently used first: the newest last use among the victims, then the bytes evicted. A host
    whose budget has room but whose measured memory has not comes last."""
    models = [_model(host, v) for v in victims]
    if not models:
        return float("inf"), 0
    return max(m.last_access for m in models), sum(m.footprint for m in models)


def _load(host: HostView) -> int:
    return sum(host.busy.values())


def _reverse(host_id: str) -> tuple[int, ...]:
    """A key that makes max() prefer the smaller id on a tie, as min() does."""
    return tuple(-ord(c) for c in host_id)


def host_view(record: dict[str, Any]) -> HostView:
    """A HostView from a host's published snapshot (publisher.py; the shape of host/snapshot.py)."""
    snapshot = record["snapshot"]
    models = tuple(
        ModelView(id=m["id"], state=ModelState(m["state"]), size_bytes=int(m["size_bytes"] or 0),
                  measured_bytes=m.get("measured_bytes"), pinned=bool(m.get("pinned")),
                  leases=int(m.get("active_requests") or 0), last_access=float(m.get("last_access") or 0.0))
        for m in snapshot["models"] if not m.get("failure") or m["state"] != ModelState.UNLOADED)
    memory = snapshot.get("memory", {})
    hard, usage = memory.get("hard_bytes"), memory.get("usage_bytes")
    return HostView(
        id=record["host"], models=models, budget_bytes=memory.get("model_budget_bytes"),
        max_loaded=int(snapshot.get("max_loaded_models") or 0), level=Level(memory.get("level") or Level.OK),
        busy={m["id"]: int(m.get("running") or 0) + int(m.get("queued") or 0) for m in snapshot["models"]},
        queued={m["id"]: int(m.get("queued") or 0) for m in snapshot["models"] if m.get("queued")},
        prefixes={model_id: frozenset(keys) for model_id, keys in record.get("prefixes", {}).items()},
        headroom_bytes=None if hard is None or usage is None else max(0, int(hard) - int(usage)))
