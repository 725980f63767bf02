"""The hosts and the five routers of benchmarks/fleet_sim.py. A router picks, for one request, a host
among those that have the model's folder, or None to refuse; what the chosen host then does (queue,
load, evict with plan_load, wait for room: fleet_sim.Sim) is the same under every router. Every router
sees the fleet as it is at that instant: no publishing delay, for ours or the others."""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from operator import attrgetter
from typing import Any

from pool.fleet.placement import HostView, place
from pool.fleet.prefix import PrefixLedger
from pool.policy.load_plan import KV_HEADROOM, ModelView
from pool.policy.vocabulary import ModelState

by_id = attrgetter("id")


class Slot:
    """One resident model on a host."""
    __slots__ = ("state", "size", "running", "queue", "last_access")

    def __init__(self, size: int, now: float):
        self.state, self.size, self.running, self.queue, self.last_access = ModelState.LOADING, size, 0, deque(), now


class Host:
    """One host's state as fleet_sim.Sim drives it, and the views of it that place() and plan_load() take."""

    def __init__(self, hid: str, kind: str, budget: int, decode: float, folders: tuple[str, ...], clock):
        self.id, self.kind, self.budget, self.decode, self.folders = hid, kind, budget, decode, folders
        self.slots: dict[str, Slot] = {}
        self.pending: list[Any] = []                 # waiting for room: busy models block their load
        self.used = self.inflight = 0
        self.loader_free = 0.0
        self.cache: dict[str, OrderedDict] = {}
        self.ledger = PrefixLedger(clock)
        self._models: tuple[ModelView, ...] | None = None
        self._busy: dict[str, int] = {}
        self._queued: dict[str, int] = {}

    def changed(self) -> None:
        self._models = None

    def model_views(self) -> tuple[ModelView, ...]:
        if self._models is None:
            self._models = tuple(ModelView(m, s.state, s.size, leases=s.running + len(s.queue),
                                           last_access=s.last_access) for m, s in self.slots.items())
            # as host/snapshot.py publishes them: `queued` waits for a slot, not for a load (that holds a lease)
            self._queued = {m: len(s.queue) for m, s in self.slots.items() if s.queue and s.state == ModelState.LOADED}
            self._busy = {m: s.running + self._queued.get(m, 0) for m, s in self.slots.items()}
        return self._models

    def busy(self) -> dict[str, int]:
        """Model id -> requests running + queued for a slot (placement.host_view's `busy`)."""
        self.model_views()
        return self._busy

    def queued(self) -> dict[str, int]:
        """Model id -> requests queued for a slot."""
        self.model_views()
        return self._queued


def host_view(host: Any, model_id: str, sim: Any, *, whole_catalog: bool = False) -> HostView:
    """What the host would publish, cut to its resident models plus the requested one: place() and
    plan_load() only look at resident models and the target, so the answer is the same as with every
    folder listed (whole_catalog=True lists them all, for --verify)."""
    models = host.model_views()
    if model_id not in host.slots:
        models += (ModelView(model_id, ModelState.UNLOADED, sim.size[model_id]),)
    if whole_catalog:
        models += tuple(ModelView(f, ModelState.UNLOADED, sim.size[f]) for f in host.folders
                        if f not in host.slots and f != model_id)
    prefixes = {}
    if model_id in host.slots:
        held = host.ledger.published([model_id]).get(model_id)
        if held:
            prefixes = {model_id: frozenset(held)}
    return HostView(host.id, models, host.budget, busy=host.busy(), queued=host.queued(), prefixes=prefixes)


