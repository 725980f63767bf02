"""Who to evict so that a model can load: all or nothing, least recently used first."""

from __future__ import annotations

from dataclasses import dataclass, replace

from .units import format_bytes, join_names
from .vocabulary import RESIDENT_STATES, ModelState, Reason, Refusal

KV_HEADROOM = 0.25


@dataclass(frozen=True)
class ModelView:
    id: str
    state: ModelState
    size_bytes: int  # estimated: sum of weight files
    measured_bytes: int | None = None  # MLX active memory gained by the load, once loaded
    pinned: bool = False
    leases: int = 0  # requests admitted or running on it
    last_access: float = 0.0  # set when a request starts
    idle_since: float = 0.0  # when its last lease ended, or when it finished loading
    ttl_seconds: float | None = None  # effective idle TTL; None = never
    keep_alive: float | None = None  # seconds; 0 = unload now; -1 = until evicted; None = use ttl
    marked_for_unload: Reason | None = None  # set by the enforcer's emergency rung
    base: str | None = None  # an adapter's base model: loaded while the adapter is, unloaded after it
    loaded_draft_bytes: int = 0  # its loaded draft model's, which pressure drops before evicting a model

    @property
    def footprint(self) -> int:
        return self.measured_bytes if self.measured_bytes is not None else self.size_bytes

    @property
    def busy(self) -> bool:
        return self.leases > 0

    @property
    def resident(self) -> bool:
        """A loading model already counts against the budget."""
        return self.state in RESIDENT_STATES


def is_evictable(model: ModelView) -> bool:
    return model.state == ModelState.LOADED and not model.pinned and not model.busy


def lru_victims(models: list[ModelView]) -> list[ModelView]:
    """Idle, unpinned, loaded models, least recently used first (ties: adapters first, then by id).
    A base is used whenever its adapters are (with_adapters), so its adapters always come before it."""
    return sorted(filter(is_evictable, with_adapters(models)), key=lambda m: (m.last_access, m.base is None, m.id))


def with_adapters(models: list[ModelView]) -> list[ModelView]:
    """Each base as its resident adapters make it: used when one was, pinned while one is, busy
    while one loads (an adapter is served over its base's weights: the base goes last)."""
    adapters: dict[str, list[ModelView]] = {}
    for m in models:
        if m.base is not None and m.resident:
            adapters.setdefault(m.base, []).append(m)
    return [m if m.id not in adapters else
            replace(m, last_access=max([m.last_access] + [a.last_access for a in adapters[m.id]]),
                    pinned=m.pinned or any(a.pinned for a in adapters[m.id]),
                    leases=m.leases + sum(a.state != ModelState.LOADED for a in adapters[m.id]))
            for m in models]


def lru_ranks(models: list[ModelView]) -> dict[str, int]:
    """id -> position in `lru_victims` (0 = next victim); never-victims are absent."""
    return {m.id: rank for rank, m in enumerate(lru_victims(models))}


def auto_model_budget(total_bytes: int) -> int:
    reserve = min(max(0.2 * total_bytes, 2 * 2**30), 8 * 2**30)
    return int(0.9 * (total_bytes - reserve))


@dataclass(frozen=True)
class Victim:
    id: str
    reason: Reason  # LRU when the memory needs it gone, COUNT_CAP when only the model count does


@dataclass(frozen=True)
class LoadPlan:
    fits: bool
    victims: tuple[Victim, ...]  # to unload, in order, before loading
    with_headroom: bool  # False when it fits only without the KV headroom
    code: Refusal | None
    message: str
    blockers: tuple[str, ...]  # pinned, busy or loading resident models (when not fits)
    needed_bytes: int  # S * (1 + headroom), or S without headroom; 0 when already resident
    resident_bytes: int  # footprints of resident models other than the target
    budget_bytes: int | None

    @property
    def victim_ids(self) -> tuple[str, ...]:
        return tuple(v.id for v in self.victims)