class Ours:
    """pool.fleet.placement.place with the chat's prefix keys, on views of every host that has the folder."""
    name = "ours (place)"

    def __init__(self, sim: Any, rng: Any, verify: int = 0, whole_catalog: bool = False):
        self.sim, self.verify, self.whole_catalog, self.decisions, self.checked = sim, verify, whole_catalog, 0, 0
        self.why: Counter[str] = Counter()        # placement.why of the counted requests' decisions

    def choose(self, request: Any) -> Any:
        sim, model = self.sim, request.model
        loaded = sim.where[model]
        # place()'s first rule: a model loaded (or loading) somewhere is served by a host that has it loaded
        # unless every such host queues requests for it (then a copy may spill elsewhere). So unless they all
        # queue, passing only those hosts gives the same answer, much faster (--verify checks it).
        spill = loaded and all(h.queued().get(model, 0) for h in loaded)
        hosts = sorted(loaded, key=by_id) if loaded and not spill else sim.hosts_with[model]
        placement = place(model, [host_view(h, model, sim) for h in hosts], prefix_keys=request.keys)
        self.decisions += 1
        self.why[placement.why] += request.idx >= sim.warm
        if self.verify and self.decisions % self.verify == 0:
            full = place(model, [host_view(h, model, sim, whole_catalog=self.whole_catalog)
                                 for h in sim.hosts_with[model]], prefix_keys=request.keys)
            assert (full.host, full.why, full.evicts) == (placement.host, placement.why, placement.evicts), \
                (placement, full)
            self.checked += 1
        return sim.host[placement.host] if placement.host else None


class Random:
    """Open WebUI: random.choice among the servers that list the model."""
    name = "random (Open WebUI)"

    def __init__(self, sim: Any, rng: Any, **_: Any):
        self.sim, self.rng = sim, rng

    def choose(self, request: Any) -> Any:
        return self.rng.choice(self.sim.hosts_with[request.model])


class RoundRobin:
    """vLLM production-stack's `roundrobin`: each model's hosts in turn, from a random first one (from the
    first host for every model, the rare models would all pile onto the hosts with the lowest ids)."""
    name = "round robin"

    def __init__(self, sim: Any, rng: Any, **_: Any):
        self.sim, self.rng, self.turn = sim, rng, {}

    def choose(self, request: Any) -> Any:
        hosts = self.sim.hosts_with[request.model]
        turn = self.turn.get(request.model)
        turn = self.rng.randrange(len(hosts)) if turn is None else turn + 1
        self.turn[request.model] = turn
        return hosts[turn % len(hosts)]


class LeastBusy:
    """LiteLLM's `least-busy`: the deployment (this model on a host) with the fewest requests in flight,
    ties at random."""
    name = "least busy (LiteLLM)"

    def __init__(self, sim: Any, rng: Any, **_: Any):
        self.sim, self.rng = sim, rng

    def choose(self, request: Any) -> Any:
        hosts, counts = self.sim.hosts_with[request.model], self.sim.inflight[request.model]
        if len(counts) * 2 < len(hosts):            # most have none in flight: draw until one of those
            while (host := self.rng.choice(hosts)) in counts:
                pass
            return host
        low = min(counts.get(h, 0) for h in hosts)
        return self.rng.choice([h for h in hosts if counts.get(h, 0) == low])


class LocalAI:
    """LocalAI's SmartRouter order: a host with the model loaded (fewest in flight), else one where it fits
    in free memory (the most free), else an idle host (zero in flight; its LRU models are evicted), else
    the least loaded host."""
    name = "LocalAI order"

    def __init__(self, sim: Any, rng: Any, **_: Any):
        self.sim = sim

    def choose(self, request: Any) -> Any:
        sim, model = self.sim, request.model
        loaded = sim.where[model]
        if loaded:
            return min(loaded, key=lambda h: (h.inflight, h.id))
        hosts, need = sim.hosts_with[model], sim.size[model] * (1 + KV_HEADROOM)
        roomy = [h for h in hosts if h.budget - h.used >= need]
        if roomy:
            return min(roomy, key=lambda h: (h.used - h.budget, h.id))
        idle = [h for h in hosts if h.inflight == 0]
        if idle:
            return min(idle, key=lambda h: (h.used - h.budget, h.id))
        return min(hosts, key=lambda h: (h.inflight, h.id))


POLICIES = {p.name: p for p in (Ours, Random, RoundRobin, LeastBusy, LocalAI)}