def plan_load(
    models: list[ModelView],
    target_id: str,
    *,
    budget: int | None,
    max_loaded: int = 0,
    headroom: float = KV_HEADROOM,
) -> LoadPlan:
    """Decide, all or nothing, which idle models to unload so that `target_id` can load.

    Victims come from `lru_victims` in order; a plan that cannot fit unloads nothing.
    """
    target = _find(models, target_id)
    others = [m for m in models if m.resident and m.id != target_id]
    resident_bytes = sum(m.footprint for m in others)

    def plan(fits: bool, message: str, *, code: Refusal | None = None, victims: tuple[Victim, ...] = (),
             with_headroom: bool = True, needed: int = 0, blockers: tuple[str, ...] = ()) -> LoadPlan:
        return LoadPlan(fits=fits, victims=victims, with_headroom=with_headroom, code=code, message=message,
                             blockers=blockers, needed_bytes=needed, resident_bytes=resident_bytes,
                             budget_bytes=budget)

    if target.resident:
        return plan(True, f"'{target_id}' is already {target.state}")

    size = target.size_bytes
    with_headroom_bytes = int(size * (1 + headroom))
    candidates = lru_victims(others)
    blockers = [m for m in with_adapters(others) if not is_evictable(m)]

    def refuse(code: Refusal, message: str) -> LoadPlan:
        return plan(False, message, code=code, needed=with_headroom_bytes, blockers=tuple(m.id for m in blockers))

    if budget is not None and size > budget:
        return refuse(Refusal.MODEL_TOO_LARGE, f"cannot load '{target_id}': it needs {format_bytes(size)} but the "
                                               f"model budget is {format_bytes(budget)}")

    with_headroom, needed, memory_count = True, with_headroom_bytes, 0
    if budget is not None:
        fitted = _victims_to_fit(candidates, resident_bytes, with_headroom_bytes, budget)
        if fitted is None:
            with_headroom, needed = False, size
            fitted = _victims_to_fit(candidates, resident_bytes, size, budget)
        if fitted is None:
            request = _describe_request(target_id, size, headroom, with_headroom=True)
            return refuse(Refusal.INSUFFICIENT_MEMORY, f"cannot load {request}: {_describe_blockers(blockers)}; "
                                                       f"budget {format_bytes(budget)}")
        memory_count = fitted

    # adapters are not counted against OMLX_MAX_LOADED_MODELS: their base is
    counted = [m for m in others if m.base is None]
    count_needed = max(0, len(counted) + 1 - max_loaded) if max_loaded > 0 and target.base is None else 0
    if count_needed > sum(m.base is None for m in candidates):
        return refuse(Refusal.TOO_MANY_MODELS,
                      f"cannot load '{target_id}': at most {max_loaded} model{'s' if max_loaded > 1 else ''} "
                      f"may be loaded and {_describe_blockers(blockers)}")

    taken, models_taken = 0, 0
    while taken < memory_count or models_taken < count_needed:
        models_taken += candidates[taken].base is None
        taken += 1
    victims = tuple(Victim(m.id, Reason.LRU if i < memory_count else Reason.COUNT_CAP)
                    for i, m in enumerate(candidates[:taken]))
    return plan(True, _describe_fit(target_id, size, headroom, with_headroom, victims, budget),
                victims=victims, with_headroom=with_headroom, needed=needed)


def _find(models: list[ModelView], model_id: str) -> ModelView:
    for model in models:
        if model.id == model_id:
            return model
    raise KeyError(f"unknown model {model_id!r}")


def _victims_to_fit(candidates: list[ModelView], resident_bytes: int, needed: int, budget: int) -> int | None:
    """Length of the shortest LRU prefix whose unloading makes `needed` fit; None if none does."""
    remaining = resident_bytes
    for count in range(len(candidates) + 1):
        if remaining + needed <= budget:
            return count
        if count < len(candidates):
            remaining -= candidates[count].footprint
    return None


def _describe_request(model_id: str, size: int, headroom: float, *, with_headroom: bool) -> str:
    if headroom <= 0:
        return f"'{model_id}' ({format_bytes(size)})"
    if with_headroom:
        return f"'{model_id}' ({format_bytes(size)} + {headroom:.0%} KV headroom)"
    return f"'{model_id}' ({format_bytes(size)}, without its {headroom:.0%} KV headroom)"


def _describe_fit(model_id: str, size: int, headroom: float, with_headroom: bool,
                  victims: tuple[Victim, ...], budget: int | None) -> str:
    text = f"loading {_describe_request(model_id, size, headroom, with_headroom=with_headroom)}"
    if victims:
        text += " after unloading " + join_names(f"'{v.id}'" for v in victims)
    if budget is None:
        return text + "; memory budget off"
    return text + f"; budget {format_bytes(budget)}"


def _describe_blockers(blockers: list[ModelView]) -> str:
    if not blockers:
        return "no other model can be unloaded"
    return join_names(f"'{m.id}' is {_why_kept(m)}" for m in blockers)


def _why_kept(model: ModelView) -> str:
    if model.state == ModelState.LOADING:
        return "loading"
    if model.pinned:
        return "pinned"
    if model.leases == 1:
        return "serving a request"
    return f"serving {model.leases} requests"


def fits_once_idle(models: list[ModelView], target_id: str, *, budget: int | None, max_loaded: int = 0) -> bool:
    """Whether the target would fit if every model that blocks it only for now (busy, loading or
    unloading, not pinned) were idle: then a load should wait for them instead of refusing."""
    idle = [m if m.id == target_id or m.pinned or not m.resident else
            replace(m, state=ModelState.LOADED, leases=0) for m in models]
    return plan_load(idle, target_id, budget=budget, max_loaded=max_loaded).fits
